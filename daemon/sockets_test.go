package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

var (
	_ Datapath       = (*datapathtest.Datapath)(nil)
	_ SocketDatapath = (*datapathtest.Sockets)(nil)
)

// newSocketHarness is newHarness over a datapath with the socket hooks.
func newSocketHarness(t *testing.T, mod ...func(*Config)) (*harness, *datapathtest.Sockets) {
	t.Helper()
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	sd := datapathtest.NewSockets(clk.Now().Add(-time.Hour))
	h := &harness{t: t, client: fake.NewClientset(), dp: sd.Datapath, ct: conntracktest.New(), clock: clk}
	cfg := Config{Node: testNode, Namespace: testNS, Clock: h.clock, RegistryOnlyPolicy: bpf.PolicyRefuse,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, m := range mod {
		m(&cfg)
	}
	h.d = mustNew(t, cfg, h.client, sd, h.ct)
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
	h.d.synced.Store(true)
	h.d.SetAttached(true)
	return h, sd
}

// goneLease publishes a drain Lease that says the pod is gone, as the node
// hosting it does when its pod object disappears.
func (h *harness) goneLease(uid types.UID, name, holder string, ips ...string) {
	h.goneLeaseFor(uid, name, holder, time.Minute, ips...)
}

func withEndDead(v string) svcOpt {
	return func(s *corev1.Service) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k8s.AnnotationEndDeadConnections] = v
	}
}

// TestVanishedEndpointSteeredOnceGone: an endpoint that leaves its slice
// while ready (a force delete) is left alone until the node hosting its pod
// says the pod is gone; then the VIP is steered to the rest and the pod IP
// gets the Service's policy at once, and from the next pass it lingers as a
// departed endpoint. A ready endpoint that leaves without a gone Lease (a
// label change, a rebalance) is never steered.
func TestVanishedEndpointSteeredOnceGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"),
			ready("10.0.0.2", "b"), ready("10.0.0.3", "c")))
		h.pass()
		h.check(expect{})
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b"), ready("10.0.0.3", "c")))
		h.pass()
		h.check(expect{}) // no gone Lease: maybe a label change
		h.goneLease("a", "pod-a", "node-b", "10.0.0.1")
		h.pass()
		want := expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.2:8080", "10.0.0.3:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{
				key("10.0.0.1:8080", bpf.TCP): bpf.PolicyRewrite,
				// The pod drain's all-ports entries: listed by a rewrite
				// Service, the other ports pass while it is listed.
				wildcard("10.0.0.1", bpf.TCP): bpf.PolicyOff, wildcard("10.0.0.1", bpf.UDP): bpf.PolicyOff,
			}}
		h.check(want)
		// It drains as vanished: the Services that listed it are on record.
		if got := h.d.model.Gone().VanishedServices("a"); !slices.Equal(got, []string{"default/web"}) {
			t.Errorf("Services of the vanished pod: %v, want [default/web]", got)
		}
		// The next pass (asked for by the first) makes it a departure: it
		// lingers, the VIP stays steered; the pod's other ports are refused
		// now that no Service lists it (registry-only policy).
		h.pass()
		want.drains[wildcard("10.0.0.1", bpf.TCP)] = bpf.PolicyRefuse
		want.drains[wildcard("10.0.0.1", bpf.UDP)] = bpf.PolicyRefuse
		h.check(want)
		// The Services that listed it are remembered (their opt-out of ending
		// sockets) as long as it lingers, and forgotten in the pass at its
		// end, which the model asks for.
		if got := h.d.model.Gone().VanishedServices("a"); !slices.Equal(got, []string{"default/web"}) {
			t.Errorf("Services of the vanished pod: %v, want [default/web]", got)
		}
		end := h.d.model.NextDeadline()
		if want := h.clock.Now().Add(h.d.cfg.Linger); end.After(want) {
			t.Errorf("next deadline %v, after the linger's end %v", end, want)
		}
		// It lingers: steered until Linger after its departure, not after.
		k := key("10.0.0.1:8080", bpf.TCP)
		h.clock.Step(h.d.cfg.Linger - time.Second)
		h.pass()
		if !slices.Contains(h.dp.DrainKeys(), k) {
			t.Errorf("vanished endpoint not steered before its linger's end: drains %v", h.dp.DrainKeys())
		}
		h.clock.Step(time.Second)
		h.pass()
		if slices.Contains(h.dp.DrainKeys(), k) {
			t.Errorf("vanished endpoint still steered after its linger's end")
		}
		if got := h.d.model.Gone().VanishedServices("a"); len(got) != 0 {
			t.Errorf("Services of the vanished pod still remembered after its linger: %v", got)
		}
	})
}

// TestVanishedCandidateExpires: without a gone Lease within model.VanishWait the
// candidate is dropped; a gone Lease after that steers nothing by the
// Service (only the pod drain's own all-ports entries remain).
func TestVanishedCandidateExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")))
		h.pass()
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
		h.pass()
		h.clock.Step(model.VanishWait + time.Second)
		h.pass()
		h.goneLease("a", "pod-a", "node-b", "10.0.0.1")
		h.pass()
		h.check(expect{drains: map[bpf.EndpointKey]bpf.Policy{
			wildcard("10.0.0.1", bpf.TCP): bpf.PolicyRefuse, wildcard("10.0.0.1", bpf.UDP): bpf.PolicyRefuse}})
	})
}

// TestGonePeersFollowGoneLeases: a pod its hosting node says is gone is
// listed as a gone peer (every IP, stamped with the instant this node
// learned it); an IP another pod claims is unlisted at once; a Service
// that opts out (draind.io/end-dead-connections: "false") keeps its pods'
// clients alone, and the most cautious Service wins.
func TestGonePeersFollowGoneLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.addService(svc("opt", []string{"10.96.0.20"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, withEndDead("false")))
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.putSlice(slice("web-2", "web", v6, httpPorts(8080), onNode(ready("fd00::1", "a"), "node-b")))
		h.putSlice(slice("opt-1", "opt", v4, httpPorts(8080), onNode(ready("10.0.0.5", "e"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		if got := sd.GonePeers(); len(got) != 0 {
			t.Fatalf("gone peers with nothing gone: %v", got)
		}
		// A draining pod is not gone.
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1", "fd00::1")
		h.pass()
		if got := sd.GonePeers(); len(got) != 0 {
			t.Fatalf("gone peers while the pod only drains: %v", got)
		}
		learned := h.clock.Now().Add(time.Second)
		h.clock.SetTime(learned)
		h.goneLeaseUpdate("a", "10.0.0.1", "fd00::1")
		h.pass()
		if got := sd.GonePeers(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")}) {
			t.Fatalf("gone peers: %v", got)
		}
		if p, _ := sd.Peer("10.0.0.1"); !p.GoneAt.Equal(learned) || p.Expires.After(learned.Add(time.Minute)) {
			t.Errorf("gone peer %+v: want gone at %v, expiring with its Lease", p, learned)
		}
		// Refreshes keep the instant it went.
		h.clock.Step(45 * time.Second)
		h.pass()
		if p, _ := sd.Peer("10.0.0.1"); !p.GoneAt.Equal(learned) {
			t.Errorf("gone peer's instant moved on refresh: %+v", p)
		}
		// A new pod claims the IPv4 address: unlisted at once.
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "new"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		if got := sd.GonePeers(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("fd00::1")}) {
			t.Errorf("after the IP was claimed: %v", got)
		}
		// A pod of the opting-out Service (it vanished, listed by it) is never
		// listed, even though its Lease says gone.
		h.putSlice(slice("opt-1", "opt", v4, httpPorts(8080), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		h.goneLease("e", "pod-e", "node-b", "10.0.0.5")
		h.pass()
		h.pass()
		if !goneDrain(h, "e") {
			t.Fatal("the gone Lease of a pod listed on its holder until it vanished is not believed")
		}
		if _, ok := sd.Peer("10.0.0.5"); ok {
			t.Errorf("a pod of a Service with %s=false was listed gone", k8s.AnnotationEndDeadConnections)
		}
		// Pod b is in both Services: the opt-out wins.
		h.goneLease("b", "pod-b", "node-b", "10.0.0.2")
		h.pass()
		if !goneDrain(h, "b") {
			t.Fatal("the gone Lease of pod b is not believed")
		}
		if _, ok := sd.Peer("10.0.0.2"); ok {
			t.Error("a pod listed by an opting-out Service and another was listed gone (most cautious must win)")
		}
		// The Lease goes (its linger ended): unlisted.
		h.deleteLease("a")
		h.pass()
		if got := sd.GonePeers(); len(got) != 0 {
			t.Errorf("after the Lease went: %v", got)
		}
	})
}

// TestGonePeersRememberAServiceThatListedTheDrainingPod: a Service that
// listed a pod only while it drained (its Lease came first, its listing
// ended before it went) still decides for it once it is gone: the pod of a
// Service that opts out is not listed gone.
func TestGonePeersRememberAServiceThatListedTheDrainingPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(svc("opt", []string{"10.96.0.20"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, withEndDead("false")))
		h.podElsewhere("pod-e", "e", "node-b", "10.0.0.5")
		h.lease("e", "default", "pod-e", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.5")
		h.tick(0) // the Lease checked against its Pod
		h.pass()
		if len(ipSteered(h, "10.0.0.5")) == 0 {
			t.Fatalf("the registry-only Lease is not honoured:\n%s", h.describe())
		}
		h.putSlice(slice("opt-1", "opt", v4, httpPorts(8080), onNode(ready("10.0.0.5", "e"), "node-b")))
		h.pass()
		h.putSlice(slice("opt-1", "opt", v4, httpPorts(8080)))
		h.pass()
		h.goneLeaseUpdate("e", "10.0.0.5")
		h.pass()
		if !goneDrain(h, "e") {
			t.Fatal("the gone Lease is not believed")
		}
		if _, ok := sd.Peer("10.0.0.5"); ok {
			t.Errorf("a pod that a Service with %s=false listed while it drained was listed gone", k8s.AnnotationEndDeadConnections)
		}
	})
}

// TestGoneViewLingeringPods: the gone peers' view of a pod whose drain
// ended (its Lease expired) says it lingers while its departed endpoint
// does, and no longer when the linger ends, with nothing else changing
// (package gonepeers keeps the pod's Services so long:
// TestServicesKeptWhileLingering).
func TestGoneViewLingeringPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := newSocketHarness(t, func(c *Config) { c.Linger = time.Minute })
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, 20*time.Second, "10.0.0.1")
		h.pass()
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		h.clock.Step(21 * time.Second) // the Lease expired, the departure lingers
		h.pass()
		if _, drains := h.d.model.Gone().PodDrain("a"); drains {
			t.Fatal("the expired Lease still drains")
		}
		v := h.d.model.Gone()
		if _, drains := v.PodDrain("a"); drains || !v.Lingering("a") {
			t.Fatalf("a departed pod whose endpoint lingers: drains %v, lingers %v:\n%s", drains, v.Lingering("a"), h.describe())
		}
		h.clock.Step(time.Minute)
		h.pass()
		if v.Lingering("a") {
			t.Errorf("pod a lingers after its linger ended:\n%s", h.describe())
		}
	})
}

// goneLeaseUpdate renews a pod's Lease with state gone, as its hosting node
// does when the pod object disappears.
func (h *harness) goneLeaseUpdate(uid types.UID, ips ...string) {
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		l := &k8s.Leases{Client: h.client, Namespace: testNS}
		_, err := l.Renew(ctx, k8s.LeaseName(uid), time.Minute, h.clock.Now(), map[string]string{k8s.AnnState: StateGone})
		return err
	})
}

// TestVanishedLocalPodPublishesGone: a pod on this node that disappears
// without a drain (a force delete) gets a drain Lease that says gone from
// its first write, and its IPs become gone peers here.
func TestVanishedLocalPodPublishesGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
		h.putPod(pod("pod-p0", "p0", "10.0.0.1"))
		h.pass()
		h.d.hosted.Reconcile(h.ctx)
		h.deletePod("default", "pod-p0")
		h.pass()
		h.d.hosted.Reconcile(h.ctx)
		flush(h)
		h.waitLeases(1)
		l := h.d.state.DrainLeases()[0]
		if l.State != StateGone || l.Reason != model.ReasonVanished || l.PodUID != "p0" {
			t.Fatalf("lease of the vanished pod: %+v", l)
		}
		h.pass()
		if _, ok := sd.Peer("10.0.0.1"); !ok {
			t.Errorf("the vanished local pod is no gone peer: %v", sd.GonePeers())
		}
	})
}

// flush runs the Lease writer once.
func flush(h *harness) { h.d.leaseWriter.Flush(h.ctx) }

// TestGoneFlowsFromConntrack: client flows this node translated from a VIP
// to the gone pod are listed gone (the socket knows only the VIP); a flow
// to the pod IP itself is covered by the peer entry, and a flow younger
// than the departure belongs to whoever holds the IP now.
func TestGoneFlowsFromConntrack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		now := h.clock.Now()
		vip := netip.MustParseAddrPort("10.96.0.10:80")
		pod := netip.MustParseAddrPort("10.0.0.1:8080")
		flow := func(src string, dst netip.AddrPort, start time.Time) conntrack.Flow {
			s := netip.MustParseAddrPort(src)
			return conntrack.Flow{Proto: conntrack.TCP, Orig: conntrack.Tuple{Src: s, Dst: dst},
				Reply: conntrack.Tuple{Src: pod, Dst: s}, Start: start, State: conntrack.TCPEstablished}
		}
		h.ct.AddFlow(flow("10.0.1.5:40000", vip, now.Add(-time.Minute)), flow("10.0.1.5:40001", pod, now.Add(-time.Minute)),
			flow("10.0.1.6:40002", vip, now.Add(time.Minute)))
		h.d.gone.Start(h.ctx)
		t.Cleanup(h.d.gone.Stop)
		// The pod was listed on node-b (whose Lease is believed only so), and
		// left its slice before its node said it is gone.
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b")))
		h.pass()
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080)))
		h.pass()
		h.goneLease("a", "pod-a", "node-b", "10.0.0.1")
		h.pass()
		synctest.Wait() // the flow lister's goroutine lists
		if len(sd.Flows()) != 1 || !sd.HasFlow(netip.MustParseAddrPort("10.0.1.5:40000"), vip) {
			t.Errorf("listed flows %v, want the VIP flow of 10.0.1.5:40000", sd.Flows())
		}
		h.deleteLease("a")
		h.pass()
		synctest.Wait()
		if got := sd.Flows(); len(got) != 0 {
			t.Errorf("flows %v listed after their peer ended", got)
		}
	})
}

// TestOfflineWaitsForSocketsWithoutConntrack: with an empty conntrack table
// (a CNI that bypasses it) the offline call waits while the pod's sockets
// say a connection is open, answers once it closes, and says the count
// came from its sockets.
func TestOfflineWaitsForSocketsWithoutConntrack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
		p := pod("pod-p0", "p0", "10.0.0.1")
		p.CreationTimestamp = metav1.NewTime(h.clock.Now().Add(-time.Minute)) // after counting started
		h.putPod(p)
		h.pass()
		sd.SetLive(podIP, 1)
		call := h.offline(podIP, time.Minute, time.Second)
		h.pass()
		h.clock.Step(3 * time.Second)
		h.d.hosted.Reconcile(h.ctx)
		if r, done := call.answered(t); done {
			t.Fatalf("answered while the pod's socket count says 1 (conntrack 0): %+v", r)
		}
		sd.SetLive(podIP, 0)
		h.clock.Step(time.Second)
		h.d.hosted.Reconcile(h.ctx)
		r, done := call.result(t)
		if !done || !r.Drained || r.LiveSource != LiveFromSockets || r.LiveSockets == nil || *r.LiveSockets != 0 ||
			r.LiveConntrack == nil || *r.LiveConntrack != 0 || r.LiveSocketsPartial {
			t.Fatalf("after the connection closed: done %v %+v", done, r)
		}
	})
}

func since(t *testing.T, sd *datapathtest.Sockets) time.Time {
	t.Helper()
	at, err := sd.CountingSince()
	if err != nil {
		t.Fatal(err)
	}
	return at
}

// TestSocketStatus: status says what the socket hooks do on the node.
func TestSocketStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.pass()
		must(t, sd.UpsertGonePeer(bpf.GonePeer{Addr: netip.MustParseAddr("10.0.0.9"), GoneAt: h.clock.Now()}))
		st := h.d.Status(StatusSource{Features: bpf.Features{Sockets: true, UserTimeoutFromBPF: true, SocketIterators: "not loadable: needs CAP_PERFMON"}})
		s := st.Sockets
		if !s.Loaded || !s.EndTCP || !s.EndUDP || !slices.Equal(s.LiveFrom, []string{LiveFromSockets, LiveFromConntrack}) ||
			s.GonePeers != 1 || !s.CountingSince.Equal(since(t, sd)) || s.Iterators == "" || len(s.Events) != bpf.NumSocketEvents {
			t.Errorf("socket status %+v", s)
		}
		// A figure that cannot be read is a warning, not a 0 read as "none".
		sd.SetReadErr(errors.New("map unreadable"))
		st = h.d.Status(StatusSource{Features: bpf.Features{Sockets: true, UserTimeoutFromBPF: true}})
		sd.SetReadErr(nil)
		var unread []string
		for _, w := range st.Warnings {
			if strings.Contains(w, "map unreadable") {
				unread = append(unread, w)
			}
		}
		if len(unread) != 3 || st.Health != HealthDegraded || len(st.Sockets.Events) != 0 {
			t.Errorf("with the socket maps unreadable: health %s, warnings %q, events %v", st.Health, st.Warnings, st.Sockets.Events)
		}
		// Without the hooks: said, and no warning of its own.
		h2 := newHarness(t)
		h2.pass()
		st = h2.d.Status(StatusSource{Features: bpf.Features{SocketsMissing: "sock_ops programs"}})
		if st.Sockets.Loaded || !strings.Contains(st.Sockets.Reason, "sock_ops programs") || !slices.Equal(st.Sockets.LiveFrom, []string{LiveFromConntrack}) {
			t.Errorf("socket status without hooks %+v", st.Sockets)
		}
		for _, w := range st.Warnings {
			if strings.Contains(w, "socket") {
				t.Errorf("warning %q", w)
			}
		}
	})
}

// TestKilledWithoutGraceIsGone: a local pod deleted with a grace period of
// 0 is killed at once: it is gone (its clients' sockets end) as soon as its
// deletion is seen, before its object disappears.
func TestKilledWithoutGraceIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
		p := pod("pod-p0", "p0", "10.0.0.1")
		h.putPod(p)
		h.pass()
		// A graceful deletion is not gone.
		grace := int64(30)
		now := metav1.NewTime(h.clock.Now())
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &now, &grace
		h.putPod(p)
		h.pass()
		if got := sd.GonePeers(); len(got) != 0 {
			t.Fatalf("a graceful deletion made the pod gone: %v", got)
		}
		zero := int64(0)
		p.DeletionGracePeriodSeconds = &zero
		h.putPod(p)
		h.pass()
		if _, ok := sd.Peer("10.0.0.1"); !ok {
			t.Fatalf("a pod killed without grace is no gone peer: %v", sd.GonePeers())
		}
		h.d.hosted.Reconcile(h.ctx)
		flush(h)
		h.waitLeases(1)
		if ls := h.passLeases(); ls[0].State != StateGone {
			t.Errorf("the pod's Lease says %s, want %s", ls[0].State, StateGone)
		}
	})
}

// TestGoneLeaseBelievedOnlyFromTheDepartedHost: a pod that left its slice
// (deleted without grace) is remembered with the node that hosted it, so
// that node's gone Lease is believed; the same Lease held by another node
// is not, nor is it once the memory ends (linger + Lease duration).
func TestGoneLeaseBelievedOnlyFromTheDepartedHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"),
			onNode(ready("10.0.0.3", "c"), "node-b"), ready("10.0.0.2", "b")))
		h.pass()
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
		h.pass()
		h.goneLease("a", "pod-a", "node-c", "10.0.0.1") // not its host
		h.pass()
		if goneDrain(h, "a") {
			t.Error("a gone Lease from a node that never hosted the pod was believed")
		}
		h.goneLease("c", "pod-c", "node-b", "10.0.0.3")
		h.pass()
		if !goneDrain(h, "c") {
			t.Error("the gone Lease of the pod's own host was not believed")
		}
		if node, ok, _ := h.d.claims.HostOf(netip.MustParseAddr("10.0.0.3"), "c"); !ok || node != "node-b" {
			t.Errorf("host of the departed pod: %q %v", node, ok)
		}
		h.clock.Step(h.d.cfg.Linger + h.d.cfg.LeaseDuration)
		if _, ok, _ := h.d.claims.HostOf(netip.MustParseAddr("10.0.0.3"), "c"); ok {
			t.Error("a departed host is remembered past linger + Lease duration")
		}
	})
}

// TestFinishedLocalPodNeverVanishes: a pod that finished (its IPs released
// when it did) and whose object is removed later is no vanished pod: no
// gone drain, so no node ends connections to an IP another pod may hold.
func TestFinishedLocalPodNeverVanishes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, _ := newSocketHarness(t)
		p := pod("pod-f", "f", "10.0.0.8")
		p.Status.Phase = corev1.PodSucceeded
		h.putPod(p)
		h.pass()
		h.d.hosted.Reconcile(h.ctx)
		h.deletePod("default", "pod-f")
		h.pass()
		h.d.hosted.Reconcile(h.ctx)
		if ld, ok := h.d.hosted.Progress()["f"]; ok {
			t.Errorf("a finished pod removed later got a drain: state %s", ld.State)
		}
		if h.d.claims.ClaimedByOther(netip.MustParseAddr("10.0.0.8"), "") {
			t.Error("a finished pod claims the IP it released")
		}
	})
}

// TestGoneEntriesAdoptedAfterRestart: a restarted draind deletes the gone
// flows a previous one left (nothing else would: they have no peer on
// record) and lists its adopted peers' flows again in its first pass.
func TestGoneEntriesAdoptedAfterRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		now := h.clock.Now()
		vip := netip.MustParseAddrPort("10.96.0.10:80")
		pod := netip.MustParseAddrPort("10.0.0.1:8080")
		stale := bpf.GoneFlow{Local: netip.MustParseAddrPort("10.0.1.9:1234"), Remote: vip, GoneAt: now.Add(-time.Minute), Expires: now.Add(time.Minute)}
		sd.UpsertGoneFlow(stale)
		sd.UpsertGonePeer(bpf.GonePeer{Addr: pod.Addr(), GoneAt: now.Add(-time.Minute), Expires: now.Add(time.Minute)})
		client := netip.MustParseAddrPort("10.0.1.5:40000")
		h.ct.AddFlow(conntrack.Flow{Proto: conntrack.TCP, Orig: conntrack.Tuple{Src: client, Dst: vip},
			Reply: conntrack.Tuple{Src: pod, Dst: client}, Start: now.Add(-2 * time.Minute), State: conntrack.TCPEstablished})
		h.d.gone.Start(h.ctx)
		t.Cleanup(h.d.gone.Stop)
		// What the restarted draind's informers list before its first pass:
		// the pod left its slice on node-b, which says it is gone.
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b")))
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080)))
		h.goneLease("a", "pod-a", "node-b", "10.0.0.1")
		if err := h.d.gone.Adopt(); err != nil {
			t.Fatal(err)
		}
		if left := len(sd.Flows()); left != 0 {
			t.Fatalf("adopted gone flows kept: %d", left)
		}
		h.pass()
		synctest.Wait() // the flow lister's goroutine lists
		if !sd.HasFlow(client, vip) {
			t.Fatalf("the adopted peer's VIP flow is not listed again: %v", sd.Flows())
		}
		if p, _ := sd.Peer("10.0.0.1"); !p.GoneAt.Equal(now.Add(-time.Minute)) {
			t.Errorf("the adopted peer's instant moved: %+v", p)
		}
	})
}

// TestGonePeersComputedAgainOnWhatTheyDependOn: a pass with nothing new
// for the gone peers leaves them alone (a rollout's gone pods would
// otherwise cost a claims check per IP on every pass), so everything they
// depend on must make a pass compute them again: an entry's refresh (half
// its TTL), a write that failed, a Service's opt-out, a pod of this node
// taking the gone pod's IP.
func TestGonePeersComputedAgainOnWhatTheyDependOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
			l := &k8s.Leases{Client: h.client, Namespace: testNS}
			_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: "default", PodName: "pod-a", PodUID: "a",
				IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Node: "node-b", Reason: model.ReasonVanished,
				Duration: 10 * time.Minute, State: StateGone}, h.clock.Now())
			return err
		})
		// Its first listing fails; the next pass, with nothing new, lists it.
		sd.SetUpsertErr(errors.New("injected: gone peer map full"))
		h.pass()
		sd.SetUpsertErr(nil)
		h.pass()
		first, ok := sd.Peer("10.0.0.1")
		if !ok {
			t.Fatal("the gone pod is not listed after its first listing failed")
		}
		ops := sd.PeerOps
		before := ops()
		h.pass()
		h.pass()
		if n := ops() - before; n != 0 {
			t.Errorf("passes with nothing new wrote %d gone-peer entries", n)
		}
		// Half the TTL later the entry is written again, lasting longer.
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		h.pass()
		refreshed, _ := sd.Peer("10.0.0.1")
		if !refreshed.Expires.After(first.Expires) || !refreshed.GoneAt.Equal(first.GoneAt) {
			t.Errorf("after half the TTL: %+v, want a later end than %v, gone at %v", refreshed, first.Expires, first.GoneAt)
		}
		// The next refresh fails; the pass after it, with nothing else new,
		// writes it.
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		sd.SetUpsertErr(errors.New("injected: gone peer map full"))
		h.pass()
		sd.SetUpsertErr(nil)
		h.pass()
		if p, _ := sd.Peer("10.0.0.1"); !p.Expires.After(refreshed.Expires) {
			t.Errorf("a refresh that failed was not retried: %+v", p)
		}
		// The Service opts out: unlisted; opts in again: listed.
		for _, v := range []string{"false", "true"} {
			h.do(&h.d.events.services, 1, func(ctx context.Context) error {
				_, err := h.client.CoreV1().Services("default").Update(ctx, webService(withEndDead(v)), metav1.UpdateOptions{})
				return err
			})
			h.pass()
			if _, listed := sd.Peer("10.0.0.1"); listed != (v == "true") {
				t.Errorf("%s=%s: listed %v", k8s.AnnotationEndDeadConnections, v, listed)
			}
		}
		// A pod of this node takes the IP (no slice lists it yet): unlisted.
		h.putPod(pod("pod-new", "new", "10.0.0.1"))
		h.pass()
		if _, listed := sd.Peer("10.0.0.1"); listed {
			t.Error("the gone pod's IP, now a pod of this node's, is still listed gone")
		}
	})
}

// TestGonePeerBoundedByItsLeaseNotRewritten: an entry that ends with its
// pod drain (a Lease shorter than the entry TTL) cannot be made to last
// longer: passes that compute the gone peers again (here a Service noted
// for the pod changes) do not write it again once half its TTL passed.
func TestGonePeerBoundedByItsLeaseNotRewritten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		h.goneLease("a", "pod-a", "node-b", "10.0.0.1") // a minute: the entry's TTL
		h.pass()
		listed, ok := sd.Peer("10.0.0.1")
		if !ok {
			t.Fatal("the gone pod is not listed")
		}
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		ops := sd.PeerOps
		before := ops()
		for _, v := range []string{"true", ""} {
			h.do(&h.d.events.services, 1, func(ctx context.Context) error {
				_, err := h.client.CoreV1().Services("default").Update(ctx, webService(withEndDead(v)), metav1.UpdateOptions{})
				return err
			})
			h.pass()
		}
		if n := ops() - before; n != 0 {
			t.Errorf("%d gone-peer writes of an entry that cannot last longer", n)
		}
		if p, ok := sd.Peer("10.0.0.1"); !ok || p != listed {
			t.Errorf("entry %+v (listed %v), want it unchanged: %+v", p, ok, listed)
		}
	})
}

// goneDrain reports whether the model has a pod drain of uid that says
// the pod is gone, as the gone peers read it.
func goneDrain(h *harness, uid types.UID) bool {
	d, ok := h.d.model.Gone().PodDrain(uid)
	return ok && d.Gone
}
