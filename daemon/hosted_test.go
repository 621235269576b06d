package daemon

import (
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// localFixture: pod web-0 (10.0.0.1) on this node behind Service web with
// a second, ready pod web-1 elsewhere.
func localFixture(t *testing.T, mod ...func(*Config)) *harness {
	h := newHarness(t, mod...)
	h.addService(webService())
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
	h.putPod(pod("pod-p0", "p0", "10.0.0.1"))
	h.pass()
	return h
}

var podIP = netip.MustParseAddr("10.0.0.1")

type offlineCall struct {
	done chan OfflineResult
}

// offline calls the offline API's logic (Daemon.Offline) as the pod at ip
// would and waits until the call is registered (lease visible, waiter
// queued). It runs in a synctest bubble: once every goroutine of the
// bubble is blocked, a call with a wait that has not answered is blocked
// on its wait, queued.
func (h *harness) offline(ip netip.Addr, wait, quiet time.Duration) *offlineCall {
	h.t.Helper()
	if h.realTime {
		h.t.Fatal("harness.offline needs a synctest bubble")
	}
	c := &offlineCall{done: make(chan OfflineResult, 1)}
	go func() { c.done <- h.d.Offline(h.ctx, ip, wait, quiet) }()
	answered := false
	h.await("the offline call to register", func() bool {
		select {
		case r := <-c.done: // answered at once (403, no wait, ...)
			c.done <- r
			answered = true
			return true
		default:
		}
		return wait > 0
	})
	if !answered {
		h.await("a drain Lease in the cache", func() bool { return len(h.passLeases()) > 0 })
	}
	return c
}

// result waits for the answer the call must get (10 s at most).
func (c *offlineCall) result(t *testing.T) (OfflineResult, bool) {
	return c.within(10 * time.Second)
}

// answered reports an answer given within 100 ms: the test expects none.
func (c *offlineCall) answered(t *testing.T) (OfflineResult, bool) {
	return c.within(100 * time.Millisecond)
}

func (c *offlineCall) within(d time.Duration) (OfflineResult, bool) {
	select {
	case r := <-c.done:
		return r, true
	case <-time.After(d):
		return OfflineResult{}, false
	}
}

// hostedDrain returns this node's drain of pod uid as the model takes it
// (hosted.Drains.EachPodDrain; nil: none, or cancelled).
func (h *harness) hostedDrain(uid types.UID) *model.PodDrain {
	var out *model.PodDrain
	h.d.hosted.EachPodDrain(func(pd *model.PodDrain) {
		if pd.UID == uid {
			c := *pd
			out = &c
		}
	})
	return out
}

// waitLeases waits until passes see n drain Leases.
func (h *harness) waitLeases(n int) {
	h.t.Helper()
	h.await(fmt.Sprintf("%d drain leases in the cache", n), func() bool { return len(h.passLeases()) == n })
}

// passLeases is the drain Leases as passes read them: the snapshot the
// Lease handler took, which follows the informer's cache by a handler
// call. A test that waits for the cache must wait for it.
func (h *harness) passLeases() []*k8s.DrainLease { return h.d.drainLeasesNow().list }

// tick advances the fake clock and runs a model pass and a local pass,
// then lets the informers catch up with the Lease writes it made (a real
// informer lags by milliseconds, not by the seconds a tick jumps).
func (h *harness) tick(d time.Duration) {
	h.clock.Step(d)
	h.pass()
	h.d.hosted.Reconcile(h.ctx)
	h.d.leaseWriter.Flush(h.ctx)
	h.d.leaseTrust.Flush(h.ctx)
	h.syncLeases()
}

// syncLeases waits until the Lease cache, as passes read it, matches the
// API.
func (h *harness) syncLeases() {
	h.t.Helper()
	h.await("the Lease cache to match the API", func() bool {
		l, err := h.client.CoordinationV1().Leases(testNS).List(h.ctx, metav1.ListOptions{})
		if err != nil {
			return false // an outage the test simulates: nothing to match
		}
		have := map[string]time.Time{}
		for _, x := range append(h.passLeases(), h.d.drainLeasesNow().claims...) {
			have[x.Name] = x.Renewed
		}
		if len(l.Items) != len(have) {
			return false
		}
		for _, x := range l.Items {
			if x.Spec.RenewTime == nil || !have[x.Name].Equal(x.Spec.RenewTime.Time) {
				return false
			}
		}
		return true
	})
}

func (h *harness) setSYNs(n uint64) {
	k := key("10.0.0.1:8080", bpf.TCP)
	st, _ := h.dp.DrainStats(k)
	st.SYNs = n
	st.LastSYN = h.clock.Now()
	h.dp.SetStats(k, st)
}

func (h *harness) openConn() {
	h.ct.AddFlow(conntrack.Flow{Proto: conntrack.TCP, State: conntrack.TCPEstablished,
		Orig:  conntrack.Tuple{Src: netip.MustParseAddrPort("10.0.0.9:40000"), Dst: netip.MustParseAddrPort("10.96.0.10:80")},
		Reply: conntrack.Tuple{Src: netip.MustParseAddrPort("10.0.0.1:8080"), Dst: netip.MustParseAddrPort("10.0.0.9:40000")}})
}

func (h *harness) closeConns() {
	h.ct.Expire(h.ctx, []conntrack.Filter{{Proto: conntrack.TCP, ReplySrc: netip.AddrPortFrom(podIP, 0)}})
}

// events returns the Events with reason recorded so far (they are sent
// asynchronously; wait for at least min).
func (h *harness) events(reason string, min int) []corev1.Event {
	h.t.Helper()
	var out []corev1.Event
	list := func() bool {
		out = nil
		l, _ := h.client.CoreV1().Events("default").List(h.ctx, metav1.ListOptions{})
		for _, e := range l.Items {
			if e.Reason == reason {
				out = append(out, e)
			}
		}
		return len(out) >= min
	}
	h.holds(list) // fewer than min: the caller's assertion says so
	return out
}

func TestOfflineReturnsWhenDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		call := h.offline(podIP, 30*time.Second, 2*time.Second)
		h.tick(0)
		// The Lease drains the pod everywhere: this node's map says so too.
		if dr, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]; !ok || dr.Policy != bpf.PolicyRewrite {
			t.Fatalf("pod not drained after its offline call:\n%s", h.describe())
		}
		h.setSYNs(3) // stale callers still arrive for a moment
		h.openConn() // and one request is in flight
		h.tick(time.Second)
		h.setSYNs(5)
		h.tick(time.Second)
		h.tick(3 * time.Second)
		if r, ok := call.answered(t); ok {
			t.Fatalf("answered %+v while a connection is live", r)
		}
		h.closeConns() // the in-flight request finished
		h.tick(200 * time.Millisecond)
		r, ok := call.result(t)
		if !ok || r.Code != 200 || !r.Drained || r.State != StateDrained || r.SYNs != 5 || r.LiveConnections != 0 {
			t.Fatalf("want 200 drained with 5 SYNs, got %+v (answered %v)", r, ok)
		}
		if r.WaitedSeconds < 5 || r.WaitedSeconds > 6 {
			t.Errorf("waited %.1fs, want ≈5.2s", r.WaitedSeconds)
		}
		if n := len(h.events(hosted.EventDrainStarted, 1)); n != 1 {
			t.Errorf("%d DrainStarted events, want 1", n)
		}
		if n := len(h.events(hosted.EventDrained, 1)); n != 1 {
			t.Errorf("%d Drained events, want 1", n)
		}
		// Still drained afterwards: steering goes on until the pod is gone.
		for i := 0; i < 12; i++ {
			h.tick(5 * time.Second)
		}
		if _, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]; !ok {
			t.Error("steering stopped after the pod was drained, before it was deleted")
		}
	})
}

func TestOfflineTimesOutWithLiveConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		h.openConn()
		call := h.offline(podIP, 10*time.Second, 2*time.Second)
		h.tick(0)
		for i := 0; i < 9; i++ {
			h.tick(time.Second)
		}
		if r, ok := call.answered(t); ok {
			t.Fatalf("answered early: %+v", r)
		}
		h.tick(time.Second)
		r, ok := call.result(t)
		if !ok || r.Code != 504 || r.Drained || r.State != StateTimedOut || r.LiveConnections != 1 {
			t.Fatalf("want 504 timed-out with live_connections 1, got %+v (answered %v)", r, ok)
		}
		if ev := h.events(hosted.EventDrainTimedOut, 1); len(ev) != 1 || ev[0].Type != corev1.EventTypeWarning {
			t.Errorf("DrainTimedOut events: %+v", ev)
		}
	})
}

func TestOfflineBeforeReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The inverted timeline: offline is called before the app is even
		// listed (registered); it must not be undone when it turns ready.
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.2", "p1"), "node-b")))
		h.putPod(pod("pod-p0", "p0", "10.0.0.1"))
		h.pass()
		call := h.offline(podIP, 0, 0)
		if r, _ := call.result(t); r.Code != 200 || r.State != StateDraining {
			t.Fatalf("offline without wait: %+v", r)
		}
		h.waitLeases(1)
		h.tick(0)
		// No slice lists it: a registry-only drain, refused outright.
		if dr := h.dp.Drains[wildcard("10.0.0.1", bpf.TCP)]; dr.Policy != bpf.PolicyRefuse {
			t.Fatalf("registry-only drain not refused:\n%s", h.describe())
		}
		// Now it registers and turns ready: still draining.
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
		h.tick(time.Second)
		h.check(expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.2:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyRewrite,
				wildcard("10.0.0.1", bpf.TCP): bpf.PolicyOff, wildcard("10.0.0.1", bpf.UDP): bpf.PolicyOff}})
		if ps := h.d.PodStatuses(); len(ps) != 1 || ps[0].State != StateDraining || !ps[0].Local || ps[0].Reason != k8s.ReasonOffline {
			t.Errorf("status: %+v", ps)
		}
	})
}

func TestConcurrentOfflineCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		a := h.offline(podIP, 30*time.Second, 2*time.Second)
		b := h.offline(podIP, 30*time.Second, 2*time.Second)
		h.tick(0)
		h.tick(3 * time.Second)
		for _, c := range []*offlineCall{a, b} {
			if r, ok := c.result(t); !ok || r.Code != 200 || !r.Drained {
				t.Errorf("call: %+v answered=%v", r, ok)
			}
		}
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Errorf("%d leases for one pod", n)
		}
		if n := len(h.events(hosted.EventDrainStarted, 1)); n != 1 {
			t.Errorf("%d DrainStarted events for one drain", n)
		}
	})
}

func TestOfflineFromForeignCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		hostNet := pod("host-agent", "h0", "10.0.0.50")
		hostNet.Spec.HostNetwork = true
		h.putPod(hostNet)
		for _, ip := range []string{"10.0.0.2" /* a pod on another node */, "10.0.0.50" /* host network */, "192.0.2.1"} {
			call := h.offline(netip.MustParseAddr(ip), 30*time.Second, 0)
			r, ok := call.result(t)
			if !ok || r.Code != 403 {
				t.Errorf("caller %s: want 403 at once, got %+v", ip, r)
			}
		}
		if n := len(h.d.state.DrainLeases()); n != 0 {
			t.Errorf("a foreign caller created %d leases", n)
		}
	})
}

// TestLeaseExpiryWhileWaiting: the API stops accepting renewals and the
// drain Lease runs out while the pod waits for its offline answer.
func TestLeaseExpiryWhileWaiting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t, func(c *Config) { c.LeaseDuration = 30 * time.Second })
		call := h.offline(podIP, 5*time.Minute, 2*time.Second)
		h.openConn()
		h.tick(0)
		// The API stops accepting renewals; the Lease runs out.
		h.failLeaseUpdate.Store(true)
		for i := 0; i < 3; i++ {
			h.tick(11 * time.Second)
		}
		// Other nodes fail open once the Lease expired
		// (TestFaultAPIOutageRemoteNode); the node hosting the pod keeps its
		// drain and the waiter (it neither answers 409 cancelled nor stops
		// steering here).
		if r, ok := call.answered(t); ok {
			t.Fatalf("the waiter was answered when the Lease expired: %+v", r)
		}
		h.pass()
		if _, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]; !ok {
			t.Fatalf("the hosting node stopped steering when its Lease expired:\n%s", h.describe())
		}
		if got := testutilValue(t, h.d.Metrics.LeaseOps.WithLabelValues("renew", "error")); got < 1 {
			t.Errorf("failed renewals not counted: %v", got)
		}
		// Renewals land again: the Lease is live for every node.
		h.failLeaseUpdate.Store(false)
		h.tick(lease.RetryMax)
		if l := h.d.state.DrainLeases(); len(l) != 1 || !l[0].Expires().After(h.clock.Now()) {
			t.Fatalf("lease not renewed after the API accepted writes again: %+v", l)
		}
	})
}

func TestRestartDuringDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		call := h.offline(podIP, 0, 0)
		call.result(t)
		h.waitLeases(1)
		h.tick(0)
		h.setSYNs(4)
		// A new daemon (upgrade) over the same API and maps.
		h2 := h.restart()
		h2.tick(0)
		if ld := h2.hostedDrain("p0"); ld == nil || ld.State != StateDraining || ld.Reason != k8s.ReasonOffline {
			t.Fatalf("the Lease did not carry the drain across the restart: %+v", ld)
		}
		// The pod's retried preStop joins the drain and returns when drained.
		again := h2.offline(podIP, 30*time.Second, 2*time.Second)
		h2.tick(3 * time.Second)
		if r, ok := again.result(t); !ok || r.Code != 200 || !r.Drained {
			t.Fatalf("after restart: %+v answered=%v", r, ok)
		}
		if n := len(h2.events(hosted.EventDrainStarted, 1)); n != 1 {
			t.Errorf("%d DrainStarted events across a restart, want 1", n)
		}
		// It keeps renewing the Lease it adopted.
		before := h.d.state.DrainLeases()[0].Renewed
		h2.tick(11 * time.Second)
		if !h2.holds(func() bool { return h2.d.state.DrainLeases()[0].Renewed.After(before) }) {
			t.Error("the adopted Lease is not renewed")
		}
	})
}

// TestRestartDuringDeletionKeepsOfflineDrain: a pod that went offline and
// is then deleted drains on as it asked (its own IP steered) across a
// restart: the restarted daemon takes its deletion's drain from its Lease
// rather than starting a deletion drain of its own.
func TestRestartDuringDeletionKeepsOfflineDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		h.offline(podIP, 0, 0).result(t)
		h.waitLeases(1)
		p := h.deletingPod("pod-p0", "p0", "10.0.0.1")
		h.putPod(p)
		h.tick(0)
		k := key("10.0.0.1:8080", bpf.TCP)
		if d, ok := h.dp.Drains[k]; !ok || d.Policy != bpf.PolicyRewrite {
			t.Fatalf("the offline pod, deleted, is not steered at its IP:\n%s", h.describe())
		}
		h2 := h.restart()
		h2.pass() // the first pass starts the drains of deleting pods
		if d, ok := h2.dp.Drains[k]; !ok || d.Policy != bpf.PolicyRewrite {
			t.Errorf("after a restart the pod's IP is no longer steered:\n%s", h2.describe())
		}
		h2.tick(0)
		// Every gone drain steers its pod IP (EachPodDrain): this one does
		// while the pod is still there.
		if ld := h2.hostedDrain("p0"); ld == nil || ld.Reason != k8s.ReasonOffline || ld.State == StateGone || !ld.SteerPodIP || !ld.Lease {
			t.Fatalf("the restarted daemon's drain: %+v, want the Lease's (offline, steering the pod IP)", ld)
		}
		if l := h2.d.state.DrainLeases(); len(l) != 1 || l[0].Reason != k8s.ReasonOffline || !l[0].SteerPodIP {
			t.Errorf("the Lease after the restart: %+v", l)
		}
		if n := len(h2.events(hosted.EventDrainStarted, 1)); n != 1 {
			t.Errorf("%d DrainStarted events across a restart, want 1", n)
		}
	})
}

func TestOnlineUndoesOffline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		call := h.offline(podIP, time.Minute, 2*time.Second)
		h.openConn()
		h.tick(0)
		if r := h.d.Online(h.ctx, podIP); r.Code != 200 {
			t.Fatalf("online: %+v", r)
		}
		r, ok := call.result(t)
		if !ok || r.Code != 409 || r.State != StateCancelled {
			t.Fatalf("waiter after online: %+v answered=%v", r, ok)
		}
		h.waitLeases(0)
		h.tick(0)
		h.check(expect{})
		if r := h.d.Online(h.ctx, netip.MustParseAddr("192.0.2.1")); r.Code != 403 {
			t.Errorf("online from a foreign caller: %+v", r)
		}
	})
}

// TestUndrainBeforeReconcile: a drain Lease deleted (draind undrain)
// before this node's drains looked at it once ends the drain; it is not a
// Lease that never landed, to be published again.
func TestUndrainBeforeReconcile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		call := h.offline(podIP, time.Minute, 2*time.Second)
		h.deleteLease("p0")
		h.waitLeases(0)
		for range 2 {
			h.tick(h.d.cfg.LeaseDuration / 2) // past a renewal (a third)
		}
		r, ok := call.result(t)
		if !ok || r.Code != 409 || r.State != StateCancelled {
			t.Fatalf("waiter after the Lease's deletion: %+v answered=%v", r, ok)
		}
		if l := h.passLeases(); len(l) != 0 {
			t.Fatalf("the deleted Lease was published again: %+v", l[0])
		}
		h.check(expect{})
	})
}

func TestPodDeletionDrainsAndLingers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t, func(c *Config) { c.Linger = time.Minute })
		p := h.deletingPod("pod-p0", "p0", "10.0.0.1")
		h.putPod(p) // graceful deletion starts; no offline call at all
		h.tick(0)
		h.waitLeases(1)
		l := h.d.state.DrainLeases()[0]
		if l.Reason != k8s.ReasonPodDeleting || l.Holder != testNode || l.PodUID != "p0" {
			t.Fatalf("lease %+v", l)
		}
		h.tick(0)
		if _, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]; !ok {
			t.Fatalf("a deleting pod is not drained:\n%s", h.describe())
		}
		// The pod is gone: the Lease stays for the linger, then goes.
		h.deletePod("default", "pod-p0")
		h.tick(time.Second)
		if ps := h.d.PodStatuses(); len(ps) == 0 || ps[0].State != StateGone {
			t.Errorf("status after deletion: %+v", ps)
		}
		h.tick(30 * time.Second)
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Fatalf("lease gone before the linger ended")
		}
		h.tick(31 * time.Second)
		h.waitLeases(0)
	})
}

func TestIPReuseDeletesStaleLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		// A Lease for a pod that no longer exists names an IP a new local pod
		// now has: the hosting node removes the Lease for everyone.
		h.lease("old", "default", "pod-old", testNode, k8s.ReasonPodDeleting, time.Minute, "10.0.0.7")
		h.putPod(pod("pod-new", "new", "10.0.0.7"))
		h.tick(0)
		h.waitLeases(0)
	})
}

// TestIPReuseLeavesOtherNodesLease: a local pod at the IP of a Lease
// another node holds does not make this node delete it (the shipped Lease
// policy denies that; only the holder deletes its Leases).
func TestIPReuseLeavesOtherNodesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var deletes atomic.Int32
		h.client.PrependReactor("delete", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			deletes.Add(1)
			return false, nil, nil
		})
		h.lease("old", "default", "pod-old", "node-b", k8s.ReasonPodDeleting, time.Minute, "10.0.0.7")
		h.putPod(pod("pod-new", "new", "10.0.0.7"))
		h.tick(0)
		h.tick(time.Second)
		if n := deletes.Load(); n != 0 {
			t.Fatalf("%d deletes of node-b's Lease from %s", n, testNode)
		}
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Fatalf("%d leases, want node-b's one", n)
		}
	})
}

func TestOfflineAPIUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		h.failLeaseCreate.Store(true)
		call := h.offline(podIP, 30*time.Second, 0)
		r, ok := call.result(t)
		if !ok || r.Code != 503 || r.Error == "" {
			t.Fatalf("want 503 with an error, got %+v", r)
		}
		if n := len(h.d.hosted.Progress()); n != 0 {
			t.Errorf("a drain that could not be published is kept locally")
		}
	})
}

func flowTo(endpoint string) conntrack.Flow {
	return conntrack.Flow{Proto: conntrack.TCP, State: conntrack.TCPEstablished,
		Orig:  conntrack.Tuple{Src: netip.MustParseAddrPort("10.0.0.9:40000"), Dst: netip.MustParseAddrPort("10.96.0.10:80")},
		Reply: conntrack.Tuple{Src: netip.MustParseAddrPort(endpoint), Dst: netip.MustParseAddrPort("10.0.0.9:40000")}}
}
