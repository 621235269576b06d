// Package inject tests `draind webhook` against a real
// kube-apiserver: the shipped component (deploy/webhook) rendered with
// kustomize and installed as it is, except that the webhook configuration
// calls a URL on the host's loopback instead of the Service (there is no
// kubelet to run the Deployment's pods); the webhook runs as a separate
// process of the real binary with the component's arguments, environment
// and RBAC (a token of its ServiceAccount), creating and rotating its own
// TLS material, and the API server calls it over TLS for pods the
// Deployment and ReplicaSet controllers create.
//
// The helpers here (rendering, the webhook process, a round-robin relay
// standing in for the Service) are exported for other beds, such as a
// real-node rollout with the webhook installed.
//
// Words are defined in the repository's docs/glossary.md.
package inject

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/files"
)

// Component directories under deploy/.
const (
	ComponentWebhook     = "webhook"
	ComponentCertManager = "webhook/cert-manager"
)

// RenderOverlay renders an overlay of deploy/daemonset with the given
// components of deploy/ (ComponentWebhook, ComponentCertManager), written
// next to a copy of deploy/ in a temporary directory, as an operator would
// write it; extra is appended to the overlay's kustomization.yaml (an
// images: override, say).
func RenderOverlay(components []string, extra string) ([]*unstructured.Unstructured, error) {
	root, err := draindbin.RepoRoot()
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "draind-inject-overlay-")
	if err != nil {
		return nil, fmt.Errorf("creating an overlay directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := files.CopyTree(filepath.Join(tmp, "deploy"), filepath.Join(root, "deploy")); err != nil {
		return nil, err
	}
	var k strings.Builder
	k.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../../daemonset\n")
	if len(components) > 0 {
		k.WriteString("components:\n")
		for _, c := range components {
			k.WriteString("- ../../" + c + "\n")
		}
	}
	k.WriteString(extra)
	dir := filepath.Join(tmp, "deploy", "overlays", "test")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		return nil, err
	}
	return deploycheck.Render(dir)
}

// Added returns the objects of with that base does not have (by kind,
// namespace and name): what a component adds.
func Added(base, with []*unstructured.Unstructured) []*unstructured.Unstructured {
	key := func(o *unstructured.Unstructured) string {
		return o.GroupVersionKind().GroupKind().String() + "/" + o.GetNamespace() + "/" + o.GetName()
	}
	have := map[string]bool{}
	for _, o := range base {
		have[key(o)] = true
	}
	var out []*unstructured.Unstructured
	for _, o := range with {
		if !have[key(o)] {
			out = append(out, o)
		}
	}
	return out
}

// HostArgs returns the arguments and environment of the rendered webhook
// Deployment's container for a `draind webhook` process on the host: the
// container's args and env (a fieldRef to the namespace resolved), plus
// the bed's: the ServiceAccount's kubeconfig, loopback listen addresses,
// 127.0.0.1 in the serving certificate (the API server calls it by URL),
// no shutdown delay, text logs.
func HostArgs(dep *appsv1.Deployment, kubeconfig, addr, health string) (args, env []string) {
	c := dep.Spec.Template.Spec.Containers[0]
	args = append(append(args, c.Args...),
		"--kubeconfig="+kubeconfig, "--listen="+addr, "--health-listen="+health,
		"--tls-extra-san=127.0.0.1", "--shutdown-delay=0", "--log-format=text", "--log-level=debug")
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			v = dep.Namespace
		}
		env = append(env, e.Name+"="+v)
	}
	return args, env
}

// InjectedAnnotation is what the webhook writes on a pod it injected.
const InjectedAnnotation = "draind.io/injected"

// WaitInjecting waits until the API server trusts and calls the webhook: a
// dry-run pod in namespace ns (opted in; admission runs, nothing is
// stored) comes back injected.
func WaitInjecting(ctx context.Context, client kubernetes.Interface, ns string) error {
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/probe:1"}}},
	}
	var last *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err
		}
		last = p
		return p.Annotations[InjectedAnnotation] != "", nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not get injected pods from the webhook (last dry-run pod's annotations %v): %w", last.GetAnnotations(), err)
	}
	return nil
}

// Process is one `draind webhook` process.
type Process struct {
	Addr       string // the webhook's HTTPS address
	HealthAddr string // /healthz, /readyz, /metrics
	LogPath    string

	cmd    *exec.Cmd
	log    *os.File
	exited chan struct{}
	err    error
}

// StartProcess runs bin with args and env (added to a minimal environment)
// and its output in logPath. The caller gives the listen addresses in args
// and says which they are.
func StartProcess(bin string, args, env []string, addr, healthAddr, logPath string) (*Process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening webhook log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	// Dies with the test binary, even on SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &Process{Addr: addr, HealthAddr: healthAddr, LogPath: logPath, cmd: cmd, log: f, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.exited)
	}()
	return p, nil
}

// WaitReady polls /readyz (the signal: a serving certificate is loaded)
// until it answers 200, the process exits, or ctx ends.
func (p *Process) WaitReady(ctx context.Context) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		select {
		case <-p.exited:
			return fmt.Errorf("webhook exited: %v (log %s)", p.err, p.LogPath)
		default:
		}
		if resp, err := hc.Get("http://" + p.HealthAddr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the webhook's /readyz: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Admissions reads draind_webhook_admissions_total by result.
func (p *Process) Admissions(ctx context.Context) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HealthAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping the webhook: %w", err)
	}
	defer resp.Body.Close()
	mfs, _, err := deploycheck.ParseExposition(resp.Body)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	mf := mfs["draind_webhook_admissions_total"]
	if mf == nil {
		return nil, errors.New("the webhook exports no draind_webhook_admissions_total")
	}
	for _, m := range mf.GetMetric() {
		out[label(m, "result")] = m.GetCounter().GetValue()
	}
	return out, nil
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// Stop sends SIGTERM and waits for the process to exit.
func (p *Process) Stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("webhook did not stop within 20s of SIGTERM (log %s)", p.LogPath)
	}
	var ee *exec.ExitError
	if p.err != nil && !errors.As(p.err, &ee) {
		return p.err
	}
	if ee != nil && ee.ExitCode() != 0 {
		return fmt.Errorf("webhook exited with %v (log %s)", p.err, p.LogPath)
	}
	return nil
}

// Tail returns the end of the process's log.
func (p *Process) Tail(n int) string {
	b, _ := os.ReadFile(p.LogPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Relay is a round-robin TCP relay: the Service of a Deployment with
// several webhook replicas, on loopback. Each accepted connection goes to
// the next backend.
type Relay struct {
	Addr string

	l        net.Listener
	backends atomic.Pointer[[]string]
	next     atomic.Uint64
	mu       sync.Mutex
	counts   map[string]int
	wg       sync.WaitGroup
	conns    map[net.Conn]struct{}
	closed   bool
}

// NewRelay listens on a free loopback port.
func NewRelay(backends ...string) (*Relay, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening for the relay: %w", err)
	}
	r := &Relay{Addr: l.Addr().String(), l: l, counts: map[string]int{}, conns: map[net.Conn]struct{}{}}
	r.SetBackends(backends...)
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// SetBackends replaces the backends for new connections.
func (r *Relay) SetBackends(b ...string) { r.backends.Store(&b) }

// Counts returns how many connections each backend got.
func (r *Relay) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.l.Accept()
		if err != nil {
			return
		}
		bs := *r.backends.Load()
		if len(bs) == 0 {
			c.Close()
			continue
		}
		b := bs[int(r.next.Add(1)-1)%len(bs)]
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			c.Close()
			return
		}
		r.counts[b]++
		r.conns[c] = struct{}{}
		r.mu.Unlock()
		r.wg.Add(1)
		go r.pipe(c, b)
	}
}

func (r *Relay) pipe(c net.Conn, backend string) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		c.Close()
	}()
	u, err := net.DialTimeout("tcp", backend, 2*time.Second)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{}, 2)
	go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, u); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}

// Close stops the relay and its connections.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.l.Close()
	r.wg.Wait()
}
