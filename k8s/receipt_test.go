package k8s

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestInformersStampReceipt: every informer's objects record when they
// were received, by the informers' clock, and an update is stamped anew.
func TestInformersStampReceipt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
		clk := clocktesting.NewFakePassiveClock(t0)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "drain-x", Namespace: "draind-system",
			Labels: map[string]string{LabelDrain: "true"}}}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "shop"}, Spec: corev1.PodSpec{NodeName: "node-7"}}
		client := fake.NewClientset(fullSlice(), fullService(), lease, pod)
		inf := NewInformers(client, Config{Namespace: "draind-system", NodeName: "node-7", Clock: clk})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go inf.RunAndWait(ctx)
		if err := inf.WaitForSync(ctx); err != nil {
			t.Fatal(err)
		}
		received := func(i interface{ GetStore() cache.Store }, key string) time.Time {
			obj, ok, err := i.GetStore().GetByKey(key)
			if err != nil || !ok {
				t.Fatalf("%s: not cached (%v)", key, err)
			}
			r, ok := obj.(interface{ Received() time.Time })
			if !ok {
				t.Fatalf("%s: %T records no receipt", key, obj)
			}
			return r.Received()
		}
		for name, i := range map[string]interface{ GetStore() cache.Store }{"shop/web-x7k2p": inf.Slices, "shop/web": inf.Services,
			"draind-system/drain-x": inf.Leases, "shop/p": inf.Pods} {
			if got := received(i, name); !got.Equal(t0) {
				t.Errorf("%s received %v, want the clock's %v", name, got, t0)
			}
		}

		t1 := t0.Add(time.Minute)
		clk.SetTime(t1)
		s := fullSlice()
		s.ResourceVersion = "4712"
		if _, err := client.DiscoveryV1().EndpointSlices("shop").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the informer handles the update
		if got := received(inf.Slices, "shop/web-x7k2p"); !got.Equal(t1) {
			t.Fatalf("the updated slice received %v, want the clock's %v", got, t1)
		}
		if got := received(inf.Services, "shop/web"); !got.Equal(t0) {
			t.Errorf("the Service, not updated, received %v, want %v", got, t0)
		}
	})
}

// TestStampReceiptKeepsTheFirst: an object delivered again, slim already,
// keeps its first stamp; what is not slim (a tombstone) passes unchanged.
func TestStampReceiptKeepsTheFirst(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	clk := clocktesting.NewFakePassiveClock(t0)
	tr := stampReceipt(clk, slimTransform(&Informers{}, (&Informers{}).sliceFrom))
	obj, err := tr(fullSlice())
	if err != nil {
		t.Fatal(err)
	}
	clk.SetTime(t0.Add(time.Hour))
	again, err := tr(obj)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.(*Slice).Received(); !got.Equal(t0) {
		t.Errorf("delivered again: received %v, want the first stamp %v", got, t0)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "shop/web-x7k2p", Obj: obj}
	if out, err := tr(tomb); err != nil || out != any(tomb) {
		t.Errorf("a tombstone came out as %#v, %v", out, err)
	}
	if got := (&Slice{}).Received(); !got.IsZero() {
		t.Errorf("an unstamped slice reads as received %v", got)
	}
}
