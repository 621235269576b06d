// Package embedded is the control plane of `draind-demo` (cmd/draind-demo):
// it starts in seconds and needs no Kubernetes build and no installed
// program. The API is client-go's fake clientset in this process; stand-ins
// play the EndpointSlice controller, kube-proxy (real DNAT rules in every
// node's namespace, nftables over netlink, rewritten from the EndpointSlices
// with kube-proxy's delays) and the kubelet; and in draind variants the real
// draind daemon runs in this process, one per node, with the real BPF
// datapath and conntrack. Nodes and pods are test/bed network namespaces with
// real servers and clients.
//
// Words are defined in the repository's docs/glossary.md.
package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/scenario"
)

// Config tunes the stand-ins. The defaults follow what TESTBED.md measured
// with the real components on this kind of machine, quiet: a graceful
// delete reaches the EndpointSlice in 12–35 ms, and kube-proxy's DNAT rule
// to the pod is gone 73–119 ms after the delete (~800 ms when another
// change came within the previous second: --iptables-min-sync-period 1s).
type Config struct {
	// SliceDelay: pod change → EndpointSlice written (20 ms).
	SliceDelay time.Duration
	// ProxySyncDelay: EndpointSlice change → kube-proxy sync starts (60 ms;
	// the iptables-restore itself adds ~10 ms).
	ProxySyncDelay time.Duration
	// ProxyMinSyncPeriod: at most one sync per period (1 s, kube-proxy's
	// default --iptables-min-sync-period).
	ProxyMinSyncPeriod time.Duration
	// OfflinePort is draind's offline API port on each node IP (9460).
	OfflinePort uint16
	// Log receives the stand-ins' messages; DaemonLog the daemons' (nil:
	// warnings and errors to Log).
	Log, DaemonLog *slog.Logger
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.SliceDelay, 20*time.Millisecond)
	def(&c.ProxySyncDelay, 60*time.Millisecond)
	def(&c.ProxyMinSyncPeriod, time.Second)
	if c.OfflinePort == 0 {
		c.OfflinePort = 9460
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.DaemonLog == nil {
		c.DaemonLog = slog.New(levelHandler{slog.LevelWarn, c.Log.Handler()})
	}
}

// Cluster is the embedded control plane: three bed nodes (two for the
// Service's pods, one for the clients) and the stand-ins.
type Cluster struct {
	cfg     Config
	bed     *bed.Bed
	servers []*bed.Node
	client  *bed.Node
	api     *fake.Clientset
	kubelet *kubelet
	proxies map[*bed.Node]*proxy
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	mu      sync.Mutex
	nextVIP int
	daemons map[*bed.Node]*nodeDaemon // while a draind variant runs
}

var _ scenario.ControlPlane = (*Cluster)(nil)

// New builds the nodes and starts the stand-ins. Close removes everything.
func New(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	cfg.defaults()
	b, err := bed.New()
	if err != nil {
		return nil, fmt.Errorf("creating the test bed: %w", err)
	}
	c := &Cluster{cfg: cfg, bed: b, api: fake.NewClientset(), proxies: map[*bed.Node]*proxy{}, nextVIP: 10}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	for _, name := range []string{"node-a", "node-b", "node-c"} {
		n, err := b.AddNode(name)
		if err != nil {
			return nil, fmt.Errorf("creating node %s: %w", name, err)
		}
		if name == "node-c" {
			c.client = n
		} else {
			c.servers = append(c.servers, n)
		}
	}

	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	factory := informers.NewSharedInformerFactory(c.api, 0)
	pods := factory.Core().V1().Pods()
	services := factory.Core().V1().Services()
	slices := factory.Discovery().V1().EndpointSlices()
	sc := newSliceController(c.api, pods.Lister(), services.Lister(), cfg.SliceDelay, cfg.Log)
	c.kubelet = newKubelet(c.api, cfg.Log)
	for _, n := range b.Nodes() {
		p, err := newProxy(n, services.Lister(), slices.Lister(), cfg.ProxySyncDelay, cfg.ProxyMinSyncPeriod, cfg.Log)
		if err != nil {
			return nil, err
		}
		c.proxies[n] = p
	}
	podHandler := func(obj any) {
		sc.changed()
		if p, ok := obj.(*corev1.Pod); ok {
			c.kubelet.podChanged(rctx, p)
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: podHandler, UpdateFunc: func(_, o any) { podHandler(o) }, DeleteFunc: func(any) { sc.changed() },
	}); err != nil {
		return nil, err
	}
	svcHandler := func(any) {
		sc.changed()
		for _, p := range c.proxies {
			p.changedEvent()
		}
	}
	if _, err := services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: svcHandler, UpdateFunc: func(_, o any) { svcHandler(o) }, DeleteFunc: svcHandler,
	}); err != nil {
		return nil, err
	}
	sliceHandler := func(any) {
		for _, p := range c.proxies {
			p.changedEvent()
		}
	}
	if _, err := slices.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: sliceHandler, UpdateFunc: func(_, o any) { sliceHandler(o) }, DeleteFunc: sliceHandler,
	}); err != nil {
		return nil, err
	}
	factory.Start(rctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("syncing the %v informer: %w", typ, ctx.Err())
		}
	}
	c.wg.Add(1 + len(c.proxies))
	go func() { defer c.wg.Done(); sc.run(rctx) }()
	for _, p := range c.proxies {
		go func() { defer c.wg.Done(); p.run(rctx) }()
	}
	c.wg.Add(1)
	go func() { defer c.wg.Done(); <-rctx.Done(); factory.Shutdown() }()
	return c, nil
}

// Describe names the control plane and its delays.
func (c *Cluster) Describe() string {
	return fmt.Sprintf("embedded (fake API; EndpointSlice stand-in %v; kube-proxy stand-in: nftables DNAT, sync %v after a change, at most every %v; real draind in process)",
		c.cfg.SliceDelay, c.cfg.ProxySyncDelay, c.cfg.ProxyMinSyncPeriod)
}

// ServerNodes are node-a and node-b.
func (c *Cluster) ServerNodes() []*bed.Node { return c.servers }

// ClientNode is node-c.
func (c *Cluster) ClientNode() *bed.Node { return c.client }

// Prepare starts draind on every node for draind variants. The embedded
// control plane has no load generator.
func (c *Cluster) Prepare(ctx context.Context, v scenario.Variant) (func() error, error) {
	if v.Load {
		return nil, errors.New("the embedded control plane cannot put the cluster under load: run the headline test in test/cluster")
	}
	if !v.Draind {
		return func() error { return nil }, nil
	}
	var daemons []*nodeDaemon
	stop := func() error {
		c.mu.Lock()
		c.daemons = nil
		c.mu.Unlock()
		var errs []error
		for _, d := range daemons {
			errs = append(errs, d.stop())
		}
		return errors.Join(errs...)
	}
	for _, n := range c.bed.Nodes() {
		d, err := startDaemon(ctx, c.api, n, c.cfg.OfflinePort, c.cfg.DaemonLog)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		daemons = append(daemons, d)
		c.mu.Lock()
		if c.daemons == nil {
			c.daemons = map[*bed.Node]*nodeDaemon{}
		}
		c.daemons[n] = d
		c.mu.Unlock()
	}
	return stop, nil
}

// CreateService creates a ClusterIP Service with the next free VIP.
func (c *Cluster) CreateService(ctx context.Context, s scenario.ServiceSpec) (netip.AddrPort, error) {
	c.mu.Lock()
	c.nextVIP++
	vip := netip.AddrFrom4([4]byte{10, 96, byte(c.nextVIP >> 8), byte(c.nextVIP)})
	c.mu.Unlock()
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: s.Selector,
			ClusterIP: vip.String(), ClusterIPs: []string{vip.String()}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: int32(s.Port), TargetPort: intstr.FromInt32(int32(s.TargetPort))}},
		},
	}
	if _, err := c.api.CoreV1().Services(s.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("creating service %s/%s: %w", s.Namespace, s.Name, err)
	}
	return netip.AddrPortFrom(vip, s.Port), nil
}

// RunPod creates the pod and reports it running and Ready.
func (c *Cluster) RunPod(ctx context.Context, p scenario.PodSpec) error {
	c.kubelet.register(p.Namespace, p.Name, p.Hooks)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, Annotations: p.Annotations,
			UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec: corev1.PodSpec{NodeName: p.Node.Name, Containers: []corev1.Container{{
			Name: "server", Image: "draind.demo/server",
			Ports:     []corev1.ContainerPort{{Name: "http", ContainerPort: int32(p.Port), Protocol: corev1.ProtocolTCP}},
			Lifecycle: &corev1.Lifecycle{PreStop: p.PreStop},
		}}},
	}
	created, err := c.api.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	now := metav1.Now()
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: p.Node.IP4.String(), PodIP: p.IPs[0].String(), StartTime: &now,
		HostIPs: []corev1.HostIP{{IP: p.Node.IP4.String()}, {IP: p.Node.IP6.String()}}}
	for _, ip := range p.IPs {
		created.Status.PodIPs = append(created.Status.PodIPs, corev1.PodIP{IP: ip.String()})
	}
	for _, t := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		created.Status.Conditions = append(created.Status.Conditions, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	created.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "server", Ready: true, Started: ptr(true),
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := c.api.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting status of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// DeletePod deletes the pod gracefully, as the apiserver does: it gets a
// deletionTimestamp and stays until its kubelet removes it.
func (c *Cluster) DeletePod(ctx context.Context, namespace, name string) error {
	pod, err := c.api.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	now := metav1.Now()
	grace := int64(30)
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, &grace
	if _, err := c.api.CoreV1().Pods(namespace).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// WaitProgrammed waits for node's kube-proxy stand-in.
func (c *Cluster) WaitProgrammed(ctx context.Context, node *bed.Node, vip netip.AddrPort, eps []netip.AddrPort) error {
	p, ok := c.proxies[node]
	if !ok {
		return fmt.Errorf("waiting for rules: %s is not a node of this cluster", node.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return p.waitProgrammed(ctx, vip, eps)
}

// Clear deletes the namespace's pods and Services (no hooks run).
func (c *Cluster) Clear(ctx context.Context, namespace string) error {
	c.kubelet.forget(namespace)
	var errs []error
	pods, err := c.api.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, p := range pods.Items {
			errs = append(errs, ignoreNotFound(c.api.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{})))
		}
	}
	svcs, err := c.api.CoreV1().Services(namespace).List(ctx, metav1.ListOptions{})
	errs = append(errs, err)
	if err == nil {
		for _, s := range svcs.Items {
			errs = append(errs, ignoreNotFound(c.api.CoreV1().Services(namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})))
		}
	}
	return errors.Join(errs...)
}

func ignoreNotFound(err error) error {
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Close stops the stand-ins and any daemon, and removes the nodes.
func (c *Cluster) Close() error {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
	}
	if c.kubelet != nil {
		c.kubelet.wait()
	}
	return c.bed.Close()
}

// levelHandler drops records below a level.
type levelHandler struct {
	min slog.Level
	slog.Handler
}

func (h levelHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h levelHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return levelHandler{h.min, h.Handler.WithAttrs(a)}
}

func (h levelHandler) WithGroup(n string) slog.Handler {
	return levelHandler{h.min, h.Handler.WithGroup(n)}
}
