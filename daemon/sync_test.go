package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/k8s"
)

// TestNothingAppliedBeforeSync: with one informer unable to list (an API
// server refusing Leases), the datapath is never written, though the other
// informers already hold a draining endpoint; once it lists, the drain is
// applied.
func TestNothingAppliedBeforeSync(t *testing.T) {
	// apimachinery's HandleError, which the reflector calls on every failed
	// list, sleeps off a global rate limit measured from the real time of
	// its last error: decades ahead of a bubble's clock (it starts in
	// 2000), so the reflector would never retry. Log only, for this test.
	handlers := utilruntime.ErrorHandlers
	utilruntime.ErrorHandlers = handlers[:1:1]
	t.Cleanup(func() { utilruntime.ErrorHandlers = handlers })
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(webService(), slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		var refuse atomic.Bool
		var refused atomic.Int32
		refuse.Store(true)
		client.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if refuse.Load() {
				refused.Add(1)
				return true, nil, errors.New("the server is currently unable to handle the request")
			}
			return false, nil, nil
		})
		dp := datapathtest.New()
		d := mustNew(t, Config{Node: testNode, Namespace: testNS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, client, dp, nil)
		d.SetAttached(true)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		// Every other informer holds its objects and the Lease list was
		// refused and retried (the reflector's first backoff is 0.8 to
		// 1.6 s): the moment a broken sync would write.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !d.inf.Slices.HasSynced() || !d.inf.Services.HasSynced() || !d.inf.Pods.HasSynced() || refused.Load() < 2 {
			t.Fatalf("after 2 s: informers synced %v, the Lease list refused %d times, want the others synced and a retry",
				d.inf.Synced(), refused.Load())
		}
		if n := dp.OpCount(); n != 0 {
			t.Fatalf("%d datapath operations before every informer synced", n)
		}
		if d.Ready() {
			t.Fatal("ready before every informer synced")
		}
		refuse.Store(false)
		// The reflector retries with a backoff that stops growing at 30 to
		// 60 s.
		time.Sleep(time.Minute)
		synctest.Wait()
		if !slices.Contains(dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
			t.Errorf("drains %v, a minute after the Lease list was allowed", dp.DrainKeys())
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// seedWeb caches the web Service and its slice first, lets the handlers see
// them and runs the first pass, as a daemon does before it is Ready.
func seedWeb(t *testing.T, d *Daemon, first *k8s.Slice) {
	t.Helper()
	svc, _ := k8s.ServiceFrom(webService())
	if err := d.inf.Services.GetStore().Add(svc); err != nil {
		t.Fatal(err)
	}
	if err := d.inf.Slices.GetStore().Add(first); err != nil {
		t.Fatal(err)
	}
	d.serviceEvent(nil, svc, time.Time{})
	d.sliceEvent(nil, first, time.Time{})
	d.sync()
	d.firstDone.Store(true)
}

// TestLatencyCountsFromReceipt: an event's event-to-datapath latency
// counts from when its object was received (k8s.Receipt), not from when
// its handler ran: the time it waited inside the informer is part of it.
func TestLatencyCountsFromReceipt(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	var got []time.Duration
	d := mustNew(t, Config{Node: testNode, Namespace: testNS, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		fake.NewClientset(), datapathtest.New(), nil)
	d.onLatency = func(l time.Duration) { got = append(got, l) }
	first, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")), nil)
	seedWeb(t, d, first)
	got = nil

	next, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), terminating("10.0.0.2", "b")), nil)
	next.Stamp(clk.Now())
	clk.Step(3 * time.Millisecond) // queued in the informer
	if err := d.inf.Slices.GetStore().Update(next); err != nil {
		t.Fatal(err)
	}
	d.sliceEvent(first, next, next.Received())
	clk.Step(2 * time.Millisecond) // the handler to the pass
	d.sync()
	if want := []time.Duration{5 * time.Millisecond}; !slices.Equal(got, want) {
		t.Errorf("latencies %v, want %v (received to written, not handled to written)", got, want)
	}
}

// TestEventReceipts: handlers learn when each event's object was received:
// an add's or update's new object, a deletion's deleted object; not a
// deletion the informer inferred on a relist (a tombstone: its object was
// received long before).
func TestEventReceipts(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	stamped := func(name string, at time.Time) *k8s.Slice {
		s := &k8s.Slice{Meta: k8s.Meta{Name: name, Namespace: "shop", ResourceVersion: name}}
		s.Stamp(at)
		return s
	}
	a, b := stamped("1", t0), stamped("2", t0.Add(time.Second))
	var got []time.Time
	h := eventFuncs(func(_, _ any, received time.Time) { got = append(got, received) })
	h.OnAdd(a, false)
	h.OnUpdate(a, b)
	h.OnDelete(b)
	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "shop/2", Obj: b})
	want := []time.Time{t0, t0.Add(time.Second), t0.Add(time.Second), {}}
	if !slices.EqualFunc(got, want, time.Time.Equal) {
		t.Errorf("receipts %v, want %v", got, want)
	}
}

// TestReceivedAtKeepsTheMonotonicClock: a receipt is wall time; the
// instant latencies count from is an offset back from now and keeps now's
// monotonic reading, so a wall clock step after the handler cannot skew
// them. A receipt not before now (a step before it) counts as now.
func TestReceivedAtKeepsTheMonotonicClock(t *testing.T) {
	now := time.Now()
	received := time.Unix(0, now.UnixNano()-int64(3*time.Millisecond)) // as k8s.Receipt returns it
	at := receivedAt(received, now)
	if !strings.Contains(at.String(), " m=") {
		t.Errorf("%v has no monotonic reading", at)
	}
	if d := now.Sub(at); d != 3*time.Millisecond {
		t.Errorf("now - at = %v, want 3ms", d)
	}
	if at := receivedAt(now.Add(time.Second), now); at != now {
		t.Errorf("a receipt after now gave %v, want now", at)
	}
	if at := receivedAt(time.Time{}, now); at != now {
		t.Errorf("no receipt gave %v, want now", at)
	}
}

// TestTrackerTakesAfresh: each take returns exactly what was marked since
// the last one, though its maps are the ones the take before last returned.
func TestTrackerTakesAfresh(t *testing.T) {
	var tr tracker
	tr.init()
	at := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	mark := func(svc string, addr string) {
		tr.markService(svc, at)
		tr.markIPs([]netip.Addr{ip(addr)})
	}
	check := func(n int, got dirtySet, svc, addr string) {
		t.Helper()
		if _, ok := got.services[svc]; !ok || len(got.services) != 1 {
			t.Errorf("take %d: services %v, want only %s", n, got.services, svc)
		}
		if _, ok := got.ips[ip(addr)]; !ok || len(got.ips) != 1 {
			t.Errorf("take %d: IPs %v, want only %s", n, got.ips, addr)
		}
	}
	mark("shop/a", "10.0.0.1")
	first := tr.take()
	check(1, first, "shop/a", "10.0.0.1")
	mark("shop/b", "10.0.0.2")
	check(2, tr.take(), "shop/b", "10.0.0.2")
	mark("shop/c", "10.0.0.3")
	third := tr.take()
	check(3, third, "shop/c", "10.0.0.3")
	if reflect.ValueOf(third.services).UnsafePointer() != reflect.ValueOf(first.services).UnsafePointer() {
		t.Error("the third take did not reuse the first one's map")
	}
	// A large set is not kept: clearing it would cost every pass its size.
	for i := range 2000 {
		tr.markIPs([]netip.Addr{netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})})
	}
	big := tr.take()
	tr.take()
	mark("shop/d", "10.0.0.4")
	if got := tr.take(); reflect.ValueOf(got.ips).UnsafePointer() == reflect.ValueOf(big.ips).UnsafePointer() || len(got.ips) != 1 {
		t.Errorf("a set of 2,000 IPs was reused (%d IPs now)", len(got.ips))
	}
}

// TestSliceEventPassesAtOnce: once the loop runs, a slice update's handler
// writes its effect before it returns (the watch's own pass), unless a
// pass is running: then it leaves the update to the loop, signalled. Not
// before the first pass, nor with passes rate limited (MinSyncInterval).
func TestSliceEventPassesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inline bool
		busy   bool
		want   bool // written before the handler returns
	}{
		{"idle", true, false, true},
		{"a pass running", true, true, false},
		{"not inline (before the loop, or rate limited)", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := datapathtest.New()
			d := mustNew(t, Config{Node: testNode, Namespace: testNS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
				fake.NewClientset(), dp, nil)
			first, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), ready("10.0.0.2", "b")), nil)
			seedWeb(t, d, first)
			d.inlinePasses.Store(tc.inline)
			<-d.runner.signal // the adds' signals

			next, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")), nil)
			if err := d.inf.Slices.GetStore().Update(next); err != nil {
				t.Fatal(err)
			}
			if tc.busy {
				d.modelMu.Lock()
			}
			d.sliceEvent(first, next, time.Time{})
			if tc.busy {
				d.modelMu.Unlock()
			}
			written := slices.Contains(dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP))
			if written != tc.want {
				t.Fatalf("drain written before the handler returned: %v, want %v", written, tc.want)
			}
			if signalled := len(d.runner.signal) > 0; signalled == tc.want {
				t.Errorf("loop signalled: %v, want %v", signalled, !tc.want)
			}
			d.sync() // what the loop would run
			if !slices.Contains(dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
				t.Errorf("drain not written after the loop's pass: %v", dp.DrainKeys())
			}
		})
	}
}

// TestInlinePassesFollowTheLoop: the slice watch runs passes itself only
// while the loop runs, and never when passes are rate limited.
func TestInlinePassesFollowTheLoop(t *testing.T) {
	for _, minSync := range []time.Duration{0, time.Second} {
		synctest.Test(t, func(t *testing.T) {
			d := mustNew(t, Config{Node: testNode, Namespace: testNS, MinSyncInterval: minSync,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, fake.NewClientset(), datapathtest.New(), nil)
			d.SetAttached(true)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			// Run waits for the informers with client-go's WaitForCacheSync,
			// which looks every 100 ms.
			time.Sleep(time.Second)
			synctest.Wait()
			if !d.Ready() {
				t.Fatalf("MinSyncInterval %v: not ready a second after the start", minSync)
			}
			if got, want := d.inlinePasses.Load(), minSync == 0; got != want {
				t.Errorf("MinSyncInterval %v: inline passes %v, want %v", minSync, got, want)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if d.inlinePasses.Load() {
				t.Errorf("MinSyncInterval %v: inline passes still on after the loop stopped", minSync)
			}
		})
	}
}

// TestRefreshRoundsAreTheLoops: a pass the slice watch runs itself writes
// its events only; it neither starts a refresh round nor takes a batch of
// one. The loop's does.
func TestRefreshRoundsAreTheLoops(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	d := mustNew(t, Config{Node: testNode, Namespace: testNS, Clock: clk, EntryTTL: time.Minute,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, fake.NewClientset(), datapathtest.New(), nil)
	sl, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")), nil)
	seedWeb(t, d, sl)
	t0 := d.lastFull
	clk.Step(time.Minute) // a round is due
	d.inlinePasses.Store(true)
	if !d.passNow() {
		t.Fatal("no pass ran")
	}
	if !d.lastFull.Equal(t0) || d.reconciler.Refreshing() {
		t.Fatal("a pass of the slice watch started a refresh round")
	}
	d.sync()
	if !d.lastFull.Equal(clk.Now()) {
		t.Fatal("the loop's pass did not start the round that was due")
	}
	// A round under way, its first batch due: only the loop takes it. The
	// round fits in one batch, so a batch taken ends it.
	d.reconciler.StartRefresh(d.model.Desired(), clk.Now())
	if !d.reconciler.Refreshing() {
		t.Fatal("an empty round")
	}
	d.passNow()
	if !d.reconciler.Refreshing() {
		t.Error("a pass of the slice watch took a batch of the round")
	}
	d.sync()
	if d.reconciler.Refreshing() {
		t.Error("the loop's pass did not take the round's batch")
	}
}

// slowDatapath makes every drain write take d on the fake clock.
type slowDatapath struct {
	*datapathtest.Datapath
	clk *testingclock.FakeClock
	d   time.Duration
}

func (s *slowDatapath) UpsertDrain(d bpf.Drain) error {
	s.clk.Step(s.d)
	return s.Datapath.UpsertDrain(d)
}

// TestSliceWatchPassesStandAside: the slice watch runs no pass itself
// while it stores a relist (the loop takes the list in), nor for a while
// after one of its passes took long; then again.
func TestSliceWatchPassesStandAside(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	dp := &slowDatapath{datapathtest.New(), clk, 0}
	d := mustNew(t, Config{Node: testNode, Namespace: testNS, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		fake.NewClientset(), dp, nil)
	svc, _ := k8s.ServiceFrom(webService())
	if err := d.inf.Services.GetStore().Add(svc); err != nil {
		t.Fatal(err)
	}
	d.serviceEvent(nil, svc, time.Time{})
	apiSlice := func(rv string, term ...string) *discoveryv1.EndpointSlice {
		var eps []epSpec
		for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
			if slices.Contains(term, ip) {
				eps = append(eps, terminating(ip, "uid-"+ip))
			} else {
				eps = append(eps, ready(ip, "uid-"+ip))
			}
		}
		s := slice("web-1", "web", v4, httpPorts(8080), eps...)
		s.ResourceVersion = rv
		return s
	}
	if err := d.inf.Slices.Replace([]any{apiSlice("1")}, "1"); err != nil {
		t.Fatal(err)
	}
	d.sync()
	d.firstDone.Store(true)
	d.inlinePasses.Store(true)
	drained := func(ip string) bool { return slices.Contains(dp.DrainKeys(), key(ip+":8080", bpf.TCP)) }
	signalled := func() bool {
		select {
		case <-d.runner.signal:
			return true
		default:
			return false
		}
	}
	signalled()

	// A relist that finds .1 terminating: left to the loop.
	if err := d.inf.Slices.Replace([]any{apiSlice("2", "10.0.0.1")}, "2"); err != nil {
		t.Fatal(err)
	}
	if drained("10.0.0.1") || !signalled() {
		t.Fatalf("during a relist: drain written %v, want it left to the loop", drained("10.0.0.1"))
	}
	d.sync()

	// A watched update: written at once, but its pass takes 2 ms.
	dp.d = 2 * time.Millisecond
	if err := d.inf.Slices.Update(apiSlice("3", "10.0.0.1", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	if !drained("10.0.0.2") {
		t.Fatal("a watched update was not written at once")
	}
	dp.d = 0
	signalled()
	// The next, within the backoff: left to the loop.
	if err := d.inf.Slices.Update(apiSlice("4", "10.0.0.1", "10.0.0.2", "10.0.0.3")); err != nil {
		t.Fatal(err)
	}
	if drained("10.0.0.3") || !signalled() {
		t.Fatal("right after a slow pass: written at once, want it left to the loop")
	}
	d.sync()
	// After the backoff: at once again.
	clk.Step(inlineBackoff)
	if err := d.inf.Slices.Update(apiSlice("5")); err != nil {
		t.Fatal(err)
	}
	if drained("10.0.0.1") {
		t.Fatal("after the backoff: not written at once")
	}
}
