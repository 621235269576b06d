// Package realnode starts a real Kubernetes node on this machine with one
// call: the bed's control plane (kube-apiserver, kube-controller-manager
// with the controllers workloads need, kube-scheduler), and a node — a
// network namespace in which containerd (with runc and the bridge CNI from
// the distribution's packages), the kubelet and kube-proxy (iptables) run —
// all built from the k8s.io/kubernetes module by kubebin. Pods are real
// containers from images built offline (deploy/image) and imported into
// containerd; kubectl is the module's own.
//
// Layout:
//
//	host namespace                          node namespace (Node.NetnsPath)
//	kube-apiserver 127.0.0.1:P  <- relay <- hostIP:P  <--veth-->  eth0 nodeIP
//	kube-controller-manager, kube-scheduler                         kubelet :10250 on nodeIP
//	                                                                containerd, kube-proxy
//	                                                                cni0 bridge: pods in PodCIDR
//
// The apiserver reaches the kubelet on nodeIP (exec, logs); pods and the
// kubelet reach the apiserver at hostIP:P, the address the "kubernetes"
// Service points at. Nothing else leaves the node namespace: the host does
// not forward, and a guard rule rejects any other traffic out of eth0.
//
// The host is shared: everything the node changes outside its own
// directory (cgroups, sysctls, a bpffs at /sys/fs/bpf, a few hard-coded
// paths) is recorded before it is changed and restored by Stop, or by the
// next Start after a crash. One real node runs on a host at a time.
//
// Words are defined in the repository's docs/glossary.md.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// Config describes the node. The zero value works.
type Config struct {
	// Name of the Node (default "realnode-<random>").
	Name string
	// Binaries to run; nil builds or finds them with kubebin.Ensure.
	Binaries *kubebin.Set
	// Log receives progress; nil means slog.Default().
	Log *slog.Logger
}

// Node is a running control plane and node.
type Node struct {
	// Cluster is the control plane; Cluster.Admin is a system:masters client.
	Cluster *kube.Cluster
	// Name is the Node's name.
	Name string
	// NetnsPath is the node's network namespace.
	NetnsPath string
	// NodeIP is the node's address (the InternalIP pods see as hostIP);
	// HostIP is the host's end of the node's link.
	NodeIP, HostIP netip.Addr
	// Dir holds every file of the run: certificates, logs, containerd's
	// and the kubelet's state.
	Dir string
	// ContainerdSocket is containerd's CRI/API socket.
	ContainerdSocket string
	// Kubeconfig is an admin kubeconfig for kubectl (apiserver on the
	// host's loopback).
	Kubeconfig string

	log       *slog.Logger
	lock      net.Listener
	state     *hostState
	apiPort   int
	hostRelay *kube.Relay
	proxyNode *kube.Node
	scheduler *proc
	// containerd and kubelet run in the node's namespace.
	containerd, kubelet *proc
	stopOnce            sync.Once
	stopErr             error

	// Set on a node of a multi-node bed (StartMulti): its pod network, its
	// kubelet's cgroup root (kubelets sharing a host need their own) and
	// the addresses its link guard lets through besides HostIP.
	podCIDR    string
	cgroupRoot string
	multi      *Multi
}

func (n *Node) path(name string) string { return filepath.Join(n.Dir, name) }

// APIServerURL is the apiserver's address as seen from the node (and in
// the "kubernetes" Service's endpoints).
func (n *Node) APIServerURL() string {
	return "https://" + net.JoinHostPort(n.HostIP.String(), strconv.Itoa(n.apiPort))
}

// Start brings up the control plane and the node and returns once the Node
// is Ready and untainted, kube-proxy has synced and the test images (pause
// and the test app) are imported. On error, everything started so far is
// stopped and removed.
func Start(ctx context.Context, cfg Config) (_ *Node, err error) {
	if missing := Tools(); len(missing) > 0 {
		return nil, fmt.Errorf("a real node needs %s (Debian: apt-get install containerd runc containernetworking-plugins iproute2 iptables)", strings.Join(missing, ", "))
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	suffix := randomSuffix()
	n := &Node{Name: cfg.Name, log: log}
	if n.Name == "" {
		n.Name = "realnode-" + suffix
	}
	start := time.Now()
	if n.lock, n.Dir, n.state, err = prepareHost(log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Stop())
		}
	}()

	// The node's link.
	if n.HostIP, n.NodeIP, err = pickLink(); err != nil {
		return nil, err
	}
	nc := netnsConfig{name: "rn-" + suffix, hostVeth: "rnh-" + suffix, hostIP: n.HostIP, nodeIP: n.NodeIP}
	n.state.Netns, n.state.HostVeth = nc.name, nc.hostVeth
	if err := n.state.save(); err != nil {
		return nil, err
	}
	if err := createNetns(ctx, nc); err != nil {
		return nil, err
	}
	n.NetnsPath = netnsPath(nc.name)

	// The control plane, reachable from the node at HostIP.
	if n.Cluster, err = kube.Start(ctx, kube.Config{
		Binaries:     cfg.Binaries,
		Dir:          n.path("cluster"),
		ServiceCIDR:  ServiceCIDR,
		ClusterCIDR:  ClusterCIDR,
		ServingHosts: []string{n.HostIP.String()},
		APIServerArgs: []string{
			"--advertise-address=" + n.HostIP.String(),
			"--endpoint-reconciler-type=lease",
			"--kubelet-preferred-address-types=InternalIP",
		},
		ControllerManagerArgs: []string{
			"--controllers=" + strings.Join(Controllers, ","),
			"--service-account-private-key-file=" + filepath.Join(n.path("cluster"), "pki/sa.key"),
			"--root-ca-file=" + filepath.Join(n.path("cluster"), "pki/ca.crt"),
		},
		Log: log,
	}); err != nil {
		return nil, err
	}
	addr := n.Cluster.APIServerAddr()
	_, port, _ := net.SplitHostPort(addr)
	n.apiPort, _ = strconv.Atoi(port)
	if n.hostRelay, err = kube.StartRelay(log, "", net.JoinHostPort(n.HostIP.String(), port), addr); err != nil {
		return nil, err
	}
	n.Kubeconfig = n.path("admin.kubeconfig")
	if err := kube.WriteKubeconfig(n.Kubeconfig, n.Cluster.AdminConfig); err != nil {
		return nil, err
	}
	if err := n.startScheduler(); err != nil {
		return nil, err
	}
	log.Info("control plane ready", "took", time.Since(start).Round(time.Millisecond))

	// The node.
	n.ContainerdSocket = n.path("containerd/containerd.sock")
	if err := n.startContainerd(ctx); err != nil {
		return nil, err
	}
	images, err := BuildTestImages(ctx, n.path("images"))
	if err != nil {
		return nil, err
	}
	if err := n.ImportImages(ctx, images); err != nil {
		return nil, err
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, err
	}
	if n.proxyNode, err = n.Cluster.AddNode(ctx, kube.NodeConfig{
		Name: n.Name, NetnsPath: n.NetnsPath, InternalIPs: []netip.Addr{n.NodeIP}, Registered: true,
	}); err != nil {
		return nil, err
	}
	log.Info("real node ready", "node", n.Name, "node_ip", n.NodeIP, "took", time.Since(start).Round(time.Millisecond), "dir", n.Dir)
	return n, nil
}

// prepareHost takes the host-wide lock, removes what crashed runs left,
// creates the run's directory and records in its state file what the run
// may change on the host (created paths, the kubelet's sysctls, a bpffs
// mount) before changing it. On error nothing is left held.
func prepareHost(log *slog.Logger) (_ net.Listener, dir string, _ *hostState, err error) {
	lock, err := takeLock(5 * time.Minute)
	if err != nil {
		return nil, "", nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if err := cleanLeftovers(log); err != nil {
		return nil, "", nil, fmt.Errorf("removing a crashed run's leftovers: %w", err)
	}
	if dir, err = os.MkdirTemp("", dirPrefix); err != nil {
		return nil, "", nil, fmt.Errorf("creating the run's directory: %w", err)
	}
	st := &hostState{OwnerPID: os.Getpid(), Dir: dir, Sysctls: map[string]string{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.undo(log))
		}
	}()
	for _, p := range createdCandidates {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			st.Created = append(st.Created, p)
		}
	}
	for _, k := range kubeletSysctls {
		v, err := readSysctl(k)
		if err != nil {
			return nil, "", nil, err
		}
		st.Sysctls[k] = v
	}
	if err := st.save(); err != nil {
		return nil, "", nil, err
	}
	mounted, err := mountBPFFS()
	st.BPFFSMounted = mounted
	if err2 := st.save(); err == nil {
		err = err2
	}
	if err != nil {
		return nil, "", nil, err
	}
	return lock, dir, st, nil
}

// Controllers are the kube-controller-manager controllers the node runs:
// workloads (deployment, replicaset, daemonset, garbagecollector), Service
// endpoints (EndpointSlices, and the legacy Endpoints that the upstream e2e
// suite still checks), ServiceAccounts and their tokens, the CA bundle pods
// mount (root-ca-cert-publisher), node lifecycle (it lifts the not-ready taint
// the kubelet registers with), namespace deletion (kubectl delete -k waits
// for it) and resource quotas (the base's draind-system namespace has one:
// until its controller fills in the status, quota admission refuses pods).
var Controllers = []string{
	"deployment", "replicaset", "daemonset", "garbagecollector",
	"endpoint", "endpointslice", "endpointslicemirroring",
	"serviceaccount", "serviceaccount-token", "root-ca-cert-publisher",
	"nodelifecycle", "namespace", "resourcequota", "podgc",
}

func (n *Node) startScheduler() error {
	c := n.Cluster
	cfg, err := c.UserConfig("system:kube-scheduler")
	if err != nil {
		return err
	}
	if err := kube.WriteKubeconfig(n.path("kube-scheduler.kubeconfig"), cfg); err != nil {
		return err
	}
	n.scheduler, err = n.startProcIn("", "kube-scheduler", c.Binaries().Path(kubebin.Scheduler),
		"--kubeconfig="+n.path("kube-scheduler.kubeconfig"),
		"--leader-elect=false", "--secure-port=0")
	return err
}

// Kubectl runs the module's kubectl as the cluster admin and returns its
// standard output.
func (n *Node) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, "", n.Cluster.Binaries().Path(kubebin.Kubectl), append([]string{"--kubeconfig", n.Kubeconfig}, args...)...)
}

// LogPath is the log file of a node component: containerd, kubelet,
// kube-scheduler.
func (n *Node) LogPath(component string) string { return n.path(component + ".log") }

// Healthy reports an error if a component has exited.
func (n *Node) Healthy() error {
	for _, p := range []*proc{n.scheduler, n.containerd, n.kubelet} {
		if p != nil {
			if err := p.deadErr(); err != nil {
				return err
			}
		}
	}
	return n.Cluster.Healthy()
}

// Stop removes the pods, stops the kubelet, containerd (and any shim left)
// and the control plane, and restores the host: cgroups, mounts, the
// network namespace, sysctls, bpffs, created paths. Safe to call twice.
// On a node of a multi-node bed it stops the whole bed (Multi.Stop).
func (n *Node) Stop() error {
	if n.multi != nil {
		return n.multi.Stop()
	}
	n.stopOnce.Do(func() { n.stopErr = n.stop() })
	return n.stopErr
}

func (n *Node) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n.kubelet != nil && n.kubelet.deadErr() == nil && n.Cluster != nil {
		if err := n.removeWorkloads(ctx, n); err != nil {
			n.log.Warn("removing workloads before stopping the kubelet", "err", err)
		}
	}
	errs = append(errs, n.stopRuntime(ctx)...)
	if n.scheduler != nil {
		errs = append(errs, n.scheduler.stop(10*time.Second))
	}
	if n.hostRelay != nil {
		errs = append(errs, n.hostRelay.Close())
	}
	if n.Cluster != nil {
		errs = append(errs, n.Cluster.Stop())
	}
	// draind's pins on the host's bpffs (a test that failed before its
	// uninstall step leaves them).
	if _, err := os.Stat(bpf.DefaultPinDir); err == nil {
		errs = append(errs, bpf.Remove(bpf.DefaultPinDir))
	}
	if n.state != nil {
		errs = append(errs, n.state.undo(n.log))
	}
	if n.lock != nil {
		n.lock.Close()
	}
	return errors.Join(errs...)
}

// stopRuntime stops the node's kubelet, then its containerd after killing
// the tasks still running (their shims outlive containerd).
func (n *Node) stopRuntime(ctx context.Context) []error {
	var errs []error
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.stop(15*time.Second))
	}
	if n.containerd != nil {
		if n.containerd.deadErr() == nil {
			if ids, err := n.runningTasks(ctx); err == nil {
				for _, id := range ids {
					n.Ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
				}
			}
		}
		errs = append(errs, n.containerd.stop(15*time.Second))
	}
	return errs
}

// removeWorkloads deletes every controller's pods and the pods themselves
// (grace 0) and waits until the nodes' containerds run no task, so the
// kubelets have torn every sandbox down (CNI DEL, volumes) before they stop.
func (n *Node) removeWorkloads(ctx context.Context, nodes ...*Node) error {
	cs := n.Cluster.Admin
	nss, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	zero := int64(0)
	for _, ns := range nss.Items {
		cs.AppsV1().DaemonSets(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		cs.AppsV1().Deployments(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		cs.AppsV1().ReplicaSets(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return kube.Poll(wctx, 250*time.Millisecond, func() (bool, error) {
		pods, err := cs.CoreV1().Pods(corev1.NamespaceAll).List(wctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) > 0 {
			return false, nil
		}
		for _, m := range nodes {
			if tasks, err := m.runningTasks(wctx); err != nil || len(tasks) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// proc is one component process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{}
	waitErr error
}

// startProc starts a component in the node's namespace.
func (n *Node) startProc(name, bin string, args ...string) (*proc, error) {
	return n.startProcIn(n.NetnsPath, name, bin, args...)
}

func (n *Node) startProcIn(nsPath, name, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, logPath: n.LogPath(name), done: make(chan struct{})}
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating %s's log: %w", name, err)
	}
	p.logFile = f
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	if err := kube.StartCmd(nsPath, p.cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	n.log.Debug("started", "component", name, "pid", p.cmd.Process.Pid, "log", p.logPath)
	return p, nil
}

func (p *proc) deadErr() error {
	select {
	case <-p.done:
		// The run's directory, and the log with it, may be gone by the
		// time anyone reads the error: it carries the log's end.
		end := "(unreadable)"
		if b, err := os.ReadFile(p.logPath); err == nil {
			end = tailLines(string(b), 15)
		}
		return fmt.Errorf("%s exited (%v); the end of its log %s:\n%s", p.name, p.waitErr, p.logPath, end)
	default:
		return nil
	}
}

func (p *proc) stop(grace time.Duration) error {
	select {
	case <-p.done:
	default:
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	return p.logFile.Close()
}
