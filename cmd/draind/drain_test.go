package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

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
	// The pod's node reports progress on the Lease, then "drained".
	go func() {
		for {
			l, err := c.CoordinationV1().Leases("draind-system").Get(ctx, k8s.LeaseName("uid-a"), metav1.GetOptions{})
			if err == nil {
				l.Annotations[k8s.AnnState] = daemon.StateDraining
				l.Annotations[k8s.AnnProgress] = k8s.FormatProgress(4, 1, 9)
				c.CoordinationV1().Leases("draind-system").Update(ctx, l, metav1.UpdateOptions{})
				time.Sleep(700 * time.Millisecond)
				l.Annotations[k8s.AnnState] = daemon.StateDrained
				l.Annotations[k8s.AnnProgress] = k8s.FormatProgress(4, 0, 12)
				c.CoordinationV1().Leases("draind-system").Update(ctx, l, metav1.UpdateOptions{})
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
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
