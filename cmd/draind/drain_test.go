package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/draind/draind/daemon"
	"github.com/draind/draind/k8s"
)

func TestDrainWaitsForTheNodesVerdict(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "cart-a", Namespace: "shop", UID: "uid-a"},
		Spec:       corev1.PodSpec{NodeName: "node-a"},
		Status:     corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "10.244.0.11"}, {IP: "fd00::11"}}},
	})
	o := &drainOptions{leaseNamespace: "draind-system", duration: 30 * time.Second, wait: 20 * time.Second}
	// The pod's node reports progress on the Lease, then "drained": the
	// drain command's first read of the Lease sees progress, its second
	// the verdict (a reactor plays the node at each read, so the test
	// does not depend on timing).
	reads := 0
	c.PrependReactor("get", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := c.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "draind-system", k8s.LeaseName("uid-a"))
		if err != nil {
			return false, nil, nil
		}
		l := obj.(*coordinationv1.Lease).DeepCopy()
		reads++
		l.Annotations[k8s.AnnState] = daemon.StateDraining
		l.Annotations[k8s.AnnProgress] = k8s.FormatProgress(4, 1, 9)
		if reads >= 2 {
			l.Annotations[k8s.AnnState] = daemon.StateDrained
			l.Annotations[k8s.AnnProgress] = k8s.FormatProgress(4, 0, 12)
		}
		return true, l, c.Tracker().Update(coordinationv1.SchemeGroupVersion.WithResource("leases"), l, "draind-system")
	})
	var out bytes.Buffer
	if err := drain(ctx, &out, c, o, "shop", "cart-a"); err != nil {
		t.Fatalf("drain: %v\n%s", err, out.String())
	}
	s := out.String()
	for _, want := range []string{"draining pod shop/cart-a (10.244.0.11,fd00::11) on node node-a", "syns=4 live=1", "drained  syns=4 live=0 steered=12"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	l, err := c.CoordinationV1().Leases("draind-system").Get(ctx, k8s.LeaseName("uid-a"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := k8s.ParseLease(l)
	if err != nil || dl.Reason != k8s.ReasonOperator || dl.Holder != "node-a" || len(dl.IPs) != 2 {
		t.Errorf("lease %+v, %v", dl, err)
	}
	// A second drain joins; undrain ends it.
	out.Reset()
	o.wait = 0
	if err := drain(ctx, &out, c, o, "shop", "cart-a"); err != nil || !strings.Contains(out.String(), "joined") {
		t.Errorf("second drain: %v %q", err, out.String())
	}
}

func TestDrainRefusals(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pending", Namespace: "shop", UID: "u1"}},
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hostnet", Namespace: "shop", UID: "u2"},
			Spec: corev1.PodSpec{HostNetwork: true}, Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: "192.0.2.1"}}}},
	)
	o := &drainOptions{leaseNamespace: "draind-system", duration: time.Minute}
	for name, want := range map[string]string{"pending": "no IP yet", "hostnet": "host network", "missing": "not found"} {
		if err := drain(ctx, &bytes.Buffer{}, c, o, "shop", name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("drain %s: %v, want %q", name, err, want)
		}
	}
}

// TestDrainFlagRefusals: a drain Lease of 0 or less and a negative wait
// stop `draind drain` with an error naming the flag, before any API call;
// the Lease duration defaults to the daemon's.
func TestDrainFlagRefusals(t *testing.T) {
	if f := newDrainCmd().Flags().Lookup("lease-duration"); f.DefValue != daemon.DefaultConfig().LeaseDuration.String() {
		t.Errorf("--lease-duration defaults to %s, daemon.DefaultConfig to %s", f.DefValue, daemon.DefaultConfig().LeaseDuration)
	}
	for _, tc := range []struct{ arg, want string }{
		{"--lease-duration=0", "--lease-duration=0s: must be more than 0"},
		{"--lease-duration=-30s", "--lease-duration=-30s: must be more than 0"},
		{"--wait=-1s", "--wait=-1s: must not be negative"},
	} {
		cmd := newDrainCmd()
		cmd.SetArgs([]string{"--kubeconfig=/nonexistent", tc.arg, "shop/cart-a"})
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.arg, err, tc.want)
		}
	}
}
