package lease

import (
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/k8s"
)

// trustPod is a pod of node-b at 10.0.0.7 and fd00::7.
func trustPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: "uid-web-1"},
		Spec:       corev1.PodSpec{NodeName: "node-b"},
		Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}, {IP: "fd00::7"}}},
	}
}

// trustLease is node-b's drain Lease of trustPod, naming one IP of the
// pod and one that is not.
func trustLease() *k8s.DrainLease {
	return &k8s.DrainLease{ObjectMeta: metav1.ObjectMeta{Name: k8s.LeaseName("uid-web-1")},
		PodNamespace: "shop", PodName: "web-1", PodUID: "uid-web-1", Holder: "node-b",
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.99")}}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestTrustVerdicts: a Lease is believed only once its Pod object is read
// (never on the asking call), for the pod's own IPs only; each verdict
// changes the generation and asks for a pass; a Lease whose holder does
// not host the pod is refused until RecheckAfter, then checked again; a
// Lease with another claim is checked again at once; ForgetExcept drops
// the verdicts of Leases that are gone.
func TestTrustVerdicts(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	client := fake.NewClientset(trustPod())
	var passes atomic.Int32
	tr := NewTrust(client.CoreV1(), clk, quietLog(), func() { passes.Add(1) })
	ctx := t.Context()

	l := trustLease()
	if ips, ok, _ := tr.verified(l); ok || ips != nil {
		t.Fatalf("unchecked Lease believed: %v %v", ips, ok)
	}
	gen := tr.Generation()
	if !tr.Flush(ctx) || passes.Load() != 1 || tr.Generation() == gen {
		t.Fatalf("flush of a pending check: passes %d, generation %d -> %d; want a pass and a new generation",
			passes.Load(), gen, tr.Generation())
	}
	ips, ok, recheck := tr.verified(l)
	if !ok || !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("10.0.0.7")}) || !recheck.IsZero() {
		t.Fatalf("verified = %v, %v, %v; want only the pod's own IP, no recheck", ips, ok, recheck)
	}
	if tr.Flush(ctx) {
		t.Fatal("a believed Lease was checked again")
	}

	// Another holder: the pod runs on node-b, not node-c.
	other := trustLease()
	other.Holder = "node-c"
	if _, ok, _ := tr.verified(other); ok {
		t.Fatal("a Lease with a changed holder kept the old verdict")
	}
	tr.Flush(ctx)
	_, ok, recheck = tr.verified(other)
	if ok || !recheck.Equal(clk.Now().Add(RecheckAfter)) {
		t.Fatalf("holder not hosting the pod: ok %v, recheck %v; want refused until %v", ok, recheck, clk.Now().Add(RecheckAfter))
	}
	if tr.Flush(ctx) {
		t.Fatal("a refused Lease was checked again before its recheck")
	}
	clk.Step(RecheckAfter)
	if _, ok, _ := tr.verified(other); ok || !tr.Flush(ctx) {
		t.Fatal("a refused Lease was not checked again at its recheck")
	}

	tr.ForgetExcept(map[string]bool{})
	if _, ok, _ := tr.verified(l); ok {
		t.Fatal("a forgotten verdict still answered")
	}
}

// TestTrustRefusesMissingPod: a Lease whose pod does not exist, or exists
// with another UID, is refused.
func TestTrustRefusesMissingPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		pods []*corev1.Pod
	}{
		{"no pod", nil},
		{"another pod of the same name", []*corev1.Pod{func() *corev1.Pod { p := trustPod(); p.UID = "uid-web-2"; return p }()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, p := range tc.pods {
				if err := client.Tracker().Add(p); err != nil {
					t.Fatal(err)
				}
			}
			tr := NewTrust(client.CoreV1(), testingclock.NewFakeClock(time.Now()), quietLog(), nil)
			tr.verified(trustLease())
			tr.Flush(t.Context())
			if ips, ok, _ := tr.verified(trustLease()); ok || len(ips) != 0 {
				t.Fatalf("verified = %v, %v; want refused", ips, ok)
			}
		})
	}
}

// TestTrustStartChecks: between Start and Stop the checker's own
// goroutine answers a verified call's request and asks for a pass; Stop
// waits for it to end.
func TestTrustStartChecks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(trustPod())
		passed := make(chan struct{}, 1)
		tr := NewTrust(client.CoreV1(), clock.RealClock{}, quietLog(), func() { passed <- struct{}{} })
		tr.Start(t.Context())
		tr.verified(trustLease())
		<-passed
		if _, ok, _ := tr.verified(trustLease()); !ok {
			t.Fatal("checked Lease not believed")
		}
		tr.Stop()
		tr.Stop() // a second Stop returns at once
	})
}

// TestTrustInherit: while inheriting, a Lease whose pod the API no longer
// has (none of its name, or another pod of that name) is believed for the inherited addresses among its IPs, and only
// those; a pod that exists is checked as usual (a holder that does not
// host it is refused, inherited or not); once inheriting ends, a gone
// pod's Lease is refused again (the verdicts given stay).
func TestTrustInherit(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	client := fake.NewClientset(trustPod())
	tr := NewTrust(client.CoreV1(), clk, quietLog(), nil)
	ctx := t.Context()
	tr.Inherit(map[netip.Addr]bool{netip.MustParseAddr("10.0.0.8"): true, netip.MustParseAddr("10.0.0.7"): true})

	gone := trustLease()
	gone.Name, gone.PodName, gone.PodUID = k8s.LeaseName("uid-gone"), "web-0", "uid-gone"
	gone.IPs = []netip.Addr{netip.MustParseAddr("10.0.0.8"), netip.MustParseAddr("10.0.0.98")}
	elsewhere := trustLease()
	elsewhere.Holder = "node-c"
	renamed := trustLease() // web-1 is another pod now
	renamed.Name, renamed.PodUID = k8s.LeaseName("uid-web-1-old"), "uid-web-1-old"
	tr.verified(gone)
	tr.verified(elsewhere)
	tr.verified(renamed)
	tr.Flush(ctx)
	if ips, ok, _ := tr.verified(renamed); !ok || !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("10.0.0.7")}) {
		t.Errorf("Lease of a pod whose name another pod has now, while inheriting: %v %v; want the inherited 10.0.0.7", ips, ok)
	}
	if ips, ok, _ := tr.verified(gone); !ok || !slices.Equal(ips, []netip.Addr{netip.MustParseAddr("10.0.0.8")}) {
		t.Errorf("gone pod's Lease while inheriting: %v %v; want only the inherited 10.0.0.8", ips, ok)
	}
	if _, ok, _ := tr.verified(elsewhere); ok {
		t.Error("a Lease whose pod runs on another node was believed from the inherited addresses")
	}

	tr.EndInherit()
	later := *gone
	later.Name, later.PodUID = k8s.LeaseName("uid-later"), "uid-later"
	tr.verified(&later)
	tr.Flush(ctx)
	if _, ok, _ := tr.verified(&later); ok {
		t.Error("a gone pod's Lease was believed after inheriting ended")
	}
	if _, ok, _ := tr.verified(gone); !ok {
		t.Error("the verdict given while inheriting was dropped")
	}
}
