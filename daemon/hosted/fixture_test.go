package hosted

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s"
)

const (
	testNode = "node-a"
	testNS   = "draind-system"
)

// fixture runs hosted drains over fakes: the client-go fake clientset for
// Leases and Events, the fake datapath, a conntrack table that only
// counts, a fake clock, and this node's pods as the test sets them. Rounds
// are the test's to run (tick), as package daemon's loop runs them.
type fixture struct {
	t      *testing.T
	client *fake.Clientset
	clock  *testingclock.FakeClock
	dp     *datapathtest.Datapath
	ct     *ctCounts
	writer *lease.Writer
	pods   atomic.Pointer[LocalPods]
	d      *Drains
	ctx    context.Context
}

// newFixture starts hosted drains with package daemon's defaults, changed
// by mod.
func newFixture(t *testing.T, mod ...func(*Config)) *fixture {
	t.Helper()
	f := &fixture{t: t, client: fake.NewClientset(), dp: datapathtest.New(), ct: &ctCounts{live: map[netip.Addr]int{}},
		clock: testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}
	f.pods.Store(NewLocalPods(nil))
	leases := &k8s.Leases{Client: f.client, Namespace: testNS}
	cfg := Config{Node: testNode, Linger: 2 * time.Minute, LeaseDuration: 30 * time.Second, Quiet: 2 * time.Second,
		MaxWaiters: 256, MaxWaitersPerPod: 8, State: apiState{f}, LocalPods: f.pods.Load, Claims: noClaims{},
		Datapath: f.dp, Conntrack: f.ct, Leases: leases, Events: f.client.CoreV1().Events(""), Metrics: newMetrics(),
		Log: slog.New(slog.DiscardHandler), Clock: f.clock, RequestPass: func() {}, Wake: func() {}}
	for _, m := range mod {
		m(&cfg)
	}
	f.writer = lease.NewWriter(leases, cfg.LeaseDuration, f.clock, func(r lease.Result) { f.d.LeaseWritten(r) })
	cfg.Writer = f.writer
	f.d = New(cfg)
	f.d.Start()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		f.d.Stop("the test is over")
	})
	f.ctx = ctx
	return f
}

func newMetrics() Metrics {
	return Metrics{
		DrainStarts:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drain_starts_total"}, []string{"reason"}),
		DrainOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "drain_outcomes_total"}, []string{"outcome"}),
		DrainDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "drain_duration_seconds"}),
		LeaseOps:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "lease_operations_total"}, []string{"op", "result"}),
		CTErrors:      prometheus.NewCounter(prometheus.CounterOpts{Name: "conntrack_errors_total"}),
	}
}

// setPods makes pods this node's, as a pod event's snapshot would.
func (f *fixture) setPods(pods ...*corev1.Pod) {
	var ps []*k8s.Pod
	for _, p := range pods {
		ps = append(ps, k8s.PodFrom(p))
	}
	f.pods.Store(NewLocalPods(ps))
}

// tick advances the fake clock, runs a round and sends the Lease writes it
// decided.
func (f *fixture) tick(d time.Duration) {
	f.clock.Step(d)
	f.d.Reconcile(f.ctx)
	f.writer.Flush(f.ctx)
}

// leases returns the drain Leases in the API.
func (f *fixture) leases() []*k8s.DrainLease { return apiState{f}.read(false) }

// waits is how many wait slots are taken.
func (f *fixture) waits() int {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	return f.d.nwait
}

// waiters is how many waits are queued on pod uid's drain (a slot taken
// is not yet a waiter queued).
func (f *fixture) waiters(uid types.UID) int {
	f.d.mu.Lock()
	defer f.d.mu.Unlock()
	if ld := f.d.pods[uid]; ld != nil {
		return len(ld.waiters)
	}
	return 0
}

type offlineCall struct {
	done chan nodeapi.Result
}

// offline calls Offline as the pod at ip would and waits until the call
// is registered (answered at once, or its wait queued and its Lease in
// the API).
func (f *fixture) offline(ip netip.Addr, wait, quiet time.Duration) *offlineCall {
	f.t.Helper()
	c := &offlineCall{done: make(chan nodeapi.Result, 1)}
	queued := func() int {
		f.d.mu.Lock()
		defer f.d.mu.Unlock()
		n := 0
		for _, ld := range f.d.pods {
			n += len(ld.waiters)
		}
		return n
	}
	before := queued()
	go func() { c.done <- f.d.Offline(f.ctx, ip, wait, quiet) }()
	answered := false
	eventually(f.t, 10*time.Second, "the offline call to register", func() bool {
		select {
		case r := <-c.done: // answered at once (403, no wait, ...)
			c.done <- r
			answered = true
			return true
		default:
		}
		return wait > 0 && queued() > before
	})
	if !answered {
		eventually(f.t, 10*time.Second, "a drain Lease in the API", func() bool { return len(f.leases()) > 0 })
	}
	return c
}

// answered reports an answer given within 100 ms: the test expects none.
func (c *offlineCall) answered() (nodeapi.Result, bool) {
	select {
	case r := <-c.done:
		return r, true
	case <-time.After(100 * time.Millisecond):
		return nodeapi.Result{}, false
	}
}

// httpFixture serves the offline API (package nodeapi) over the hosted
// drains on 127.0.0.1, for pod p0 whose IP is 127.0.0.1 (the caller
// identity of a loopback client). It runs outside a synctest bubble: the
// API needs a real TCP socket, whose peer address is the caller's
// identity.
type httpFixture struct {
	*fixture
	addr string
}

// newHTTPFixture serves the API with package daemon's limits, changed by
// api (may be nil), over hosted drains changed by mod.
func newHTTPFixture(t *testing.T, api func(*nodeapi.Config), mod ...func(*Config)) *httpFixture {
	f := newFixture(t, mod...)
	f.setPods(pod("pod-p0", "p0", "127.0.0.1"))
	ac := nodeapi.Config{Quiet: f.d.cfg.Quiet, MaxWait: 10 * time.Minute, BodyTimeout: 5 * time.Second,
		HeaderTimeout: 5 * time.Second, MaxConnections: 1024}
	if api != nil {
		api(&ac)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(f.ctx)
	done := make(chan struct{})
	go func() { nodeapi.New(ready{f.d}, ac).Serve(ctx, l); close(done) }()
	t.Cleanup(func() {
		f.d.Stop("the test is over") // pending waits answer, as at a stop
		cancel()
		<-done
	})
	return &httpFixture{fixture: f, addr: l.Addr().String()}
}

// ready is the hosted drains as the API asks them, always ready.
type ready struct{ *Drains }

func (ready) Ready() bool { return true }

// apiState reads the drain and claim Leases from the fake API, as the
// informers would cache them (without their lag).
type apiState struct{ f *fixture }

func (s apiState) DrainLeases() []*k8s.DrainLease { return s.read(false) }
func (s apiState) ClaimLeases() []*k8s.DrainLease { return s.read(true) }

func (s apiState) read(claims bool) []*k8s.DrainLease {
	list, err := s.f.client.CoordinationV1().Leases(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []*k8s.DrainLease
	for i := range list.Items {
		if dl, err := k8s.ParseLease(&list.Items[i]); err == nil && dl.Claim == claims {
			out = append(out, dl)
		}
	}
	return out
}

// noClaims: no IP is another pod's.
type noClaims struct{}

func (noClaims) ClaimedByOther(netip.Addr, types.UID) bool { return false }

// ctCounts is a conntrack table that only counts: established TCP flows
// by reply source.
type ctCounts struct {
	mu       sync.Mutex
	live     map[netip.Addr]int
	failNext int // Count fails this many times
}

func (c *ctCounts) Count(_ context.Context, ip netip.Addr) (conntrack.Counts, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failNext > 0 {
		c.failNext--
		return conntrack.Counts{}, errors.New("injected: conntrack dump failed")
	}
	var n conntrack.Counts
	n.TCP[conntrack.TCPEstablished] = c.live[ip]
	return n, nil
}

// setLive sets how many established flows ip has.
func (c *ctCounts) setLive(ip string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.live[netip.MustParseAddr(ip)] = n
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

// eventually waits until cond holds, failing the test with what after
// timeout: the fixtures over real sockets poll.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// poll reports whether cond held within timeout.
func poll(timeout time.Duration, cond func() bool) bool {
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	return err == nil
}
