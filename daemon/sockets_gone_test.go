package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// TestGonePeerTouchedRefreshed: an entry a pass that touched its pod wrote
// (not a pass computing the whole set) is refreshed when half its TTL has
// passed, though no other entry is listed.
func TestGonePeerTouchedRefreshed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService(withEndDead("false")))
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		h.goneLeaseFor("a", "pod-a", "node-b", 10*time.Minute, "10.0.0.1")
		h.pass()
		h.pass()
		h.updateService(webService(withEndDead("true"))) // a pass that touches a alone
		h.pass()
		first, ok := sd.Peer("10.0.0.1")
		if !ok {
			t.Fatal("not listed once its Service opted in")
		}
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		h.pass()
		if p, _ := sd.Peer("10.0.0.1"); !p.Expires.After(first.Expires) {
			t.Errorf("not refreshed at half its TTL: %+v, first written %+v", p, first)
		}
	})
}

// TestGonePeersManyTouched: a change that touches more gone pods than
// package gonepeers keeps track of (64; a Service listing 70 of them opts
// out, then in) is written by computing the whole set.
func TestGonePeersManyTouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, sd := newSocketHarness(t)
		h.addService(webService())
		n := 70
		var eps []epSpec
		for i := range n {
			eps = append(eps, onNode(ready(fmt.Sprintf("10.0.1.%d", i+1), fmt.Sprint("p", i)), "node-b"))
		}
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), eps...))
		h.pass()
		for i := range n {
			h.goneLeaseFor(types.UID(fmt.Sprint("p", i)), fmt.Sprint("pod-p", i), "node-b", 10*time.Minute, fmt.Sprintf("10.0.1.%d", i+1))
		}
		h.pass()
		h.pass()
		if got := len(sd.GonePeers()); got != n {
			t.Fatalf("%d gone peers listed, want %d", got, n)
		}
		for _, v := range []string{"false", "true"} {
			h.updateService(webService(withEndDead(v)))
			h.pass()
			if got, want := len(sd.GonePeers()), map[string]int{"false": 0, "true": n}[v]; got != want {
				t.Errorf("%s=%s: %d gone peers listed, want %d", k8s.AnnotationEndDeadConnections, v, got, want)
			}
		}
	})
}

func (h *harness) goneLeaseFor(uid types.UID, name, holder string, d time.Duration, ips ...string) {
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		l := &k8s.Leases{Client: h.client, Namespace: testNS}
		_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: "default", PodName: name, PodUID: uid, IPs: addrs,
			Node: holder, Reason: model.ReasonVanished, Duration: d, State: StateGone}, h.clock.Now())
		return err
	})
}

func (h *harness) updateService(s *corev1.Service) {
	h.do(&h.d.events.services, 1, func(ctx context.Context) error {
		_, err := h.client.CoreV1().Services(s.Namespace).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
}
