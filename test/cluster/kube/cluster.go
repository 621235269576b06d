// Package kube runs a real Kubernetes control plane for draind's end-to-end
// tests: embedded etcd, kube-apiserver and kube-controller-manager (the
// EndpointSlice and ServiceAccount controllers) on loopback, and kube-proxy in
// iptables mode inside each "node" network namespace. There is no kubelet: the
// Kubelet type stands in for it by setting pod status itself.
//
// Everything listens on free loopback ports, so a crashed earlier run cannot
// collide with this one, and Stop removes every process and file it created.
//
// Words are defined in the repository's docs/glossary.md.
package kube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/draind/draind/test/cluster/kubebin"
)

// Defaults for Config.
const (
	// The defaults are dual-stack, IPv4 primary, and match test/bed's
	// address plan (bed.ServiceCIDR4/6, pods in 10.244.N.0/24 and
	// fd00:244:N::/64).
	DefaultServiceCIDR = "10.96.0.0/16,fd00:96::/112"
	DefaultClusterCIDR = "10.244.0.0/16,fd00:244::/48"
	// KubernetesServiceIP(6) are the first addresses of the default service
	// ranges, which the apiserver reserves for the "kubernetes" Service; its
	// serving certificate names them as kube-proxy-routed clients would.
	KubernetesServiceIP  = "10.96.0.1"
	KubernetesServiceIP6 = "fd00:96::1"
	// ServiceAccountIssuer is the issuer (and default audience) of tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"
)

// stopGrace is how long a component gets to exit after SIGTERM.
const stopGrace = 10 * time.Second

// Config describes a cluster. The zero value is a working cluster.
type Config struct {
	// Binaries to run; nil builds or finds them with kubebin.Ensure.
	Binaries *kubebin.Set
	// Dir holds certificates, etcd data and component logs; "" creates a
	// temporary directory that Stop removes.
	Dir string
	// ServiceCIDR and ClusterCIDR default to DefaultServiceCIDR and
	// DefaultClusterCIDR. Services get ClusterIPs from ServiceCIDR; kube-proxy
	// treats ClusterCIDR as the pod network (traffic from outside it is
	// masqueraded).
	ServiceCIDR string
	ClusterCIDR string
	// ServingHosts are extra names and addresses of the apiserver's serving
	// certificate (an address it is reached on besides loopback).
	ServingHosts []string
	// Extra flags, appended after the bed's own (a flag given again
	// overrides the bed's value).
	APIServerArgs         []string
	ControllerManagerArgs []string
	// Log receives progress; nil means slog.Default().
	Log *slog.Logger
}

// Cluster is a running control plane.
type Cluster struct {
	// Admin is a client authenticated as system:masters.
	Admin       kubernetes.Interface
	AdminConfig *rest.Config
	// CA signs the apiserver's serving certificate and all client
	// certificates; the apiserver trusts it for client authentication.
	CA *CA
	// Dir is the working directory (certificates, logs, etcd data).
	Dir string

	cfg           Config
	log           *slog.Logger
	ownDir        bool
	bins          *kubebin.Set
	apiserverAddr string // host:port on the host's loopback
	etcd          *embed.Etcd
	apiserver     *process
	kcm           *process
	kcmPort       int // its secure port (/healthz)

	mu      sync.Mutex
	nodes   []*Node
	stopped bool
}

// Start brings up etcd, kube-apiserver and kube-controller-manager and
// returns once the apiserver is ready, the controller manager is healthy and
// the ServiceAccount controller has created default/default (so pods can be
// created). On error everything started so far is stopped.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = DefaultServiceCIDR
	}
	if cfg.ClusterCIDR == "" {
		cfg.ClusterCIDR = DefaultClusterCIDR
	}
	c := &Cluster{cfg: cfg, log: cfg.Log, bins: cfg.Binaries, Dir: cfg.Dir}
	if c.log == nil {
		c.log = slog.Default()
	}
	if c.bins == nil {
		if c.bins, err = kubebin.Ensure(ctx, c.log); err != nil {
			return nil, fmt.Errorf("getting Kubernetes binaries: %w", err)
		}
	}
	if c.Dir == "" {
		removeStaleDirs(c.log)
		if c.Dir, err = os.MkdirTemp("", tempDirPrefix); err != nil {
			return nil, fmt.Errorf("creating cluster directory: %w", err)
		}
		c.ownDir = true
		if err := os.WriteFile(filepath.Join(c.Dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return nil, fmt.Errorf("writing cluster directory owner: %w", err)
		}
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()

	start := time.Now()
	if err := c.writePKI(); err != nil {
		return nil, err
	}
	var etcdURL string
	if c.etcd, etcdURL, err = startEtcd(c.Dir); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx, etcdURL); err != nil {
		return nil, err
	}
	c.log.Info("kube-apiserver ready", "addr", c.apiserverAddr, "since_start", time.Since(start).Round(time.Millisecond))
	if err := c.startControllerManager(ctx); err != nil {
		return nil, err
	}
	c.log.Info("control plane ready", "took", time.Since(start).Round(time.Millisecond), "dir", c.Dir)
	return c, nil
}

// Host is the apiserver's URL on the host's loopback.
func (c *Cluster) Host() string { return "https://" + c.apiserverAddr }

// APIServerAddr is the apiserver's host:port on the host's loopback.
func (c *Cluster) APIServerAddr() string { return c.apiserverAddr }

// Path returns the path of a file in the cluster's directory (pki/ca.crt,
// pki/sa.key, ...).
func (c *Cluster) Path(name string) string { return c.path(name) }

// Binaries returns the component binaries the cluster runs.
func (c *Cluster) Binaries() *kubebin.Set { return c.bins }

// ClusterCIDR is the pod network kube-proxy is told about.
func (c *Cluster) ClusterCIDR() string { return c.cfg.ClusterCIDR }

func (c *Cluster) path(name string) string { return filepath.Join(c.Dir, name) }

// writePKI creates the CA, the apiserver's serving certificate, the
// service-account signing key and the admin credentials.
func (c *Cluster) writePKI() error {
	if err := os.MkdirAll(c.path("pki"), 0o700); err != nil {
		return fmt.Errorf("creating pki directory: %w", err)
	}
	ca, err := NewCA("draind-test-ca")
	if err != nil {
		return err
	}
	c.CA = ca
	if err := os.WriteFile(c.path("pki/ca.crt"), ca.CertPEM, 0o644); err != nil {
		return fmt.Errorf("writing CA certificate: %w", err)
	}
	// Clients reach the apiserver on the host's loopback, through relays on
	// 127.0.0.1 inside node namespaces, and (later, through kube-proxy) on the
	// kubernetes Service.
	serving, err := ca.Issue("kube-apiserver", nil, x509.ExtKeyUsageServerAuth, append([]string{
		"127.0.0.1", "::1", KubernetesServiceIP, KubernetesServiceIP6, "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local",
	}, c.cfg.ServingHosts...))
	if err != nil {
		return err
	}
	if _, _, err := serving.WriteFiles(c.path("pki"), "apiserver"); err != nil {
		return err
	}
	if _, _, err := writeServiceAccountKey(c.path("pki")); err != nil {
		return err
	}
	// The apiserver's identity towards kubelets (exec, logs,
	// port-forward), for beds that run a real one.
	kubeletClient, err := ca.ClientCert("kube-apiserver-kubelet-client", "system:masters")
	if err != nil {
		return err
	}
	if _, _, err := kubeletClient.WriteFiles(c.path("pki"), "apiserver-kubelet-client"); err != nil {
		return err
	}
	admin, err := ca.ClientCert("draind-test-admin", "system:masters")
	if err != nil {
		return err
	}
	c.AdminConfig = c.certConfig(admin)
	// The bed creates thousands of objects in load scenarios; don't let
	// client-side throttling be what the test measures.
	c.AdminConfig.QPS = 1000
	c.AdminConfig.Burst = 2000
	return nil
}

// certConfig is a client config for the host-side apiserver address using kp.
// Host is filled in once the apiserver's port is known.
func (c *Cluster) certConfig(kp *KeyPair) *rest.Config {
	return &rest.Config{
		Host: c.Host(),
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   c.CA.CertPEM,
			CertData: kp.CertPEM,
			KeyData:  kp.KeyPEM,
		},
	}
}

func (c *Cluster) startAPIServer(ctx context.Context, etcdURL string) error {
	// A free port can be taken by someone else between our probe and the
	// apiserver's bind; try a few ports before giving up.
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		c.apiserverAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		c.AdminConfig.Host = c.Host()
		if c.Admin, err = kubernetes.NewForConfig(c.AdminConfig); err != nil {
			return fmt.Errorf("creating admin client: %w", err)
		}
		args := []string{
			"--etcd-servers=" + etcdURL,
			"--bind-address=127.0.0.1",
			"--secure-port=" + strconv.Itoa(port),
			"--advertise-address=127.0.0.1",
			"--endpoint-reconciler-type=none",
			"--cert-dir=" + c.path("pki/apiserver-generated"),
			"--tls-cert-file=" + c.path("pki/apiserver.crt"),
			"--tls-private-key-file=" + c.path("pki/apiserver.key"),
			"--client-ca-file=" + c.path("pki/ca.crt"),
			"--authorization-mode=Node,RBAC",
			"--service-account-issuer=" + ServiceAccountIssuer,
			"--service-account-key-file=" + c.path("pki/sa.pub"),
			"--service-account-signing-key-file=" + c.path("pki/sa.key"),
			"--service-cluster-ip-range=" + c.cfg.ServiceCIDR,
			"--kubelet-client-certificate=" + c.path("pki/apiserver-kubelet-client.crt"),
			"--kubelet-client-key=" + c.path("pki/apiserver-kubelet-client.key"),
			// draind's DaemonSet is privileged; server-side dry-run of its
			// manifests must not be refused for that.
			"--allow-privileged=true",
			"--profiling=false",
		}
		args = append(args, c.cfg.APIServerArgs...)
		c.apiserver, err = startProcess(c.log, kubebin.APIServer, "", c.path("kube-apiserver.log"), c.bins.Path(kubebin.APIServer), args...)
		if err != nil {
			return err
		}
		lastErr = c.waitAPIServerReady(ctx)
		if lastErr == nil {
			return nil
		}
		if gone, _ := c.apiserver.exited(); !gone || !logMentions(c.apiserver.logPath, "address already in use") {
			return lastErr
		}
		c.apiserver.stop(0)
		c.log.Warn("kube-apiserver lost its port to another process, retrying", "addr", c.apiserverAddr)
	}
	return lastErr
}

// waitAPIServerReady polls /readyz until it answers ok. Polling a readiness
// endpoint is the signal; the interval only bounds the load.
func (c *Cluster) waitAPIServerReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	err := Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if err := c.apiserver.deadErr(); err != nil {
			return false, err
		}
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			last = fmt.Errorf("%w: %s", err, body)
			return false, nil
		}
		return string(body) == "ok", nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-apiserver /readyz (last answer: %v): %w", last, err)
	}
	return nil
}

func (c *Cluster) startControllerManager(ctx context.Context) error {
	// kube-controller-manager runs as itself, and each controller with its
	// own ServiceAccount, as kubeadm sets it up: RBAC is then real for the
	// controllers too.
	kp, err := c.CA.ClientCert("system:kube-controller-manager")
	if err != nil {
		return err
	}
	kubeconfig := c.path("kube-controller-manager.kubeconfig")
	if err := WriteKubeconfig(kubeconfig, c.certConfig(kp)); err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	// No --authentication/authorization-kubeconfig: the bed only probes
	// /healthz, which is always allowed, and the delegated authenticator
	// would log an error every few seconds about the request-header CA the
	// bed's apiserver has no use for.
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=endpointslice,endpointslicemirroring,serviceaccount",
		"--use-service-account-credentials=true",
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + c.path("pki/kcm-generated"),
		"--profiling=false",
	}
	args = append(args, c.cfg.ControllerManagerArgs...)
	c.kcm, err = startProcess(c.log, kubebin.ControllerManager, "", c.path("kube-controller-manager.log"), c.bins.Path(kubebin.ControllerManager), args...)
	if err != nil {
		return err
	}
	c.kcmPort = port
	return c.waitControllerManager(ctx)
}

// waitControllerManager waits for kube-controller-manager's /healthz on its
// secure port (self-signed: skip verification of a loopback health probe),
// then for default/default as the proof that the controllers are running
// against the apiserver.
func (c *Cluster) waitControllerManager(ctx context.Context) error {
	port := c.kcmPort
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	defer hc.CloseIdleConnections()
	healthz := fmt.Sprintf("https://127.0.0.1:%d/healthz", port)
	err := Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if err := c.kcm.deadErr(); err != nil {
			return false, err
		}
		resp, err := hc.Get(healthz)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-controller-manager %s: %w", healthz, err)
	}
	if err := c.WaitServiceAccount(ctx, metav1.NamespaceDefault, "default"); err != nil {
		return fmt.Errorf("waiting for the serviceaccount controller: %w", err)
	}
	return nil
}

// WaitServiceAccount waits until the ServiceAccount exists (the
// serviceaccount controller creates "default" in every namespace).
func (c *Cluster) WaitServiceAccount(ctx context.Context, namespace, name string) error {
	return Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if err := c.componentsAlive(); err != nil {
			return false, err
		}
		_, err := c.Admin.CoreV1().ServiceAccounts(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
}

// componentsAlive returns an error naming the first control-plane component
// that has exited, so waits fail at once instead of timing out.
func (c *Cluster) componentsAlive() error {
	for _, p := range []*process{c.apiserver, c.kcm} {
		if p == nil {
			continue
		}
		if err := p.deadErr(); err != nil {
			return err
		}
	}
	return nil
}

// Healthy reports an error if any component (including every node's
// kube-proxy) has exited.
func (c *Cluster) Healthy() error {
	if err := c.componentsAlive(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.proxy != nil {
			if err := n.proxy.deadErr(); err != nil {
				return err
			}
		}
	}
	return nil
}

// LogTails returns the last lines of every component's log, for a failing
// test to print.
func (c *Cluster) LogTails(lines int) map[string]string {
	out := map[string]string{}
	for _, p := range []*process{c.apiserver, c.kcm} {
		if p != nil {
			out[p.name] = p.tail(lines)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.proxy != nil {
			out[n.proxy.name] = n.proxy.tail(lines)
		}
	}
	return out
}

// Stop stops every node's kube-proxy and relay, the controller manager, the
// apiserver and etcd, and removes the working directory if Start created it.
// It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	nodes := c.nodes
	c.nodes = nil
	c.mu.Unlock()

	var errs []error
	for i := len(nodes) - 1; i >= 0; i-- {
		errs = append(errs, nodes[i].stop())
	}
	if c.kcm != nil {
		errs = append(errs, c.kcm.stop(stopGrace))
	}
	if c.apiserver != nil {
		errs = append(errs, c.apiserver.stop(stopGrace))
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.ownDir && c.Dir != "" {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing cluster directory: %w", err))
		}
	}
	return errors.Join(errs...)
}

// A cluster's temporary directory is named tempDirPrefix* and holds the
// pid of the process that owns it in ownerFile. A test process killed with
// SIGKILL cannot clean up (its components die with it: Pdeathsig), so the
// next Start removes directories whose owner is gone.
const (
	tempDirPrefix = "draind-cluster-"
	ownerFile     = "owner.pid"
)

func removeStaleDirs(log *slog.Logger) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), tempDirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // not ours, or still being created
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // owner alive
		}
		if err := os.RemoveAll(d); err != nil {
			log.Warn("removing a crashed run's cluster directory failed", "dir", d, "err", err)
			continue
		}
		log.Info("removed a crashed run's cluster directory", "dir", d, "owner_pid", pid)
	}
}

func logMentions(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && bytes.Contains(b, []byte(s))
}

// Poll calls cond every interval until it returns true or an error, or ctx
// ends.
func Poll(ctx context.Context, interval time.Duration, cond func() (bool, error)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
