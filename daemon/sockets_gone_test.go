package daemon

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// TestGonePeersTouchedMatchWhole: the gone peers a pass computes again for
// what it saw change (a claim of a gone pod's IP, a Service noted for a
// gone pod) are what the whole computation finds. After each random change
// a pass lists what it touched; a pass that computes the whole set must
// then change no entry. Two gone pods share an IP (c's, reused from e, c
// listed terminating): both want its entry, with different ends (their
// Leases' lengths differ), c's only while api does not opt out, and only c
// is noted for api. One gone pod is dual-stack; the clock moves (entries
// are refreshed, Leases renewed) and some writes fail.
func TestGonePeersTouchedMatchWhole(t *testing.T) {
	for _, seed := range []uint64{18, 2026, 7} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { goneTouchedMatchWhole(t, seed) })
	}
}

func goneTouchedMatchWhole(t *testing.T, seed uint64) {
	h, sd := newSocketHarness(t)
	api := func(v string) *corev1.Service {
		return svc("api", []string{"10.96.0.11"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, withEndDead(v))
	}
	h.addService(webService(withEndDead("true")))
	h.addService(api("true"))
	h.putSlice(slice("api-1", "api", v4, httpPorts(8080), onNode(ready("10.0.0.3", "e"), "node-c")))
	h.pass()
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
	h.putSlice(slice("web-6", "web", v6, httpPorts(8080), onNode(ready("fd00::1", "a"), "node-b")))
	h.putSlice(slice("api-1", "api", v4, httpPorts(8080), onNode(terminating("10.0.0.3", "c"), "node-b"), onNode(ready("10.0.0.4", "d"), "node-b")))
	h.pass()
	leases := map[types.UID]time.Duration{"a": 10 * time.Minute, "b": 10 * time.Minute, "c": 50 * time.Second, "d": 10 * time.Minute, "e": 10 * time.Minute}
	hosts := map[types.UID]string{"a": "node-b", "b": "node-b", "c": "node-b", "d": "node-b", "e": "node-c"}
	addrs := map[types.UID][]string{"a": {"10.0.0.1", "fd00::1"}, "b": {"10.0.0.2"}, "c": {"10.0.0.3"}, "d": {"10.0.0.4"}, "e": {"10.0.0.3"}}
	renew := func() {
		for _, uid := range []types.UID{"a", "b", "c", "d", "e"} {
			h.goneLeaseFor(uid, "pod-"+string(uid), hosts[uid], leases[uid], addrs[uid]...)
		}
	}
	renew()
	h.pass()
	for uid := range leases {
		if pd := h.d.model.podDrains[uid]; pd == nil || pd.State != StateGone {
			t.Fatalf("pod %s: no gone pod drain (%+v)", uid, pd)
		}
	}
	if got := sd.gonePeers(); len(got) != 5 {
		t.Fatalf("gone peers %v, want the 5 IPs", got)
	}
	ips := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "fd00::1"}
	optOut := map[string]bool{}
	rng := rand.New(rand.NewPCG(seed, 2026))
	toggle := func() string {
		name := []string{"web", "api"}[rng.IntN(2)]
		optOut[name] = !optOut[name]
		v := map[bool]string{true: "false", false: "true"}[optOut[name]]
		if name == "web" {
			h.updateService(webService(withEndDead(v)))
		} else {
			h.updateService(api(v))
		}
		return name + " end-dead-connections=" + v
	}
	localAt, renewed := "", h.clock.Now()
	for step := range 250 {
		var did string
		failed := false
		switch rng.IntN(7) {
		case 0: // a pod of this node takes a gone pod's IP, or leaves
			if localAt != "" {
				h.deletePod("default", "local-x")
				localAt = ""
			} else {
				localAt = ips[rng.IntN(len(ips))]
				h.putPod(pod("local-x", "x", localAt))
			}
			did = "local pod at " + localAt
		case 1, 2: // another pod, ready, listed at a gone pod's IP, or not
			name, fam, at := "web-2", v4, ""
			if rng.IntN(2) == 0 {
				name, fam = "web-7", v6
			}
			eps := []epSpec{}
			if rng.IntN(2) == 0 {
				at = ips[rng.IntN(4)]
				if fam == v6 {
					at = "fd00::1"
				}
				eps = append(eps, onNode(ready(at, "z"), "node-d"))
			}
			h.putSlice(slice(name, "web", fam, httpPorts(8080), eps...))
			did = "other pod listed at " + at
		case 3: // a Service opts out of ending sockets, or back in
			did = toggle()
		case 4: // a Service opts out or in, and the write fails
			sd.failUpsert.Store(true)
			failed = true
			did = "failing: " + toggle()
		case 5: // time passes: refreshes come due
			d := time.Duration(rng.IntN(40)) * time.Second
			h.clock.Step(d)
			did = "clock +" + d.String()
		case 6:
			did = "nothing"
		}
		if h.clock.Now().Sub(renewed) > 30*time.Second {
			renew()
			renewed = h.clock.Now()
		}
		h.pass()
		if failed {
			sd.failUpsert.Store(false)
			h.pass()
		}
		got := sd.peersNow()
		h.d.gone.wantYet = false // the next pass computes the whole set
		h.pass()
		if want := sd.peersNow(); !maps.Equal(got, want) {
			t.Fatalf("step %d (%s): the pass listed %v, the whole set is %v", step, did, got, want)
		}
	}
}

// TestGonePeerTouchedRefreshed: an entry a pass that touched its pod wrote
// (not a pass computing the whole set) is refreshed when half its TTL has
// passed, though no other entry is listed.
func TestGonePeerTouchedRefreshed(t *testing.T) {
	h, sd := newSocketHarness(t)
	h.addService(webService(withEndDead("false")))
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
	h.pass()
	h.goneLeaseFor("a", "pod-a", "node-b", 10*time.Minute, "10.0.0.1")
	h.pass()
	h.pass()
	h.updateService(webService(withEndDead("true"))) // a pass that touches a alone
	h.pass()
	first, ok := sd.peer("10.0.0.1")
	if !ok {
		t.Fatal("not listed once its Service opted in")
	}
	h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
	h.pass()
	if p, _ := sd.peer("10.0.0.1"); !p.Expires.After(first.Expires) {
		t.Errorf("not refreshed at half its TTL: %+v, first written %+v", p, first)
	}
}

// TestGonePeersManyTouched: a change that touches more gone pods than
// touched keeps track of (a Service listing 70 of them opts out, then in)
// is written by computing the whole set.
func TestGonePeersManyTouched(t *testing.T) {
	h, sd := newSocketHarness(t)
	h.addService(webService())
	n := maxTouched + 6
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
	if got := len(sd.gonePeers()); got != n {
		t.Fatalf("%d gone peers listed, want %d", got, n)
	}
	for _, v := range []string{"false", "true"} {
		h.updateService(webService(withEndDead(v)))
		h.pass()
		if got, want := len(sd.gonePeers()), map[string]int{"false": 0, "true": n}[v]; got != want {
			t.Errorf("%s=%s: %d gone peers listed, want %d", k8s.AnnotationEndDeadConnections, v, got, want)
		}
	}
}

func (h *harness) goneLeaseFor(uid types.UID, name, holder string, d time.Duration, ips ...string) {
	var addrs []netip.Addr
	for _, ip := range ips {
		addrs = append(addrs, netip.MustParseAddr(ip))
	}
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		l := &k8s.Leases{Client: h.client, Namespace: testNS}
		_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: "default", PodName: name, PodUID: uid, IPs: addrs,
			Node: holder, Reason: ReasonVanished, Duration: d, State: StateGone}, h.clock.Now())
		return err
	})
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
