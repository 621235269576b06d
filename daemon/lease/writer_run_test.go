package lease

import (
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/clock"

	"github.com/draind/draind/k8s"
)

// TestWriterRunBacksOff drives the writer's own goroutine (Run) in a
// synctest bubble, where time moves only while every goroutine waits: a
// write the API server refuses for good is tried again after 1 s, 2 s,
// 4 s, ... (never at the transient step), and once it goes through the
// writer stops calling. The times are exact: no polling, no tolerance.
func TestWriterRunBacksOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
		t0 := time.Now()
		var mu sync.Mutex
		var calls []time.Duration
		refuse := true
		client := fake.NewClientset()
		client.PrependReactor("delete", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, time.Since(t0))
			if refuse {
				return true, nil, apierrors.NewForbidden(gr, "drain-x", nil)
			}
			return true, nil, nil
		})
		var results []Result
		lw := NewWriter(&k8s.Leases{Client: client, Namespace: testNamespace}, 30*time.Second, clock.RealClock{}, func(r Result) {
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
		lw.Want("drain-x", Write{Kind: Delete})
		done := make(chan struct{})
		go func() { lw.Run(t.Context()); close(done) }()

		time.Sleep(7*time.Second + 500*time.Millisecond)
		synctest.Wait()
		mu.Lock()
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second}
		if !slices.Equal(calls, want) {
			t.Errorf("refused delete tried at %v, want %v (1 s, then doubling)", calls, want)
		}
		refuse = false
		mu.Unlock()

		time.Sleep(8 * time.Second) // the next try is due at 15 s
		synctest.Wait()
		mu.Lock()
		n := len(calls)
		last := results[len(results)-1]
		mu.Unlock()
		if n != 5 || last.Err != nil {
			t.Fatalf("after the refusal ended: %d calls (want 5), last result %v", n, last.Err)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		if len(calls) != n {
			t.Errorf("the writer kept calling after the write went through: %d calls, want %d", len(calls), n)
		}
	})
}

// TestWriterDeleteNow: DeleteNow deletes at once and returns the API
// server's error, drops the write that waited for the Lease (a renewal
// queued before the deletion is never sent after it), and tells onResult
// nothing (its caller reports).
func TestWriterDeleteNow(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	client := fake.NewClientset()
	var verbs []string
	refuse := false
	client.PrependReactor("*", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		verbs = append(verbs, a.GetVerb())
		if refuse {
			return true, nil, apierrors.NewForbidden(gr, "drain-x", nil)
		}
		return true, nil, nil
	})
	told := 0
	lw := NewWriter(&k8s.Leases{Client: client, Namespace: testNamespace}, 30*time.Second, clock.RealClock{}, func(Result) { told++ })
	lw.Want("drain-x", Write{Kind: Renew})
	if err := lw.DeleteNow(t.Context(), "drain-x"); err != nil {
		t.Fatalf("DeleteNow: %v", err)
	}
	if lw.Has("drain-x") {
		t.Fatal("the renewal queued before the deletion still waits")
	}
	lw.Flush(t.Context())
	if !slices.Equal(verbs, []string{"delete"}) || told != 0 {
		t.Fatalf("API calls %v, onResult told %d times; want one delete, none told", verbs, told)
	}
	refuse = true
	if err := lw.DeleteNow(t.Context(), "drain-x"); !apierrors.IsForbidden(err) {
		t.Fatalf("DeleteNow refused: %v, want the 403", err)
	}
}
