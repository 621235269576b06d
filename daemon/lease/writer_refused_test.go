package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/k8s"
)

// testNamespace is where the tests' Leases live.
const testNamespace = "draind-system"

// TestWriterRefusedAfterOutage: the refused backoff starts at
// refusedMin after an outage's transient failures (an API server
// that has just started answers 403 until its authorizer has synced).
func TestWriterRefusedAfterOutage(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	client := fake.NewClientset()
	var calls atomic.Int32
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if calls.Add(1) <= 20 {
			return true, nil, apierrors.NewServiceUnavailable("down")
		}
		return true, nil, apierrors.NewForbidden(gr, "x", nil)
	})
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	lw := NewWriter(&k8s.Leases{Client: client, Namespace: testNamespace}, 30*time.Second, clk, nil)
	lw.Want("drain-x", Write{Kind: Delete})
	for calls.Load() < 21 {
		lw.Flush(context.Background())
		clk.Step(RetryMax)
	}
	lw.mu.Lock()
	next := lw.pending["drain-x"].next
	lw.mu.Unlock()
	if got := next.Sub(clk.Now()); got > refusedMin {
		t.Fatalf("first refusal after 20 transient failures retried in %v, want at most %v", got, refusedMin)
	}
}

// TestWriterRefusedNotRetriedHot: a write the API server refuses for
// good (an admission policy's 403, a 422) is retried after refusedMin
// (then doubling), not every retry step; a transient error is retried
// within RetryMax; deleting a Lease already gone is done, and so is
// renewing one (its owner is told, and never renews it in a loop).
func TestWriterRefusedNotRetriedHot(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, tc := range []struct {
		name      string
		kind      Kind
		err       error
		wantRetry time.Duration // 0: the write is done
	}{
		{"delete denied by the Lease policy", Delete, apierrors.NewForbidden(gr, "x", nil), refusedMin},
		{"renew of a deleted Lease", Renew, apierrors.NewNotFound(gr, "x"), 0},
		{"renew invalid", Renew, apierrors.NewInvalid(schema.GroupKind{Group: gr.Group, Kind: "Lease"}, "x", nil), refusedMin},
		{"delete of a Lease already gone", Delete, apierrors.NewNotFound(gr, "x"), 0},
		{"API server unavailable", Delete, apierrors.NewServiceUnavailable("down"), retryMin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			var calls atomic.Int32
			client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
				calls.Add(1)
				return true, nil, tc.err
			})
			clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
			var results []Result
			lw := NewWriter(&k8s.Leases{Client: client, Namespace: testNamespace}, 30*time.Second, clk, func(r Result) { results = append(results, r) })
			lw.Want("drain-x", Write{Kind: tc.kind})
			lw.Flush(context.Background())
			if calls.Load() != 1 || len(results) != 1 {
				t.Fatalf("first flush: %d API calls, %d results; want 1 and 1", calls.Load(), len(results))
			}
			lw.mu.Lock()
			p := lw.pending["drain-x"]
			lw.mu.Unlock()
			if tc.wantRetry == 0 {
				if p != nil || (results[0].Err != nil) != Gone(tc.kind, tc.err) {
					t.Fatalf("pending %v, result error %v: want the write done", p, results[0].Err)
				}
				clk.Step(RefusedMax)
				lw.Flush(context.Background())
				if calls.Load() != 1 {
					t.Fatalf("%d API calls, want the write never made again", calls.Load())
				}
				return
			}
			if p == nil {
				t.Fatal("the write was dropped: want it kept for a later retry")
			}
			if got := p.next.Sub(clk.Now()); got != tc.wantRetry {
				t.Fatalf("next try in %v, want %v", got, tc.wantRetry)
			}
			if Permanent(tc.kind, results[0].Err) != (tc.wantRetry == refusedMin) {
				t.Fatalf("result error %v classified wrongly", results[0].Err)
			}
			// Flushing before the retry is due makes no call.
			clk.Step(tc.wantRetry - time.Millisecond)
			lw.Flush(context.Background())
			if calls.Load() != 1 {
				t.Fatalf("%d API calls before the retry was due, want 1", calls.Load())
			}
			clk.Step(time.Millisecond)
			lw.Flush(context.Background())
			if calls.Load() != 2 {
				t.Fatalf("%d API calls once the retry was due, want 2", calls.Load())
			}
		})
	}
}
