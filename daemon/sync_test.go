package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// TestNothingAppliedBeforeSync: with one informer unable to list (an API
// server refusing Leases), the datapath is never written, though the other
// informers already hold a draining endpoint; once it lists, the drain is
// applied.
func TestNothingAppliedBeforeSync(t *testing.T) {
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
	dp := NewFakeDatapath()
	d := New(Config{Node: testNode, Namespace: testNS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, client, dp, nil)
	d.SetAttached(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	// Every other informer holds its objects and the Lease list was refused
	// (and retried): the moment a broken sync would write.
	eventually(t, 20*time.Second, "the other informers to sync and the Lease list to be retried", func() bool {
		return d.inf.Slices.HasSynced() && d.inf.Services.HasSynced() && d.inf.Pods.HasSynced() && refused.Load() >= 2
	})
	if n := dp.OpCount(); n != 0 {
		t.Fatalf("%d datapath operations before every informer synced", n)
	}
	if d.Ready() {
		t.Fatal("ready before every informer synced")
	}
	refuse.Store(false) // the reflector retries with backoff
	eventually(t, 20*time.Second, "the drain to be applied after the informers synced", func() bool { return len(dp.DrainKeys()) > 0 })
	if !slices.Contains(dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
		t.Errorf("drains %v", dp.DrainKeys())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}

// TestLatencyCountsFromReceipt: an event's event-to-datapath latency
// counts from when its object was received (k8s.Receipt), not from when
// its handler ran: the time it waited inside the informer is part of it.
func TestLatencyCountsFromReceipt(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC))
	var got []time.Duration
	d := New(Config{Node: testNode, Namespace: testNS, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLatency: func(l time.Duration) { got = append(got, l) }}, fake.NewClientset(), NewFakeDatapath(), nil)
	svc, _ := k8s.ServiceFrom(webService())
	first, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
	if err := d.inf.Services.GetStore().Add(svc); err != nil {
		t.Fatal(err)
	}
	if err := d.inf.Slices.GetStore().Add(first); err != nil {
		t.Fatal(err)
	}
	d.serviceEvent(nil, svc)
	d.sliceEvent(nil, first)
	d.sync()
	d.firstDone.Store(true)
	got = nil

	next, _ := k8s.SliceFrom(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), terminating("10.0.0.2", "b")))
	next.Stamp(clk.Now())
	clk.Step(3 * time.Millisecond) // queued in the informer
	if err := d.inf.Slices.GetStore().Update(next); err != nil {
		t.Fatal(err)
	}
	d.sliceEvent(first, next)
	clk.Step(2 * time.Millisecond) // the handler to the pass
	d.sync()
	if want := []time.Duration{5 * time.Millisecond}; !slices.Equal(got, want) {
		t.Errorf("latencies %v, want %v (received to written, not handled to written)", got, want)
	}
}
