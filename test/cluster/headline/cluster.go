// Package headline runs draind's headline scenario (package
// github.com/draind/draind/test/scenario) against real Kubernetes: the
// kube-apiserver, the EndpointSlice controller and kube-proxy (iptables
// mode, one per node) of package kube, a kubelet stand-in per node, and, in
// draind variants, `draind run` as a separate process per node with the
// ServiceAccount and RBAC of deploy/daemonset.
//
// Words are defined in the repository's docs/glossary.md.
package headline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/e2e"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/scenario"
)

// Config configures the real control plane's side of the scenario.
type Config struct {
	// DraindBinary is `draind`; empty builds it (go build ./cmd/draind).
	DraindBinary string
	// OfflinePort is draind's offline API port on each node IP (9460).
	OfflinePort uint16
	// LoadServices extra Services for the +load variants (2,000), created
	// with LoadWorkers parallel writers (8); LoadChurn slice updates per
	// second while a +load variant runs (20).
	LoadServices int
	LoadWorkers  int
	LoadChurn    int
	// Dir keeps draind's logs and kubeconfigs; empty: a temporary
	// directory removed by Close.
	Dir string
	Log *slog.Logger
}

func (c *Config) defaults() {
	if c.OfflinePort == 0 {
		c.OfflinePort = 9460
	}
	if c.LoadServices == 0 {
		c.LoadServices = 2000
	}
	if c.LoadWorkers == 0 {
		c.LoadWorkers = 8
	}
	if c.LoadChurn == 0 {
		c.LoadChurn = 20
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Cluster is the scenario's control plane on a real cluster: three nodes
// (node-a and node-b host the Service's pods, node-c the clients), each
// with kube-proxy and a kubelet stand-in.
type Cluster struct {
	cfg     Config
	kube    *kube.Cluster
	bed     *bed.Bed
	nodes   []*e2e.Node
	byBed   map[*bed.Node]*e2e.Node
	servers []*bed.Node
	client  *bed.Node
	dir     string
	ownDir  bool
	stops   []func()

	mu        sync.Mutex
	hooks     map[string]scenario.PodHooks // namespace/name
	load      *load
	draindLog []string // log files of every draind started
	// programming: each draind variant's network-programming latency.
	programming []Programming
}

var _ scenario.ControlPlane = (*Cluster)(nil)

// Start joins three bed nodes to kc (kube-proxy on each), applies draind's
// RBAC from deploy/daemonset and starts the kubelet stand-ins. Close undoes
// it (kc itself stays).
func Start(ctx context.Context, kc *kube.Cluster, cfg Config) (_ *Cluster, err error) {
	cfg.defaults()
	c := &Cluster{cfg: cfg, kube: kc, byBed: map[*bed.Node]*e2e.Node{}, hooks: map[string]scenario.PodHooks{}, dir: cfg.Dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "draind-headline-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	if c.bed, err = bed.New(); err != nil {
		return nil, fmt.Errorf("creating the test bed: %w", err)
	}
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		n, err := e2e.AddNode(ctx, kc, c.bed, name)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
		c.byBed[n.Bed] = n
		if name == "node-c" {
			c.client = n.Bed
		} else {
			c.servers = append(c.servers, n.Bed)
		}
	}
	for _, n := range c.nodes {
		stop, err := n.Kubelet.OnDeletion(ctx, c.terminate(n))
		if err != nil {
			return nil, err
		}
		c.stops = append(c.stops, stop)
	}
	if err := ApplyRBAC(ctx, kc.Admin); err != nil {
		return nil, err
	}
	if c.cfg.DraindBinary == "" {
		start := time.Now()
		if c.cfg.DraindBinary, err = draindbin.Build(ctx, c.dir); err != nil {
			return nil, err
		}
		cfg.Log.Info("built draind", "took", time.Since(start).Round(time.Millisecond))
	}
	return c, nil
}

// terminate is node n's kubelet on a pod's graceful deletion.
func (c *Cluster) terminate(n *e2e.Node) func(context.Context, *corev1.Pod) {
	return func(ctx context.Context, pod *corev1.Pod) {
		c.mu.Lock()
		h, ok := c.hooks[pod.Namespace+"/"+pod.Name]
		c.mu.Unlock()
		if !ok {
			return
		}
		err := n.Kubelet.Terminate(ctx, pod.Namespace, pod.Name, h.PreStop, h.Stop)
		if h.Gone != nil {
			h.Gone(err)
		}
	}
}

// Describe names the components.
func (c *Cluster) Describe() string {
	return fmt.Sprintf("real kube-apiserver, EndpointSlice controller and kube-proxy (iptables) %s; draind as a separate process per node with its ServiceAccount's RBAC",
		c.kube.Binaries().Version)
}

// ServerNodes are node-a and node-b.
func (c *Cluster) ServerNodes() []*bed.Node { return c.servers }

// ClientNode is node-c.
func (c *Cluster) ClientNode() *bed.Node { return c.client }

// Prepare puts the cluster under load or takes it off (+load variants), and
// starts draind on every node for draind variants.
func (c *Cluster) Prepare(ctx context.Context, v scenario.Variant) (func() error, error) {
	if err := c.setLoad(ctx, v.Load); err != nil {
		return nil, err
	}
	undo := func() error { return nil }
	if v.Load {
		c.load.startChurn(c.cfg.LoadChurn)
		undo = func() error { c.load.stopChurn(); return nil }
	}
	if !v.Draind {
		return undo, nil
	}
	cfg, err := c.kube.ServiceAccountConfig(ctx, DraindNamespace, DraindServiceAccount, time.Hour)
	if err != nil {
		return nil, errors.Join(err, undo())
	}
	var procs []*draindProc
	measured, err := c.measureProgramming(ctx, v.Label(), &procs)
	if err != nil {
		return nil, errors.Join(err, undo())
	}
	stopAll := func() error {
		errs := []error{measured(), undo()}
		for _, p := range procs {
			errs = append(errs, p.stop())
		}
		return errors.Join(errs...)
	}
	for _, n := range c.nodes {
		kubeconfig := filepath.Join(c.dir, "draind-"+n.Bed.Name+".kubeconfig")
		if err := kube.WriteKubeconfig(kubeconfig, n.Kube.Config(cfg)); err != nil {
			return nil, errors.Join(err, stopAll())
		}
		p, err := startDraind(ctx, c.cfg.DraindBinary, n.Bed, kubeconfig, c.dir, c.cfg.OfflinePort)
		if err != nil {
			return nil, errors.Join(err, stopAll())
		}
		procs = append(procs, p)
		c.mu.Lock()
		c.draindLog = append(c.draindLog, p.LogPath)
		c.mu.Unlock()
	}
	c.cfg.Log.Info("draind running on every node", "as", DraindUser)
	return stopAll, nil
}

// setLoad creates the load (once) and waits until every kube-proxy has
// programmed it, or removes it.
func (c *Cluster) setLoad(ctx context.Context, on bool) error {
	switch {
	case on && c.load == nil:
		l, err := createLoad(ctx, c.kube.Admin, c.cfg.LoadServices, c.cfg.LoadWorkers, c.cfg.Log)
		c.load = l
		if err != nil {
			return err
		}
		for _, n := range c.nodes {
			if err := c.waitServicePorts(ctx, n, c.cfg.LoadServices); err != nil {
				return err
			}
		}
	case !on && c.load != nil:
		err := c.load.remove(ctx)
		c.load = nil
		if err != nil {
			return fmt.Errorf("removing the load: %w", err)
		}
	}
	return nil
}

// waitServicePorts waits until kube-proxy on n has rules for at least
// want ClusterIP service ports (a large table: polled every half second).
func (c *Cluster) waitServicePorts(ctx context.Context, n *e2e.Node, want int) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for {
		r, err := n.Kube.Rules(ctx, corev1.IPv4Protocol)
		if err == nil && len(r.ServicePorts()) >= want {
			c.cfg.Log.Info("kube-proxy programmed the load", "node", n.Kube.Name, "service_ports", len(r.ServicePorts()), "waited", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if herr := c.kube.Healthy(); herr != nil {
			return herr
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for kube-proxy on %s to program %d services: %w (last dump error: %v)", n.Kube.Name, want, ctx.Err(), err)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// CreateService creates the namespace (if needed) and an IPv4 ClusterIP
// Service.
func (c *Cluster) CreateService(ctx context.Context, s scenario.ServiceSpec) (netip.AddrPort, error) {
	admin := c.kube.Admin
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return netip.AddrPort{}, fmt.Errorf("creating namespace %s: %w", s.Namespace, err)
	}
	// Pods are admitted once the namespace's default ServiceAccount exists.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.kube.WaitServiceAccount(wctx, s.Namespace, "default"); err != nil {
		return netip.AddrPort{}, fmt.Errorf("waiting for namespace %s's default serviceaccount: %w", s.Namespace, err)
	}
	single := corev1.IPFamilyPolicySingleStack
	svc, err := admin.CoreV1().Services(s.Namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name},
		Spec: corev1.ServiceSpec{
			Selector: s.Selector, IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: int32(s.Port), TargetPort: intstr.FromInt32(int32(s.TargetPort))}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("creating service %s/%s: %w", s.Namespace, s.Name, err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("service %s/%s: clusterIP %q: %w", s.Namespace, s.Name, svc.Spec.ClusterIP, err)
	}
	return netip.AddrPortFrom(vip, s.Port), nil
}

// RunPod creates the pod on its node, running and Ready, with the
// manifest's preStop and HOST_IP from the downward API, as a real
// Deployment's pod would have.
func (c *Cluster) RunPod(ctx context.Context, p scenario.PodSpec) error {
	n, ok := c.byBed[p.Node]
	if !ok {
		return fmt.Errorf("running pod %s: %s is not a node of this cluster", p.Name, p.Node.Name)
	}
	c.mu.Lock()
	c.hooks[p.Namespace+"/"+p.Name] = p.Hooks
	c.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "server", Image: "draind.test/bed-server",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(p.Port), Protocol: corev1.ProtocolTCP}},
			Env: []corev1.EnvVar{{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}}},
		}}},
	}
	if p.PreStop != nil {
		pod.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: p.PreStop}
	}
	if _, err := n.Kubelet.RunPod(ctx, pod, p.IPs...); err != nil {
		return err
	}
	return nil
}

// DeletePod deletes the pod gracefully (default grace period).
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string) error {
	if err := c.kube.Admin.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// WaitProgrammed waits until kube-proxy on node balances vip over exactly
// eps.
func (c *Cluster) WaitProgrammed(ctx context.Context, node *bed.Node, vip netip.AddrPort, eps []netip.AddrPort) error {
	n, ok := c.byBed[node]
	if !ok {
		return fmt.Errorf("waiting for rules: %s is not a node of this cluster", node.Name)
	}
	want := slices.Clone(eps)
	slices.SortFunc(want, netip.AddrPort.Compare)
	sp := kube.ServicePort{IP: vip.Addr(), Port: vip.Port(), Protocol: corev1.ProtocolTCP}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err := n.Kube.WaitRules(ctx, corev1.IPv4Protocol, func(r *kube.Rules) bool {
		got := slices.Clone(r.Endpoints(sp))
		slices.SortFunc(got, netip.AddrPort.Compare)
		return slices.Equal(got, want)
	})
	return err
}

// Clear removes the namespace's pods (grace 0: no kubelet hook runs) and
// Services. The namespace stays (no namespace controller runs here).
func (c *Cluster) Clear(ctx context.Context, namespace string) error {
	c.mu.Lock()
	for key := range c.hooks {
		if ns, _, _ := strings.Cut(key, "/"); ns == namespace {
			delete(c.hooks, key)
		}
	}
	c.mu.Unlock()
	admin := c.kube.Admin
	var errs []error
	zero := int64(0)
	if err := admin.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		errs = append(errs, err)
	}
	svcs, err := admin.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, s := range svcs.Items {
			if err := admin.CoreV1().Services(namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// DraindLogs returns the log files of every draind this cluster started.
func (c *Cluster) DraindLogs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.draindLog)
}

// Close stops the kubelet stand-ins and the churn, removes the bed (nodes,
// pods, their iptables rules) and stops kube-proxy on the nodes.
func (c *Cluster) Close() error {
	for _, stop := range c.stops {
		stop()
	}
	if c.load != nil {
		c.load.stopChurn()
	}
	var errs []error
	for _, n := range c.nodes {
		errs = append(errs, n.Kube.Stop())
	}
	if c.bed != nil {
		errs = append(errs, c.bed.Close())
	}
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.dir))
	}
	return errors.Join(errs...)
}
