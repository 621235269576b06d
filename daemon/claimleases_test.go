package daemon

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// claimLease publishes a claim Lease as node holder's draind would.
func (h *harness) claimLease(uid types.UID, name, holder string, ips ...string) {
	h.t.Helper()
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		l := &k8s.Leases{Client: h.client, Namespace: testNS}
		_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: "default", PodName: name, PodUID: uid, IPs: addrs,
			Node: holder, Reason: "ip-claim", Duration: 30 * time.Second, Claim: true}, h.clock.Now())
		return err
	})
}

// apiLease returns the Lease name from the API, or nil.
func (h *harness) apiLease(name string) *k8s.DrainLease {
	h.t.Helper()
	l, err := h.client.CoordinationV1().Leases(testNS).Get(h.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		h.t.Fatal(err)
	}
	dl, err := k8s.ParseLease(l)
	if err != nil {
		h.t.Fatal(err)
	}
	return dl
}

// TestClaimPublishedForReusedIP: the node of a new pod at an IP that
// another node's drain Lease names publishes a claim Lease it holds, for
// as long as that Lease lives (and again if another node writes it as its
// own), and deletes it then; it never deletes the other node's Lease.
func TestClaimPublishedForReusedIP(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		var foreignDeletes atomic.Int32
		h.client.PrependReactor("delete", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.(k8stesting.DeleteAction).GetName() == k8s.LeaseName("old") {
				foreignDeletes.Add(1)
			}
			return false, nil, nil
		})
		h.lease("old", "default", "pod-old", "node-b", k8s.ReasonPodDeleting, time.Minute, "10.0.0.7")
		h.putPod(pod("pod-new", "new", "10.0.0.7"))
		h.tick(0)
		c := h.apiLease(k8s.ClaimName("new"))
		if c == nil || !c.Claim || c.Holder != testNode || c.PodUID != "new" || len(c.IPs) != 1 || c.IPs[0] != netip.MustParseAddr("10.0.0.7") {
			t.Fatalf("claim Lease %+v", c)
		}
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Fatalf("%d drain Leases: a claim is not a drain", n)
		}
		// Renewed at a third of its duration, as a drain Lease is.
		h.tick(11 * time.Second)
		if c2 := h.apiLease(k8s.ClaimName("new")); c2 == nil || !c2.Renewed.After(c.Renewed) {
			t.Fatalf("claim not renewed: %+v", c2)
		}
		if n := foreignDeletes.Load(); n != 0 {
			t.Fatalf("%d deletes of node-b's Lease", n)
		}
		// node-c writes the claim as its own: this node publishes it again.
		h.claimLease("new", "pod-new", "node-c", "10.0.0.7")
		if c := h.apiLease(k8s.ClaimName("new")); c == nil || c.Holder != "node-c" {
			t.Fatal("node-c's write did not replace the claim")
		}
		h.tick(time.Second)
		if c := h.apiLease(k8s.ClaimName("new")); c == nil || c.Holder != testNode {
			t.Fatal("a pass after node-c wrote the claim, it is not this node's again")
		}
		// node-b ends its drain: the claim has done its work.
		h.deleteLease("old")
		h.tick(0)
		h.tick(0)
		if c := h.apiLease(k8s.ClaimName("new")); c != nil {
			t.Fatalf("claim kept after the drain Lease went: %+v", c)
		}
	})
}

// TestClaimEndsHoldersLinger: the holder of a gone pod's drain Lease
// believes another node's claim of the pod's IP (the claimed pod runs on
// the claim's holder): it stops refusing the IP, ends the linger and
// deletes its own Lease.
func TestClaimEndsHoldersLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		old := h.deletingPod("pod-old", "old", "10.0.0.7")
		h.putPod(old)
		h.tick(0)
		h.deletePod("default", "pod-old")
		h.tick(time.Second)
		h.tick(0)
		if dr, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; !ok || dr.Policy != bpf.PolicyRefuse {
			t.Fatalf("the gone pod's IP is not refused:\n%s", h.describe())
		}
		h.podElsewhere("pod-new", "new", "node-b", "10.0.0.7")
		h.claimLease("new", "pod-new", "node-b", "10.0.0.7")
		h.tick(0)
		h.tick(0)
		if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; ok {
			t.Fatalf("the reused IP is still drained:\n%s", h.describe())
		}
		if l := h.apiLease(k8s.LeaseName("old")); l != nil {
			t.Fatalf("the holder kept its Lease of the gone pod: %+v", l)
		}
		if n := len(h.d.hosted.Progress()); n != 0 {
			t.Fatalf("%d hosted drains left, want the linger ended", n)
		}
	})
}

// TestClaimBystander: a node that neither holds the drain Lease nor hosts
// the new pod stops steering the IP once it believes the claim.
func TestClaimBystander(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.podElsewhere("pod-old", "old", "node-b", "10.0.0.7")
		h.lease("old", "default", "pod-old", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.7")
		h.tick(0)
		if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; !ok {
			t.Fatalf("node-b's drain not honoured:\n%s", h.describe())
		}
		h.deletePod("default", "pod-old")
		h.podElsewhere("pod-new", "new", "node-c", "10.0.0.7")
		h.claimLease("new", "pod-new", "node-c", "10.0.0.7")
		h.tick(0)
		h.tick(0)
		if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; ok {
			t.Fatalf("the reused IP is still drained:\n%s", h.describe())
		}
		// The claim goes with the drain Lease: the IP is nobody's drain.
		h.deleteLease("old")
		h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
			return h.client.CoordinationV1().Leases(testNS).Delete(ctx, k8s.ClaimName("new"), metav1.DeleteOptions{})
		})
		h.tick(0)
		if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; ok {
			t.Fatalf("drained after both Leases went:\n%s", h.describe())
		}
	})
}

// TestClaimForgedIgnored: a claim is believed only from the node that
// hosts the claimed pod, for the pod's own IPs. A claim by another node
// (what a tenant with a draind's credentials, or a compromised node, could
// write under the Lease policy), for a pod that does not exist, or for an
// IP the pod does not have, ends nobody's drain.
func TestClaimForgedIgnored(t *testing.T) {
	for _, tc := range []struct {
		name, holder string
		uid          types.UID
		ips          []string
	}{
		{"from another node", "node-c", "new", []string{"10.0.0.7"}},
		{"for a made-up pod", "node-b", "made-up", []string{"10.0.0.7"}},
		{"for an IP the pod does not have", "node-b", "new", []string{"10.0.0.8", "10.0.0.7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				h.podElsewhere("pod-x", "x", "node-b", "10.0.0.7")
				h.lease("x", "default", "pod-x", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.7")
				h.podElsewhere("pod-new", "new", "node-b", "10.0.0.8")
				h.tick(0)
				if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; !ok {
					t.Fatalf("node-b's drain not honoured:\n%s", h.describe())
				}
				h.claimLease(tc.uid, "pod-new", tc.holder, tc.ips...)
				h.tick(0)
				h.tick(0)
				if _, ok := h.dp.Drains[wildcard("10.0.0.7", bpf.TCP)]; !ok {
					t.Fatalf("a forged claim ended node-b's drain:\n%s", h.describe())
				}
				if h.d.claims.ClaimedByOther(netip.MustParseAddr("10.0.0.7"), "x") {
					t.Fatal("the forged claim is believed")
				}
			})
		})
	}
}

// TestRenewOfDeletedLeaseEndsDrain: a gone pod's drain whose Lease was
// deleted under it (before the informer says so) renews it once, finds it
// gone, and ends: no renewal loop.
func TestRenewOfDeletedLeaseEndsDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		old := h.deletingPod("pod-old", "old", "10.0.0.7")
		h.putPod(old)
		h.tick(0)
		h.deletePod("default", "pod-old")
		h.tick(time.Second)
		var gone atomic.Bool
		var renews atomic.Int32
		gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
		h.client.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if gone.Load() && a.(k8stesting.GetAction).GetName() == k8s.LeaseName("old") {
				renews.Add(1)
				return true, nil, apierrors.NewNotFound(gr, k8s.LeaseName("old"))
			}
			return false, nil, nil
		})
		gone.Store(true)
		for range 20 {
			h.clock.Step(5 * time.Second)
			h.pass()
			h.d.hosted.Reconcile(h.ctx)
			h.d.leaseWriter.Flush(h.ctx)
		}
		if n := renews.Load(); n != 1 {
			t.Fatalf("%d renewals of the deleted Lease, want 1", n)
		}
		if n := len(h.d.hosted.Progress()); n != 0 {
			t.Fatalf("%d hosted drains left, want the drain ended", n)
		}
	})
}
