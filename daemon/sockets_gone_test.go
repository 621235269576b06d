package daemon

import (
	"context"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// TestGonePeersTouchedMatchWhole: the gone peers a pass computes again for
// what it saw change (a claim of a gone pod's IP, a Service noted for a
// gone pod) are what the whole computation finds. After each random change
// a pass lists what it touched; a pass that computes the whole set must
// then change nothing. Two gone pods share an IP (c's, reused from e, c
// listed terminating): both want its entry, c's only while api does not
// opt out, and only c is noted for api.
func TestGonePeersTouchedMatchWhole(t *testing.T) {
	h, sd := newSocketHarness(t)
	api := func(v string) *corev1.Service {
		return svc("api", []string{"10.96.0.11"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, withEndDead(v))
	}
	h.addService(webService(withEndDead("true")))
	h.addService(api("true"))
	h.putSlice(slice("api-1", "api", v4, httpPorts(8080), onNode(ready("10.0.0.3", "e"), "node-c")))
	h.pass()
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
	h.putSlice(slice("api-1", "api", v4, httpPorts(8080), onNode(terminating("10.0.0.3", "c"), "node-b"), onNode(ready("10.0.0.4", "d"), "node-b")))
	h.pass()
	h.goneLease("a", "pod-a", "node-b", "10.0.0.1")
	h.goneLease("b", "pod-b", "node-b", "10.0.0.2")
	h.goneLease("c", "pod-c", "node-b", "10.0.0.3")
	h.goneLease("d", "pod-d", "node-b", "10.0.0.4")
	h.goneLease("e", "pod-e", "node-c", "10.0.0.3")
	h.pass()
	for _, uid := range []string{"a", "b", "c", "d", "e"} {
		if pd := h.d.model.podDrains[types.UID(uid)]; pd == nil || pd.State != StateGone {
			t.Fatalf("pod %s: no gone pod drain (%+v)", uid, pd)
		}
	}
	if got := sd.gonePeers(); len(got) != 4 {
		t.Fatalf("gone peers %v, want the 4 IPs", got)
	}
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}
	optOut := map[string]bool{}
	rng := rand.New(rand.NewPCG(18, 2026))
	localAt, otherAt := "", ""
	for step := range 300 {
		var did string
		switch rng.IntN(4) {
		case 0: // a pod of this node takes a gone pod's IP, or leaves
			if localAt != "" {
				h.deletePod("default", "local-x")
				localAt = ""
			} else {
				localAt = ips[rng.IntN(len(ips))]
				h.putPod(pod("local-x", "x", localAt))
			}
			did = "local pod at " + localAt
		case 1: // another pod, ready, listed at a gone pod's IP, or not
			otherAt = ""
			eps := []epSpec{}
			if rng.IntN(2) == 0 {
				otherAt = ips[rng.IntN(len(ips))]
				eps = append(eps, onNode(ready(otherAt, "z"), "node-d"))
			}
			h.putSlice(slice("web-2", "web", v4, httpPorts(8080), eps...))
			did = "other pod listed at " + otherAt
		case 2, 3: // a Service opts out of ending sockets, or back in
			name := []string{"web", "api"}[rng.IntN(2)]
			optOut[name] = !optOut[name]
			v := map[bool]string{true: "false", false: "true"}[optOut[name]]
			if name == "web" {
				h.updateService(webService(withEndDead(v)))
			} else {
				h.updateService(api(v))
			}
			did = name + " end-dead-connections=" + v
		}
		h.pass()
		got := sd.peersNow()
		h.d.gone.wantYet = false // the next pass computes the whole set
		h.pass()
		if want := sd.peersNow(); !maps.Equal(got, want) {
			t.Fatalf("step %d (%s): the pass listed %v, the whole set is %v", step, did, got, want)
		}
	}
}

func (h *harness) updateService(s *corev1.Service) {
	h.do(&h.d.events.services, 1, func(ctx context.Context) error {
		_, err := h.client.CoreV1().Services(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
}

// peersNow is a copy of the listed gone peers.
func (f *fakeSockets) peersNow() map[netip.Addr]bpf.GonePeer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.peers)
}
