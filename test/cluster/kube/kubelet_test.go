package kube

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
)

func TestKubeletRunPodAndReady(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	k := &Kubelet{Client: cs, NodeName: "node-a", NodeIPs: []netip.Addr{netip.MustParseAddr("172.30.0.1")}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-0"}}
	got, err := k.RunPod(ctx, pod, netip.MustParseAddr("10.244.0.10"), netip.MustParseAddr("fd00:244::a"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "node-a" || got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.244.0.10" ||
		len(got.Status.PodIPs) != 2 || got.Status.HostIP != "172.30.0.1" || !podReady(got) {
		t.Fatalf("pod after RunPod: node %q phase %q ips %v host %q ready %t", got.Spec.NodeName, got.Status.Phase, got.Status.PodIPs, got.Status.HostIP, podReady(got))
	}
	if err := k.SetReady(ctx, "default", "web-0", false); err != nil {
		t.Fatal(err)
	}
	got, _ = cs.CoreV1().Pods("default").Get(ctx, "web-0", metav1.GetOptions{})
	if podReady(got) || got.Status.ContainerStatuses[0].Ready {
		t.Errorf("pod still ready after SetReady(false): %+v", got.Status.Conditions)
	}
	if _, err := k.RunPod(ctx, pod); err == nil {
		t.Error("RunPod without IPs succeeded")
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func TestKubeletOnDeletion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mk := func(name, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.PodSpec{NodeName: node}}
	}
	cs := fake.NewClientset(mk("mine", "node-a"), mk("theirs", "node-b"))
	k := &Kubelet{Client: cs, NodeName: "node-a"}
	calls := make(chan string, 10)
	stop, err := k.OnDeletion(ctx, func(_ context.Context, p *corev1.Pod) { calls <- p.Name })
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	markDeleted := func(name string, extra string) {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		now := metav1.Now()
		p.DeletionTimestamp = &now
		p.Annotations = map[string]string{"touch": extra}
		if _, err := cs.CoreV1().Pods("default").Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	markDeleted("theirs", "1")
	markDeleted("mine", "1")
	markDeleted("mine", "2") // a later update of the same terminating pod
	select {
	case name := <-calls:
		if name != "mine" {
			t.Fatalf("handler called for %q, a pod of another node", name)
		}
	case <-ctx.Done():
		t.Fatal("handler not called for the deleted pod")
	}
	// Every update above has been delivered once a later marker arrives.
	if _, err := cs.CoreV1().Pods("default").Create(ctx, mk("marker", "node-a"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	markDeleted("marker", "1")
	if name := <-calls; name != "marker" {
		t.Fatalf("handler called again for %q; want each pod once", name)
	}
}
