package k8s

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func request() DrainRequest {
	return DrainRequest{PodNamespace: "shop", PodName: "cart-a", PodUID: "uid-a",
		IPs:  []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1")},
		Node: "node-a", Reason: ReasonOffline, Duration: 30 * time.Second}
}

// TestLeaseProtocol: the first publisher creates the Lease (holder = the
// hosting node, named after the pod UID), a second joins it keeping the
// reason and acquire time, renewals move the renew time and carry
// progress, delete is idempotent.
func TestLeaseProtocol(t *testing.T) {
	ctx := context.Background()
	c := &Leases{Client: fake.NewClientset(), Namespace: "draind-system"}
	l, created, err := c.Publish(ctx, request(), t0)
	if err != nil || !created {
		t.Fatalf("publish: %v created=%v", err, created)
	}
	if l.Name != "drain-uid-a" || l.Holder != "node-a" || l.Reason != ReasonOffline || len(l.IPs) != 2 ||
		!l.Expires().Equal(t0.Add(30*time.Second)) || !l.Acquired.Equal(t0) {
		t.Fatalf("lease %+v", l)
	}
	// An operator's drain of the same pod joins it.
	op := request()
	op.Reason = ReasonOperator
	l, created, err = c.Publish(ctx, op, t0.Add(5*time.Second))
	if err != nil || created || l.Reason != ReasonOffline || !l.Acquired.Equal(t0) || !l.Renewed.Equal(t0.Add(5*time.Second)) {
		t.Fatalf("join: %+v created=%v err=%v", l, created, err)
	}
	l, err = c.Renew(ctx, l.Name, 20*time.Second, t0.Add(10*time.Second), map[string]string{AnnState: "drained", AnnProgress: FormatProgress(3, 0, 7)})
	if err != nil || l.State != "drained" || l.Progress != "syns=3 live=0 steered=7" || !l.Expires().Equal(t0.Add(30*time.Second)) {
		t.Fatalf("renew: %+v %v", l, err)
	}
	if err := c.Delete(ctx, l.Name); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, l.Name); err != nil {
		t.Errorf("deleting an absent Lease: %v", err)
	}
	if _, err := c.Renew(ctx, l.Name, 0, t0, nil); !apierrors.IsNotFound(err) {
		t.Errorf("renewing a deleted Lease: %v, want not found", err)
	}
	if _, _, err := c.Publish(ctx, DrainRequest{PodUID: "x"}, t0); err == nil {
		t.Error("a drain without IPs was published")
	}
}

// TestPublishReplacesAnotherDrainsLease: a Lease named after the pod that
// describes another drain (another holder or IPs), or that no node can
// parse or watches, is replaced by the pod's own, which counts as
// created; the same drain in another IP order is joined.
func TestPublishReplacesAnotherDrainsLease(t *testing.T) {
	ctx := context.Background()
	other := request()
	other.Node, other.Reason, other.IPs = "node-b", ReasonOperator, []netip.Addr{netip.MustParseAddr("10.0.0.9")}
	malformed := other.Lease("draind-system", t0)
	delete(malformed.Annotations, AnnPodIPs)
	ours := request()
	unwatched := ours.Lease("draind-system", t0)
	delete(unwatched.Labels, LabelDrain)
	fewerIPs := request()
	fewerIPs.IPs = fewerIPs.IPs[:1]
	for name, existing := range map[string]*coordinationv1.Lease{
		"another holder": other.Lease("draind-system", t0),
		"malformed":      malformed,
		"unlabelled":     unwatched,
		"fewer IPs":      fewerIPs.Lease("draind-system", t0),
	} {
		t.Run(name, func(t *testing.T) {
			c := &Leases{Client: fake.NewClientset(existing), Namespace: "draind-system"}
			l, created, err := c.Publish(ctx, request(), t0.Add(time.Second))
			if err != nil || !created {
				t.Fatalf("publish over %s's Lease: %v created=%v", name, err, created)
			}
			if l.Holder != "node-a" || l.Reason != ReasonOffline || len(l.IPs) != 2 || !l.Acquired.Equal(t0.Add(time.Second)) {
				t.Fatalf("the Lease after publishing: %+v", l)
			}
			got, err := c.Client.CoordinationV1().Leases("draind-system").Get(ctx, l.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Labels[LabelDrain] != "true" {
				t.Fatalf("the Lease after publishing is labelled %v: no node watches it", got.Labels)
			}
		})
	}
	t.Run("conflicts while replacing", func(t *testing.T) {
		client := fake.NewClientset(other.Lease("draind-system", t0))
		conflicts := conflictUpdates(client, 2)
		c := &Leases{Client: client, Namespace: "draind-system"}
		if l, created, err := c.Publish(ctx, request(), t0.Add(time.Second)); err != nil || !created || l.Holder != "node-a" || *conflicts != 0 {
			t.Fatalf("publish after conflicts: %v created=%v (%d left)", err, created, *conflicts)
		}
	})
	t.Run("same drain, IPs reordered", func(t *testing.T) {
		c := &Leases{Client: fake.NewClientset(), Namespace: "draind-system"}
		if _, _, err := c.Publish(ctx, request(), t0); err != nil {
			t.Fatal(err)
		}
		again := request()
		again.IPs = []netip.Addr{again.IPs[1], again.IPs[0]}
		l, created, err := c.Publish(ctx, again, t0.Add(time.Second))
		if err != nil || created || !l.Acquired.Equal(t0) {
			t.Fatalf("publishing the same drain again: %+v created=%v err=%v", l, created, err)
		}
	})
}

// conflictUpdates makes the next n Lease updates through client fail with
// a conflict; the count left is returned.
func conflictUpdates(client *fake.Clientset, n int) *int {
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if n > 0 {
			n--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "leases"}, "drain-uid-a", errors.New("stale"))
		}
		return false, nil, nil
	})
	return &n
}

// TestLeaseRenewRetriesConflicts: a concurrent writer (the node updating
// progress while an operator joins) costs a retry, not an error.
func TestLeaseRenewRetriesConflicts(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	c := &Leases{Client: client, Namespace: "draind-system"}
	if _, _, err := c.Publish(ctx, request(), t0); err != nil {
		t.Fatal(err)
	}
	conflicts := conflictUpdates(client, 2)
	if _, err := c.Renew(ctx, "drain-uid-a", 0, t0.Add(time.Second), nil); err != nil || *conflicts != 0 {
		t.Fatalf("renew after conflicts: %v (%d left)", err, *conflicts)
	}
}

// TestPublishJoinReadsOnce: joining a drain in progress reads its Lease
// once and writes it once; when another writer replaces the Lease between
// that read and the write (the write conflicts), the join reads it again
// and decides again: a Lease that now describes another drain is replaced
// by the pod's, not renewed as if it were still the pod's.
func TestPublishJoinReadsOnce(t *testing.T) {
	ctx := context.Background()
	gets := func(client *fake.Clientset) int {
		n := 0
		for _, a := range client.Actions() {
			if a.Matches("get", "leases") {
				n++
			}
		}
		return n
	}
	ours := request()
	client := fake.NewClientset(ours.Lease("draind-system", t0))
	c := &Leases{Client: client, Namespace: "draind-system"}
	l, created, err := c.Publish(ctx, request(), t0.Add(time.Second))
	if err != nil || created || !l.Acquired.Equal(t0) || !l.Renewed.Equal(t0.Add(time.Second)) {
		t.Fatalf("joining: %+v created=%v err=%v", l, created, err)
	}
	if n := gets(client); n != 1 {
		t.Errorf("joining read the Lease %d times, want once", n)
	}

	other := request()
	other.Node, other.Reason = "node-b", ReasonOperator
	client = fake.NewClientset(ours.Lease("draind-system", t0))
	replaced := false
	client.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if replaced {
			return false, nil, nil
		}
		replaced = true
		gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
		if err := client.Tracker().Update(gvr, other.Lease("draind-system", t0), "draind-system"); err != nil {
			return true, nil, err
		}
		return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "leases"}, "drain-uid-a", errors.New("replaced"))
	})
	c = &Leases{Client: client, Namespace: "draind-system"}
	l, created, err = c.Publish(ctx, request(), t0.Add(time.Second))
	if err != nil || !created || l.Holder != "node-a" || !l.Acquired.Equal(t0.Add(time.Second)) {
		t.Fatalf("joining a Lease replaced meanwhile: %+v created=%v err=%v, want node-a's drain in its place", l, created, err)
	}
	if n := gets(client); n != 2 {
		t.Errorf("after a conflict the join read the Lease %d times, want twice", n)
	}
}

func TestParseLeaseRejectsMalformed(t *testing.T) {
	req := request()
	good := req.Lease("draind-system", t0)
	if _, err := ParseLease(good); err != nil {
		t.Fatalf("good lease: %v", err)
	}
	for name, mod := range map[string]func(*coordinationv1.Lease){
		"no uid":           func(l *coordinationv1.Lease) { delete(l.Annotations, AnnPodUID) },
		"name mismatch":    func(l *coordinationv1.Lease) { l.Name = "drain-someone-else" },
		"bad IP":           func(l *coordinationv1.Lease) { l.Annotations[AnnPodIPs] = "10.0.0.1,nope" },
		"no IPs":           func(l *coordinationv1.Lease) { l.Annotations[AnnPodIPs] = " , " },
		"no duration":      func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = nil },
		"zero duration":    func(l *coordinationv1.Lease) { l.Spec.LeaseDurationSeconds = new(int32) },
		"no renew/acquire": func(l *coordinationv1.Lease) { l.Spec.RenewTime, l.Spec.AcquireTime = nil, nil },
	} {
		l := good.DeepCopy()
		mod(l)
		if _, err := ParseLease(l); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Long names do not make invalid labels: they are left out.
	long := request()
	long.PodName = strings.Repeat("a", 100)
	l := long.Lease("draind-system", t0)
	if _, ok := l.Labels[LabelPodName]; ok {
		t.Error("a 100-character label value was written")
	}
	if _, err := ParseLease(l); err != nil {
		t.Errorf("long pod name: %v", err)
	}
}

// TestClaimLease: a claim Lease is named and labelled apart from the pod's
// drain Lease (both may exist), parses as a claim, and a claim whose name
// is not its pod's claim name is malformed.
func TestClaimLease(t *testing.T) {
	ctx := context.Background()
	c := &Leases{Client: fake.NewClientset(), Namespace: "draind-system"}
	r := request()
	r.Claim = true
	l, created, err := c.Publish(ctx, r, t0)
	if err != nil || !created || !l.Claim || l.Name != "claim-uid-a" || l.Holder != "node-a" || len(l.IPs) != 2 {
		t.Fatalf("claim %+v created=%v err=%v", l, created, err)
	}
	if l, _, err := c.Publish(ctx, request(), t0); err != nil || l.Claim || l.Name != "drain-uid-a" {
		t.Fatalf("drain Lease beside the claim: %+v %v", l, err)
	}
	raw := r.Lease("draind-system", t0)
	if raw.Labels[LabelDrain] != LabelClaimValue {
		t.Errorf("claim labels %v", raw.Labels)
	}
	raw.Name = LeaseName(r.PodUID)
	if _, err := ParseLease(raw); err == nil {
		t.Error("a claim named as a drain Lease parsed")
	}
	sel, err := labels.Parse(WatchSelector())
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"true": true, LabelClaimValue: true, "false": false} {
		if sel.Matches(labels.Set{LabelDrain: v}) != want {
			t.Errorf("watch selector %q on %s=%s: want %v", sel, LabelDrain, v, want)
		}
	}
}
