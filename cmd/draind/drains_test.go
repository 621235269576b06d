package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/k8s"
)

var drainsNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// drainsFixture is a cluster with every kind of drain: Leases with new and
// old progress formats, an expired and a malformed Lease, endpoints
// terminating and not ready without a Lease, a ready endpoint and one that
// is not a pod.
func drainsFixture(t *testing.T) *fake.Clientset {
	t.Helper()
	ctx := context.Background()
	c := fake.NewClientset()
	leases := &k8s.Leases{Client: c, Namespace: "draind-system"}
	publishRenewed := func(name, uid, ip, node, reason string, at, renewed time.Time, dur time.Duration, ann map[string]string) {
		t.Helper()
		if _, _, err := leases.Publish(ctx, k8s.DrainRequest{PodNamespace: "shop", PodName: name, PodUID: types.UID(uid),
			IPs: []netip.Addr{netip.MustParseAddr(ip)}, Node: node, Reason: reason, Duration: dur}, at); err != nil {
			t.Fatal(err)
		}
		if ann != nil {
			if _, err := leases.Renew(ctx, k8s.LeaseName(types.UID(uid)), dur, renewed, ann); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish := func(name, uid, ip, node, reason string, at time.Time, dur time.Duration, ann map[string]string) {
		publishRenewed(name, uid, ip, node, reason, at, at, dur, ann)
	}
	publish("cart-a", "uid-a", "10.244.0.11", "node-a", k8s.ReasonOffline, drainsNow.Add(-5*time.Second), 30*time.Second,
		map[string]string{k8s.AnnState: "drained", k8s.AnnProgress: k8s.Progress{SYNs: 12, SYNsLast10s: 0, HasLast10s: true, Live: 0, Steered: 40}.String()})
	publishRenewed("cart-d", "uid-d", "10.244.1.20", "node-b", k8s.ReasonOperator, drainsNow.Add(-90*time.Second), drainsNow.Add(-time.Second), 30*time.Second,
		map[string]string{k8s.AnnState: "draining", k8s.AnnProgress: k8s.FormatProgress(7, 2, 3)}) // a daemon of the older format
	publish("cart-f", "uid-f", "10.244.1.21", "node-b", k8s.ReasonPodDeleting, drainsNow.Add(-2*time.Second), 30*time.Second, nil)
	publish("cart-x", "uid-x", "10.244.1.22", "node-c", k8s.ReasonOffline, drainsNow.Add(-3*time.Minute), 30*time.Second, nil) // not renewed
	bad := &k8s.Leases{Client: c, Namespace: "draind-system"}
	if _, _, err := bad.Publish(ctx, k8s.DrainRequest{PodNamespace: "shop", PodName: "broken", PodUID: "uid-broken",
		IPs: []netip.Addr{netip.MustParseAddr("10.244.9.9")}, Node: "node-z", Duration: time.Minute}, drainsNow); err != nil {
		t.Fatal(err)
	}
	l, _ := c.CoordinationV1().Leases("draind-system").Get(ctx, k8s.LeaseName("uid-broken"), metav1.GetOptions{})
	delete(l.Annotations, k8s.AnnPodIPs) // malformed: every draind ignores it
	if _, err := c.CoordinationV1().Leases("draind-system").Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	tr, fa := true, false
	ep := func(ip, node, name, uid string, ready, terminating bool) discoveryv1.Endpoint {
		n := node
		return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: &n,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &tr, Terminating: &terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: name, UID: types.UID(uid)}}
	}
	notPod := discoveryv1.Endpoint{Addresses: []string{"192.0.2.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &fa}}
	for _, sl := range []*discoveryv1.EndpointSlice{
		{ObjectMeta: metav1.ObjectMeta{Name: "cart-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "cart"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{
				ep("10.244.0.11", "node-a", "cart-a", "uid-a", false, true),
				ep("10.244.1.12", "node-b", "cart-b", "uid-b", false, true),
				ep("10.244.0.13", "node-a", "cart-c", "uid-c", false, false),
				ep("10.244.1.14", "node-b", "cart-e", "uid-e", true, false),
				notPod,
			}},
		{ObjectMeta: metav1.ObjectMeta{Name: "cart-admin-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "cart-admin"}},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{ep("10.244.0.11", "node-a", "cart-a", "uid-a", false, true)}},
	} {
		if _, err := c.DiscoveryV1().EndpointSlices("shop").Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Deleted 4 s ago with a 30 s grace period: the API server sets the
	// deletion timestamp to the end of the grace period.
	del, grace := metav1.NewTime(drainsNow.Add(26*time.Second)), int64(30)
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "cart-b", Namespace: "shop", UID: "uid-b", DeletionTimestamp: &del, DeletionGracePeriodSeconds: &grace}},
		{ObjectMeta: metav1.ObjectMeta{Name: "cart-c", Namespace: "shop", UID: "uid-c"}, Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(drainsNow.Add(-75 * time.Second))}}}},
	} {
		if _, err := c.CoreV1().Pods("shop").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestDrainsGolden(t *testing.T) {
	l := &drainLister{client: drainsFixture(t), leaseNamespace: "draind-system"}
	ds, err := l.list(context.Background(), drainsNow)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range ds {
		names = append(names, d.Name)
	}
	// The ready cart-e, the non-pod endpoint and the malformed Lease are not
	// drains; cart-a appears once although two slices and a Lease list it.
	if got := fmtList(names); got != "cart-a cart-b cart-c cart-d cart-f cart-x" {
		t.Fatalf("drains %s", got)
	}
	a := ds[0]
	if a.Reason != k8s.ReasonOffline || a.State != "drained" || a.Endpoint != reasonTerminating || a.Node != "node-a" ||
		a.Progress == nil || a.Progress.SYNsLast10s == nil || *a.Progress.SYNsLast10s != 0 || a.Progress.SYNs != 12 ||
		fmtList(a.Services) != "shop/cart shop/cart-admin" || !a.Since.Equal(drainsNow.Add(-5*time.Second)) {
		t.Errorf("cart-a: %+v", a)
	}
	if b := ds[1]; b.Reason != reasonTerminating || b.State != "draining" || b.Progress != nil || !b.Since.Equal(drainsNow.Add(-4*time.Second)) {
		t.Errorf("cart-b (terminating, no Lease): %+v", b)
	}
	if c := ds[2]; c.Reason != reasonNotReady || !c.Since.Equal(drainsNow.Add(-75*time.Second)) {
		t.Errorf("cart-c (not ready, no Lease): %+v", c)
	}
	if d := ds[3]; d.State != "draining" || d.Progress == nil || d.Progress.SYNsLast10s != nil || d.Progress.Live != 2 || !d.Since.Equal(drainsNow.Add(-90*time.Second)) {
		t.Errorf("cart-d (older progress format): %+v", d.Progress)
	}
	if f := ds[4]; f.State != "waiting" {
		t.Errorf("cart-f (no state from its node yet): %q", f.State)
	}
	if x := ds[5]; x.State != "expired" {
		t.Errorf("cart-x (not renewed): %q", x.State)
	}
	for _, tc := range []struct{ output, file string }{
		{"", "drains.txt"}, {"wide", "drains-wide.txt"}, {"json", "drains.json"},
	} {
		var b bytes.Buffer
		if err := printDrains(&b, ds, drainsNow, tc.output); err != nil {
			t.Fatal(err)
		}
		golden(t, tc.file, b.Bytes())
	}
	var b bytes.Buffer
	if err := printDrains(&b, nil, drainsNow, ""); err != nil || b.String() != "No drains.\n" {
		t.Errorf("no drains: %q, %v", b.String(), err)
	}
	if err := printDrains(&b, ds, drainsNow, "yaml"); err == nil {
		t.Error("an unknown output format was accepted")
	}
	var doc struct {
		Drains []clusterDrain `json:"drains"`
	}
	b.Reset()
	printDrains(&b, ds, drainsNow, "json")
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil || len(doc.Drains) != len(ds) {
		t.Errorf("json output does not decode to the drains: %v", err)
	}
}

func fmtList(s []string) string {
	var b bytes.Buffer
	for i, x := range s {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(x)
	}
	return b.String()
}
