package embedded

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
)

func testPod(name, node, ip string, ready, deleting bool) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID("uid-" + name), Labels: map[string]string{"app": "web"}},
		Spec:       corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "fd00::1"}, {IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}},
	}
	if ready {
		p.Status.Conditions[0].Status = corev1.ConditionTrue
	}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	return p
}

func testService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web"},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.11", Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
}

func TestDesiredSliceConditions(t *testing.T) {
	other := testPod("other", "n", "10.0.0.9", true, false)
	other.Labels = map[string]string{"app": "db"}
	done := testPod("done", "n", "10.0.0.8", false, false)
	done.Status.Phase = corev1.PodSucceeded
	pods := []*corev1.Pod{
		testPod("b-ready", "n1", "10.0.0.2", true, false),
		testPod("a-terminating", "n2", "10.0.0.1", true, true),
		testPod("c-notready", "n1", "10.0.0.3", false, false),
		other, done,
	}
	sl := desiredSlice(testService(), pods)
	type cond struct {
		addr                        string
		ready, serving, terminating bool
	}
	var got []cond
	for _, e := range sl.Endpoints {
		got = append(got, cond{e.Addresses[0], *e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating})
	}
	want := []cond{
		{"10.0.0.1", false, true, true}, // deleted, still Ready: serving and terminating
		{"10.0.0.2", true, true, false},
		{"10.0.0.3", false, false, false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("endpoints %+v, want %+v", got, want)
	}
	if sl.Labels[discoveryv1.LabelServiceName] != "web" || *sl.Ports[0].Port != 8080 || *sl.Ports[0].Name != "http" {
		t.Errorf("slice metadata or ports wrong: %+v %+v", sl.Labels, sl.Ports)
	}
	headless := testService()
	headless.Spec.Selector = nil
	if desiredSlice(headless, pods) != nil {
		t.Error("a Service without selector got a slice")
	}
}

func TestProxyRulesUseServingTerminatingOnlyWithoutReady(t *testing.T) {
	svc := testService()
	mk := func(pods ...*corev1.Pod) []*discoveryv1.EndpointSlice {
		return []*discoveryv1.EndpointSlice{desiredSlice(svc, pods)}
	}
	vip := netip.MustParseAddrPort("10.96.0.11:80")
	for _, tc := range []struct {
		name string
		sls  []*discoveryv1.EndpointSlice
		want []string
	}{
		{"ready only", mk(testPod("a", "n", "10.0.0.1", true, true), testPod("b", "n", "10.0.0.2", true, false)), []string{"10.0.0.2:8080"}},
		{"no ready: serving terminating", mk(testPod("a", "n", "10.0.0.1", true, true), testPod("c", "n", "10.0.0.3", false, false)), []string{"10.0.0.1:8080"}},
		{"nothing", mk(testPod("c", "n", "10.0.0.3", false, true)), nil},
	} {
		rules := proxyRules([]*corev1.Service{svc}, tc.sls)
		if len(rules) != 1 || rules[0].vip != vip {
			t.Fatalf("%s: rules %+v", tc.name, rules)
		}
		var got []string
		for _, ep := range rules[0].endpoints {
			got = append(got, ep.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: endpoints %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestNATServicesKeepEveryServicePort(t *testing.T) {
	eps := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:8080"), netip.MustParseAddrPort("10.0.0.2:8080")}
	got := natServices([]serviceRule{{chain: "DEMO-SVC-A", vip: netip.MustParseAddrPort("10.96.0.11:80"), endpoints: eps},
		{chain: "DEMO-SVC-EMPTY", vip: netip.MustParseAddrPort("10.96.0.12:80")}})
	// A port without endpoints stays in the list: bed.NAT gives it no rule
	// (TestPrivilegedNATSyncReplacesTable checks the kernel's table).
	if len(got) != 2 || got[0].VIP.String() != "10.96.0.11:80" || !slices.Equal(got[0].Endpoints, eps) || got[0].Proto != "tcp" ||
		got[1].VIP.String() != "10.96.0.12:80" || len(got[1].Endpoints) != 0 {
		t.Errorf("NAT services %+v", got)
	}
}

// TestNodeViewFiltersPodsByNode: the fake API ignores field selectors; the
// view each daemon gets must not.
func TestNodeViewFiltersPodsByNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	api := fake.NewClientset()
	for _, p := range []*corev1.Pod{testPod("a", "n1", "10.0.0.1", true, false), testPod("b", "n2", "10.0.0.2", true, false)} {
		if _, err := api.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", "n1").String()}
	view := nodeView{api}
	l, err := view.CoreV1().Pods("").List(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 1 || l.Items[0].Name != "a" {
		t.Fatalf("list with spec.nodeName=n1: %d pods", len(l.Items))
	}
	w, err := view.CoreV1().Pods("").Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for _, p := range []*corev1.Pod{testPod("c", "n2", "10.0.0.3", true, false), testPod("d", "n1", "10.0.0.4", true, false)} {
		if _, err := api.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		select {
		case e := <-w.ResultChan():
			p := e.Object.(*corev1.Pod)
			if p.Spec.NodeName != "n1" {
				t.Fatalf("watch delivered pod %s of node %s", p.Name, p.Spec.NodeName)
			}
			if e.Type == watch.Added && p.Name == "d" {
				return
			}
		case <-ctx.Done():
			t.Fatal("pod d of n1 never arrived on the watch")
		}
	}
}

func TestLevelHandlerDropsBelowLevel(t *testing.T) {
	var b strings.Builder
	c := Config{Log: slogTo(&b)}
	c.defaults()
	c.DaemonLog.Info("hidden")
	c.DaemonLog.Warn("shown")
	if strings.Contains(b.String(), "hidden") || !strings.Contains(b.String(), "shown") {
		t.Errorf("daemon log: %q", b.String())
	}
}

func slogTo(b *strings.Builder) *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }
