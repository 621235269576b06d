package daemon

import (
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// withHints sets the hints of a slice's endpoints by address, as the
// EndpointSlice controller writes them.
func withHints(s *discoveryv1.EndpointSlice, hints map[string]*discoveryv1.EndpointHints) *discoveryv1.EndpointSlice {
	for i := range s.Endpoints {
		s.Endpoints[i].Hints = hints[s.Endpoints[i].Addresses[0]]
	}
	return s
}

func forZone(z string) *discoveryv1.EndpointHints {
	return &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: z}}}
}

// TestTopologyDatapath: the fake datapath's backends of a PreferSameZone
// Service follow this node's zone label, read from its Node, and change
// when the label does.
func TestTopologyDatapath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, Labels: map[string]string{corev1.LabelTopologyZone: "zone-a"}}}
		if _, err := h.client.CoreV1().Nodes().Create(h.ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		h.d.followZone(h.ctx)
		t.Cleanup(h.d.zoneLoop.Stop)
		vip := netip.MustParseAddrPort("10.96.0.10:80")
		// backendsAfter steps the clock by step, lets the zone loop read
		// the zone label (until then the model keeps the zone it had, and
		// steering picks what that zone's hints give), runs a pass and
		// checks the VIP's backends.
		backendsAfter := func(zone string, step time.Duration, want ...string) {
			t.Helper()
			h.clock.Step(step)
			synctest.Wait()
			h.pass()
			if got, ok := h.dp.BackendsOfFrontend(vip, bpf.TCP); !ok || !slices.Equal(got, aps(want...)) {
				t.Fatalf("with the zone label %s: backends %v (frontend present %v), want %v", zone, got, ok, want)
			}
		}
		h.addService(webService())
		h.putSlice(withHints(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), onNode(ready("10.0.0.2", "b"), "n2"),
			onNode(ready("10.0.0.3", "c"), "n3"), onNode(ready("10.0.0.4", "e"), "n4")),
			map[string]*discoveryv1.EndpointHints{"10.0.0.1": forZone("zone-a"), "10.0.0.2": forZone("zone-a"), "10.0.0.3": forZone("zone-b"), "10.0.0.4": forZone("zone-b")}))
		backendsAfter("zone-a", 0, "10.0.0.2:8080")
		h.check(expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.2:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyOff}})

		node.Labels[corev1.LabelTopologyZone] = "zone-b"
		if _, err := h.client.CoreV1().Nodes().Update(h.ctx, node, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		backendsAfter("zone-b", zoneRefresh, "10.0.0.3:8080", "10.0.0.4:8080")
		h.check(expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.3:8080", "10.0.0.4:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyOff}})
	})
}

// TestAffinityClientIP: a Service with sessionAffinity ClientIP keeps
// kube-proxy's choice, whatever drains: its frontends never steer, so a
// client keeps its affinity backend (with kube-proxy's timeout) and
// kube-proxy moves it off an endpoint once the endpoint is not ready.
// The set the fake datapath holds (accounting only) is still the
// topology's.
func TestAffinityClientIP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		eps   []epSpec
		lease bool
		want  []string
	}{
		{"a terminating endpoint", []epSpec{terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")}, false, []string{"10.0.0.2:8080"}},
		{"a pod gone offline, still ready", []epSpec{onNode(ready("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")}, true, []string{"10.0.0.2:8080"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				h.addService(webService(func(s *corev1.Service) {
					s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
					timeout := int32(60)
					s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
				}))
				h.putSlice(slice("web-1", "web", v4, httpPorts(8080), tc.eps...))
				if tc.lease {
					h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1")
				}
				h.pass()
				if _, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]; !ok {
					t.Fatalf("10.0.0.1 does not drain:\n%s", h.describe())
				}
				fe, ok := h.dp.Frontends[key("10.96.0.10:80", bpf.TCP)]
				if !ok || !fe.NoSteer {
					t.Errorf("the VIP of a ClientIP Service steers (frontend present %v):\n%s", ok, h.describe())
				}
				if got, _ := h.dp.BackendsOfFrontend(netip.MustParseAddrPort("10.96.0.10:80"), bpf.TCP); !slices.Equal(got, aps(tc.want...)) {
					t.Errorf("backends %v, want %v", got, tc.want)
				}
			})
		})
	}
}
