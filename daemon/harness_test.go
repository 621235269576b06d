package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/k8s"
)

const (
	testNode = "node-a"
	testNS   = "draind-system"
)

// harness runs a Daemon against the client-go fake clientset, the fake
// datapath, the fake conntrack and a fake clock. Passes are driven by the
// test (pass), not by the runner loop, so every assertion is deterministic.
//
// A harness lives in a synctest bubble (synctest.Test), informers and all:
// the test waits for what the daemon's goroutines do with synctest.Wait,
// never by polling. Only the HTTP fixture's harness runs outside one
// (realTime): its API serves on a real TCP socket, as caller identity is
// the peer's address, and a goroutine blocked on the network never counts
// as idle in a bubble.
type harness struct {
	t        *testing.T
	realTime bool
	client   *fake.Clientset
	dp       *datapathtest.Datapath
	ct       *conntracktest.Fake
	clock    *testingclock.FakeClock
	d        *Daemon
	ctx      context.Context
	// Set to make the fake API fail Lease writes (reactors must be
	// installed before any call: client-go's fake is not safe otherwise).
	failLeaseCreate, failLeaseUpdate atomic.Bool
	// apiDown makes every Lease call fail, as during an API server outage.
	apiDown atomic.Bool
}

// newHarness starts a harness; call it inside synctest.Test.
func newHarness(t *testing.T, mod ...func(*Config)) *harness {
	t.Helper()
	return startHarness(t, false, mod...)
}

func startHarness(t *testing.T, realTime bool, mod ...func(*Config)) *harness {
	t.Helper()
	h := &harness{t: t, realTime: realTime, client: fake.NewClientset(), dp: datapathtest.New(), ct: conntracktest.New(),
		clock: testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}
	for verb, flag := range map[string]*atomic.Bool{"create": &h.failLeaseCreate, "update": &h.failLeaseUpdate} {
		h.client.PrependReactor(verb, "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if flag.Load() {
				return true, nil, errors.New("apiserver unavailable")
			}
			return false, nil, nil
		})
	}
	for _, verb := range []string{"get", "create", "update", "patch", "delete"} {
		h.client.PrependReactor(verb, "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if h.apiDown.Load() {
				return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
			}
			return false, nil, nil
		})
	}
	cfg := Config{Node: testNode, Namespace: testNS, Clock: h.clock, RegistryOnlyPolicy: bpf.PolicyRefuse,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mod {
		m(&cfg)
	}
	h.d = mustNew(t, cfg, h.client, h.dp, h.ct)
	h.d.hosted.Start()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		h.d.hosted.Stop("the test is over")
	})
	h.ctx = ctx
	go h.d.inf.RunAndWait(ctx)
	if err := h.d.inf.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	h.await("the handlers to sync", h.d.handlersSynced)
	h.d.synced.Store(true)
	h.d.SetAttached(true)
	return h
}

// mustNew is New for a test: a configuration New refuses fails it.
func mustNew(tb testing.TB, cfg Config, client kubernetes.Interface, dp Datapath, ct conntrack.Interface) *Daemon {
	tb.Helper()
	d, err := New(cfg, client, dp, ct)
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

// await waits for cond (a signal: an informer caught up, a map reached a
// state) and fails the test with what if it does not hold.
func (h *harness) await(what string, cond func() bool) {
	h.t.Helper()
	if !h.holds(cond) {
		h.t.Fatalf("waiting for %s: it did not happen", what)
	}
}

// holds reports whether cond holds once the daemon is done with what the
// test did. In a bubble it waits until every goroutine of the bubble is
// blocked and looks once: nothing could make cond hold later without the
// test acting or time passing. A realTime harness polls for 10 s.
func (h *harness) holds(cond func() bool) bool {
	if h.realTime {
		return poll(10*time.Second, cond)
	}
	synctest.Wait()
	return cond()
}

// restart starts a second daemon over the same API and the same datapath
// (pinned maps), adopting the datapath exactly as Run does.
func (h *harness) restart() *harness {
	h.t.Helper()
	h2 := &harness{t: h.t, realTime: h.realTime, client: h.client, dp: h.dp, ct: h.ct, clock: h.clock, ctx: h.ctx}
	h2.d = mustNew(h.t, h.d.cfg, h.client, h.dp, h.ct)
	h2.d.hosted.Start()
	h.t.Cleanup(func() { h2.d.hosted.Stop("the test is over") })
	if err := h2.d.adoptDatapath(); err != nil {
		h.t.Fatal(err)
	}
	go h2.d.inf.RunAndWait(h.ctx)
	if err := h2.d.inf.WaitForSync(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h2.await("the handlers to sync", h2.d.handlersSynced)
	h2.d.synced.Store(true)
	h2.d.SetAttached(true)
	h2.d.claims.SetLocalPods(h2.d.state.LocalPods())
	h2.d.checkLeases(h.ctx)
	return h2
}

// do runs an API call and waits until the daemon's handlers saw n more
// events of that kind.
func (h *harness) do(kind *atomic.Uint64, n int, fn func(context.Context) error) {
	h.t.Helper()
	before := kind.Load()
	if err := fn(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.await(fmt.Sprintf("%d informer events", n), func() bool { return kind.Load() >= before+uint64(n) })
}

// pass runs one reconciler pass and returns the datapath operations it
// made. A Lease the pass had to check against its pod is checked at once
// and the pass repeated, as the daemon's Lease checker would.
func (h *harness) pass() int {
	before := h.dp.OpCount()
	h.d.sync()
	if h.d.leaseTrust.Flush(h.ctx) {
		h.d.sync()
	}
	return h.dp.OpCount() - before
}

// podElsewhere creates a pod of another node in the API: the object a
// registry-only Lease is checked against. The fake clientset ignores the
// pod informer's field selector, so this node's informer sees it too (and
// keeps it out of LocalPods): the call returns once its event was handled,
// so that it cannot be taken for the event of a later call.
func (h *harness) podElsewhere(name, uid, node string, ips ...string) {
	h.t.Helper()
	p := pod(name, uid, ips...)
	p.Spec.NodeName = node
	h.do(&h.d.events.pods, 1, func(ctx context.Context) error {
		_, err := h.client.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		return err
	})
}

func (h *harness) addService(s *corev1.Service) {
	h.do(&h.d.events.services, 1, func(ctx context.Context) error {
		_, err := h.client.CoreV1().Services(s.Namespace).Create(ctx, s, metav1.CreateOptions{})
		return err
	})
}

func (h *harness) deleteService(ns, name string) {
	h.do(&h.d.events.services, 1, func(ctx context.Context) error {
		return h.client.CoreV1().Services(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// ownedBy gives s the controller's ownerReference to Service svc of its
// namespace, as the EndpointSlice controller writes it.
func ownedBy(s *discoveryv1.EndpointSlice, svc string) {
	yes := true
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc, UID: serviceUID(s.Namespace, svc), Controller: &yes}}
}

// serviceUID is the UID the harness gives a Service (the fake clientset
// sets none).
func serviceUID(ns, name string) types.UID { return types.UID("svc-" + ns + "-" + name) }

func (h *harness) putSlice(s *discoveryv1.EndpointSlice) {
	h.do(&h.d.events.slices, 1, func(ctx context.Context) error {
		api := h.client.DiscoveryV1().EndpointSlices(s.Namespace)
		if _, err := api.Get(ctx, s.Name, metav1.GetOptions{}); err == nil {
			_, err = api.Update(ctx, s, metav1.UpdateOptions{})
			return err
		}
		_, err := api.Create(ctx, s, metav1.CreateOptions{})
		return err
	})
}

func (h *harness) deleteSlice(ns, name string) {
	h.do(&h.d.events.slices, 1, func(ctx context.Context) error {
		return h.client.DiscoveryV1().EndpointSlices(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

func (h *harness) putPod(p *corev1.Pod) {
	h.do(&h.d.events.pods, 1, func(ctx context.Context) error {
		api := h.client.CoreV1().Pods(p.Namespace)
		if _, err := api.Get(ctx, p.Name, metav1.GetOptions{}); err == nil {
			_, err = api.Update(ctx, p, metav1.UpdateOptions{})
			return err
		}
		_, err := api.Create(ctx, p, metav1.CreateOptions{})
		return err
	})
}

func (h *harness) deletePod(ns, name string) {
	h.do(&h.d.events.pods, 1, func(ctx context.Context) error {
		return h.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{})
	})
}

// lease publishes a drain Lease as another node (or draind drain) would.
func (h *harness) lease(uid types.UID, ns, name, holder, reason string, dur time.Duration, ips ...string) {
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		l := &k8s.Leases{Client: h.client, Namespace: testNS}
		_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: ns, PodName: name, PodUID: uid, IPs: addrs,
			Node: holder, Reason: reason, Duration: dur}, h.clock.Now())
		return err
	})
}

func (h *harness) deleteLease(uid types.UID) {
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		return h.client.CoordinationV1().Leases(testNS).Delete(ctx, k8s.LeaseName(uid), metav1.DeleteOptions{})
	})
}

func (h *harness) rawLease(l *coordinationv1.Lease) {
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		_, err := h.client.CoordinationV1().Leases(testNS).Create(ctx, l, metav1.CreateOptions{})
		return err
	})
}

// --- object builders -----------------------------------------------------------

type svcOpt func(*corev1.Service)

func svc(name string, clusterIPs []string, ports []corev1.ServicePort, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIPs: clusterIPs, Ports: ports,
			Selector: map[string]string{"app": name}},
	}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP = clusterIPs[0]
	}
	for _, o := range opts {
		o(s)
	}
	s.UID = serviceUID(s.Namespace, s.Name) // as the API server would
	return s
}

func withAnnotation(v string) svcOpt {
	return func(s *corev1.Service) { s.Annotations = map[string]string{k8s.AnnotationPodIPSteering: v} }
}

func port(name string, p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: p, Protocol: proto}
}

type epSpec struct {
	ip                          string
	uid                         string
	ready, serving, terminating bool
	node                        string
}

func ready(ip, uid string) epSpec {
	return epSpec{ip: ip, uid: uid, ready: true, serving: true, node: testNode}
}
func terminating(ip, uid string) epSpec {
	return epSpec{ip: ip, uid: uid, serving: true, terminating: true, node: testNode}
}
func notReady(ip, uid string) epSpec   { return epSpec{ip: ip, uid: uid, node: testNode} }
func onNode(e epSpec, n string) epSpec { e.node = n; return e }

type slicePort struct {
	name  string
	port  int32
	proto corev1.Protocol
}

func slice(name, service string, fam discoveryv1.AddressType, ports []slicePort, eps ...epSpec) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: service,
			discoveryv1.LabelManagedBy: k8s.ManagedByController}},
		AddressType: fam,
	}
	ownedBy(s, service)
	for _, p := range ports {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: &p.name, Port: &p.port, Protocol: &p.proto})
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &e.serving, Terminating: &e.terminating},
			NodeName:   &e.node,
		}
		if e.uid != "" {
			ep.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "pod-" + e.uid, UID: types.UID(e.uid)}
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func pod(name, uid string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: testNode},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for i, ip := range ips {
		if i == 0 {
			p.Status.PodIP = ip
		}
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

// deletingPod is pod, its graceful deletion started at the harness's now.
func (h *harness) deletingPod(name, uid string, ips ...string) *corev1.Pod {
	p := pod(name, uid, ips...)
	now := metav1.NewTime(h.clock.Now())
	p.DeletionTimestamp = &now
	return p
}

func key(ap string, proto bpf.Protocol) bpf.EndpointKey {
	a := netip.MustParseAddrPort(ap)
	return bpf.EndpointKey{Addr: a.Addr(), Port: a.Port(), Proto: proto}
}

func wildcard(ip string, proto bpf.Protocol) bpf.EndpointKey {
	return bpf.EndpointKey{Addr: netip.MustParseAddr(ip), Proto: proto}
}

func aps(s ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(s))
	for i, x := range s {
		out[i] = netip.MustParseAddrPort(x)
	}
	return out
}

// describe renders the fake datapath for failure messages.
func (h *harness) describe() string {
	d, _ := h.dp.Dump()
	var b strings.Builder
	for _, f := range d.Frontends {
		fmt.Fprintf(&b, "frontend %v -> svc %d nosteer=%v\n", f.Key, f.Service, f.NoSteer)
	}
	for _, be := range d.Backends {
		fmt.Fprintf(&b, "backends %d: %v\n", be.Service, be.Backends)
	}
	for _, dr := range d.Drains {
		fmt.Fprintf(&b, "drain %v svc %d %v\n", dr.Key, dr.Service, dr.Policy)
	}
	return b.String()
}
