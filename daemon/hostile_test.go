package daemon

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/k8s"
)

// Hostile input: nothing a tenant or a stranger writes moves or cuts other
// people's traffic, or exhausts the node agent.

// handWritten makes a slice look written by a tenant: no controller label.
func handWritten(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	delete(s.Labels, discoveryv1.LabelManagedBy)
	return s
}

func inNamespace(ns string, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	s.Namespace = ns
	ownedBy(s, s.Labels[discoveryv1.LabelServiceName])
	for i := range s.Endpoints {
		if r := s.Endpoints[i].TargetRef; r != nil {
			r.Namespace = ns
		}
	}
	return s
}

func noSelector(s *corev1.Service) { s.Spec.Selector = nil }

func inNS(ns string) svcOpt { return func(s *corev1.Service) { s.Namespace = ns } }

func ipSteered(h *harness, ip string) []string {
	var out []string
	for _, dr := range mustDump(h.t, h.dp).Drains {
		if dr.Key.Addr == netip.MustParseAddr(ip) {
			out = append(out, fmt.Sprintf("%v %v", dr.Key, dr.Policy))
		}
	}
	return out
}

// victimFixture: tenant B's pod 10.0.5.1 is a ready endpoint of B's own
// Service; tenant A has a Service with its own ready pod 10.0.6.1.
func victimFixture(t *testing.T) *harness {
	h := newHarness(t, func(c *Config) { c.GoneGrace = time.Second })
	h.addService(svc("web-b", []string{"10.96.0.50"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, inNS("b")))
	h.putSlice(inNamespace("b", slice("web-b-1", "web-b", v4, httpPorts(8080), ready("10.0.5.1", "pod-b"))))
	h.addService(svc("web-a", []string{"10.96.0.60"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, inNS("a")))
	h.putSlice(inNamespace("a", slice("web-a-1", "web-a", v4, httpPorts(8080), ready("10.0.6.1", "pod-a"))))
	h.pass()
	return h
}

// TestHostileCrossNamespaceSlice: a slice tenant A writes by hand, listing
// B's pod IP as not ready next to A's own ready pod, never changes where
// connections to B's IP go, and deleting it never expires B's flows.
func TestHostileCrossNamespaceSlice(t *testing.T) {
	for _, tc := range []struct {
		name  string
		slice func() *discoveryv1.EndpointSlice
		svc   []svcOpt
	}{
		{"hand-written slice", func() *discoveryv1.EndpointSlice {
			return handWritten(inNamespace("a", slice("evil", "web-a", v4, httpPorts(8080), notReady("10.0.5.1", "pod-b"), ready("10.0.6.1", "pod-a"))))
		}, nil},
		{"a forged controller label on a Service without a selector", func() *discoveryv1.EndpointSlice {
			return inNamespace("a", slice("evil", "web-x", v4, httpPorts(8080), notReady("10.0.5.1", "pod-b"), ready("10.0.6.1", "pod-a")))
		}, []svcOpt{inNS("a"), noSelector}},
		{"a targetRef into another namespace", func() *discoveryv1.EndpointSlice {
			s := inNamespace("a", slice("evil", "web-a", v4, httpPorts(8080), notReady("10.0.5.1", "pod-b"), ready("10.0.6.1", "pod-a")))
			s.Endpoints[0].TargetRef.Namespace = "b"
			return s
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := victimFixture(t)
				if tc.svc != nil {
					h.addService(svc("web-x", []string{"10.96.0.70"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, tc.svc...))
				}
				evil := tc.slice()
				h.putSlice(evil)
				h.pass()
				if got := ipSteered(h, "10.0.5.1"); len(got) != 0 {
					t.Fatalf("tenant A's slice steers B's pod IP: %v\n%s", got, h.describe())
				}
				// B's established flow survives the slice's deletion.
				h.ct.AddFlow(flowTo("10.0.5.1:8080"))
				h.deleteSlice("a", evil.Name)
				h.pass()
				h.clock.Step(2 * time.Second)
				h.pass()
				h.d.conntrackPolicy.pass(h.ctx)
				for _, call := range h.ct.ExpireCalls() {
					for _, f := range call {
						if f.ReplySrc.Addr() == netip.MustParseAddr("10.0.5.1") {
							t.Fatalf("B's flows expired by A's slice: %+v", f)
						}
					}
				}
			})
		})
	}
}

// TestHostileForgedReadyClaim: a hand-written slice listing B's drained pod
// IP as ready (under another pod) does not void B's drain.
func TestHostileForgedReadyClaim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := victimFixture(t)
		h.putSlice(inNamespace("b", slice("web-b-1", "web-b", v4, httpPorts(8080), terminating("10.0.5.1", "pod-b"), ready("10.0.5.2", "pod-b2"))))
		h.pass()
		if len(ipSteered(h, "10.0.5.1")) == 0 {
			t.Fatalf("B's terminating pod is not steered:\n%s", h.describe())
		}
		h.putSlice(handWritten(inNamespace("a", slice("evil", "web-a", v4, httpPorts(8080), ready("10.0.5.1", "pod-a")))))
		h.pass()
		if len(ipSteered(h, "10.0.5.1")) == 0 {
			t.Fatalf("a tenant's ready listing voided B's drain:\n%s", h.describe())
		}
	})
}

// TestHostileLeaseHolder: a drain Lease is honoured only when its holder is
// the node hosting the pod, and only for the pod's own IPs.
func TestHostileLeaseHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		// node-c claims node-b's pod.
		h.lease("a", "default", "pod-a", "node-c", k8s.ReasonOffline, time.Minute, "10.0.0.1")
		h.pass()
		if got := ipSteered(h, "10.0.0.1"); len(got) != 0 {
			t.Fatalf("a Lease held by a node that does not host the pod drains it: %v", got)
		}
		h.deleteLease("a")
		// node-b names the pod, plus an IP that is not the pod's.
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1", "10.0.9.9")
		h.pass()
		if got := ipSteered(h, "10.0.0.1"); len(got) == 0 {
			t.Fatalf("the hosting node's Lease is not honoured:\n%s", h.describe())
		}
		if got := ipSteered(h, "10.0.9.9"); len(got) != 0 {
			t.Fatalf("a Lease drains an IP that is not its pod's: %v", got)
		}
	})
}

// TestHostileLeaseOfAnotherHolder: a Lease named after a local pod but
// written by another node, before the pod's offline call or over its
// Lease during the drain, is a drain no node honours; this node replaces
// it with its own, so that the drain reaches every node.
func TestHostileLeaseOfAnotherHolder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		name := k8s.LeaseName("p0")
		ours := func(when string) {
			t.Helper()
			l := h.apiLease(name)
			if l == nil {
				t.Fatalf("%s the pod has no Lease", when)
			}
			if l.Holder != testNode || len(l.IPs) != 1 || l.IPs[0] != podIP {
				t.Fatalf("%s the pod's Lease is held by %s for %v, want %s for %v", when, l.Holder, l.IPs, testNode, podIP)
			}
		}
		h.lease("p0", "default", "pod-p0", "node-b", k8s.ReasonOperator, time.Minute, "10.0.0.9")
		h.tick(0)
		if r, ok := h.offline(podIP, 0, 0).result(t); !ok || r.Code != 200 {
			t.Fatalf("the offline call answered %+v (answered %v)", r, ok)
		}
		ours("after the offline call")
		h.lease("p0", "default", "pod-p0", "node-b", k8s.ReasonOperator, time.Minute, "10.0.0.9")
		if l := h.apiLease(name); l == nil || l.Holder != "node-b" {
			t.Fatal("node-b's write did not replace the Lease")
		}
		h.tick(time.Second)
		ours("a pass after node-b replaced it")
	})
}

// TestHostileRegistryOnlyLease: a Lease for a pod no slice lists is honoured
// once the pod's own object confirms the holder and IPs.
func TestHostileRegistryOnlyLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.podElsewhere("nacos-client", "reg", "node-b", "10.0.0.5")
		h.lease("reg", "default", "nacos-client", "node-c", k8s.ReasonOffline, time.Minute, "10.0.0.5")
		h.tick(0)
		h.pass()
		if got := ipSteered(h, "10.0.0.5"); len(got) != 0 {
			t.Fatalf("a registry-only Lease from a node that does not host the pod drains it: %v", got)
		}
		h.deleteLease("reg")
		h.lease("reg", "default", "nacos-client", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.5")
		h.tick(0)
		if got := ipSteered(h, "10.0.0.5"); len(got) != 2 {
			t.Fatalf("the Lease of the pod's own node, verified, drains %v:\n%s", got, h.describe())
		}
	})
}

// TestHostileOwnLeaseFollowsLocalPods: a Lease naming this node as holder
// drains an IP only while this node's pod with the Lease's UID holds it:
// not before the pod is seen here, not once another pod took the IP.
func TestHostileOwnLeaseFollowsLocalPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.lease("a", "default", "pod-a", testNode, k8s.ReasonOffline, time.Minute, "10.0.0.7")
		h.pass()
		if got := ipSteered(h, "10.0.0.7"); len(got) != 0 {
			t.Fatalf("this node's Lease drains an IP none of its pods holds: %v", got)
		}
		h.putPod(pod("pod-a", "a", "10.0.0.7"))
		h.pass()
		if got := ipSteered(h, "10.0.0.7"); len(got) == 0 {
			t.Fatalf("this node's Lease is not honoured once its pod is here:\n%s", h.describe())
		}
		h.deletePod("default", "pod-a")
		h.putPod(pod("pod-z", "z", "10.0.0.7"))
		h.pass()
		if got := ipSteered(h, "10.0.0.7"); len(got) != 0 {
			t.Fatalf("this node's Lease still drains its pod's IP, now another pod's: %v", got)
		}
	})
}

// TestHostileRegistryOnlyLeaseRechecked: a Lease refused because its pod
// was not (yet) found is checked again a few seconds later, with nothing
// else changing, and honoured once the pod confirms it.
func TestHostileRegistryOnlyLeaseRechecked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.lease("reg", "default", "nacos-client", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.5")
		h.tick(0)
		if got := ipSteered(h, "10.0.0.5"); len(got) != 0 {
			t.Fatalf("a Lease no Pod object confirms drains: %v", got)
		}
		h.podElsewhere("nacos-client", "reg", "node-b", "10.0.0.5")
		h.tick(0) // refused a moment ago: not checked again yet
		h.tick(lease.RecheckAfter)
		if got := ipSteered(h, "10.0.0.5"); len(got) != 2 {
			t.Fatalf("the Lease, checked again once its pod exists, drains %v:\n%s", got, h.describe())
		}
	})
}

// TestHostileAnnotationChurnMemory: a churn of large invalid annotation
// values and of whole objects leaves the heap where it started.
func TestHostileAnnotationChurnMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		heap := func() uint64 {
			h.client.ClearActions() // the fake API records every call: not draind's memory
			runtime.GC()
			runtime.GC()
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		base := heap()
		big := strings.Repeat("x", 32<<10)
		for round := 0; round < 8; round++ {
			for i := 0; i < 40; i++ {
				name := fmt.Sprintf("churn-%d", i)
				s := svc(name, []string{fmt.Sprintf("10.96.1.%d", i)}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)},
					withAnnotation(fmt.Sprintf("%s-%d-%d", big, round, i)))
				if round == 0 {
					h.addService(s)
					h.putSlice(slice(name+"-1", name, v4, httpPorts(8080), terminating(fmt.Sprintf("10.1.%d.1", i), name+"a"), ready(fmt.Sprintf("10.1.%d.2", i), name+"b")))
				} else {
					h.do(&h.d.events.services, 1, func(ctx context.Context) error {
						_, err := h.client.CoreV1().Services("default").Update(ctx, s, metav1.UpdateOptions{})
						return err
					})
				}
			}
			h.pass()
		}
		if got := testutilValue(t, h.d.Metrics.PolicyInvalid); got < 8*40 {
			t.Errorf("%v invalid values counted, want every new one", got)
		}
		for i := 0; i < 40; i++ {
			name := fmt.Sprintf("churn-%d", i)
			h.deleteSlice("default", name+"-1")
			h.deleteService("default", name)
		}
		h.pass()
		h.clock.Step(3 * time.Minute) // lingers end
		h.pass()
		after := heap()
		t.Logf("heap: %d KiB at start, %d KiB after the churn", base>>10, after>>10)
		if after > base+2<<20 {
			t.Errorf("the heap grew by %d KiB and stayed", (after-base)>>10)
		}
		// The warnings of the deleted Services are forgotten: the same
		// Services with the values last warned about are warned about anew.
		warned := testutilValue(t, h.d.Metrics.PolicyInvalid)
		for i := 0; i < 40; i++ {
			name := fmt.Sprintf("churn-%d", i)
			h.addService(svc(name, []string{fmt.Sprintf("10.96.1.%d", i)}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)},
				withAnnotation(fmt.Sprintf("%s-%d-%d", big, 7, i))))
		}
		h.pass()
		if got := testutilValue(t, h.d.Metrics.PolicyInvalid) - warned; got != 40 {
			t.Errorf("%v of 40 deleted Services warned about anew: the others' warnings were remembered", got)
		}
	})
}

// TestHostileOfflineConnectionCap: connections beyond the cap are answered
// 503 and closed at once, never queued; the process holds at most the cap,
// and a slot freed is usable again.
func TestHostileOfflineConnectionCap(t *testing.T) {
	f := newHTTPFixture(t, func(c *Config) { c.MaxConnections = 8; c.HeaderTimeout = 30 * time.Second })
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < 8; i++ {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// Polled, here and below: real sockets (httpFixture), no synctest
	// bubble.
	eventually(t, 5*time.Second, "the cap to fill", func() bool { return f.openConnections() == 8 })
	for i := 0; i < 32; i++ {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection %d past the cap was queued, not refused", i)
		}
		if !strings.HasPrefix(string(b), "HTTP/1.1 503 ") {
			t.Fatalf("connection %d past the cap got %q, want a 503", i, b)
		}
	}
	if n := f.openConnections(); n != 8 {
		t.Fatalf("%d connections open, cap 8", n)
	}
	if n := testutilValue(t, f.d.Metrics.OfflineConnsRefused); n != 32 {
		t.Errorf("%v refusals counted, want 32", n)
	}
	conns[0].Close()
	eventually(t, 5*time.Second, "a slot to free", func() bool { return f.openConnections() == 7 })
	if code, _ := f.get(t, http.MethodGet, "/healthz", ""); code != http.StatusOK {
		t.Errorf("a freed slot answered %d", code)
	}
}

// TestHostileSlowBodyAnyPath: slow bodies sent to paths that never read
// them (/healthz, an unknown path, a GET-only path) are cut off after
// BodyTimeout like an offline call's, so clients just below the cap
// cannot keep a pod from its own offline call for longer than that.
func TestHostileSlowBodyAnyPath(t *testing.T) {
	const slow = 15
	f := newHTTPFixture(t, func(c *Config) { c.MaxConnections = slow + 1; c.BodyTimeout = 300 * time.Millisecond })
	paths := []string{"/healthz", "/nowhere", "/readyz", "/v1/online"}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range slow {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab", paths[i%len(paths)])
	}
	// Polled, here and below: real sockets (httpFixture), no synctest
	// bubble.
	eventually(t, 5*time.Second, "the slow clients to connect", func() bool { return f.openConnections() == slow })
	// Every slow connection is closed by the server within a few body
	// timeouts (an answer may come first).
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatalf("slow body to %s held its connection for 5 s", paths[i%len(paths)])
			}
		}
	}
	eventually(t, 5*time.Second, "the slow connections to close", func() bool { return f.openConnections() == 0 })
	// Fill the cap again but one, then the pod's own call goes through.
	for i := range slow {
		c, err := net.Dial("tcp", f.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab", paths[i%len(paths)])
	}
	eventually(t, 5*time.Second, "the slow clients to connect", func() bool { return f.openConnections() == slow })
	start := time.Now()
	f.openConn2("127.0.0.1:8080")
	code, res := f.get(t, http.MethodPost, "/v1/offline", "127.0.0.1")
	if code != http.StatusOK || res.Pod != "default/pod-p0" {
		t.Fatalf("the pod's own offline call beside %d slow clients: %d %+v", slow, code, res)
	}
	t.Logf("offline call answered in %s beside %d slow bodies", time.Since(start).Round(time.Millisecond), slow)
}

var _ = bpf.TCP
var _ = conntrack.TCP

// TestHostileForgedSliceOffNeverRefuses: tenant A's slice that carries the
// controller's label, for A's own selector Service, lists B's ready pod's
// IP with B's pod UID as not ready, and is deleted and written again (the
// EndpointSlice controller removing each copy). Whatever it does, every
// entry for B's IP passes (policy off): B's pod never asked to go offline
// and still serves, so neither the listing nor its departures (a linger)
// may refuse or rewrite connections to it, and B's flows are never
// expired.
func TestHostileForgedSliceOffNeverRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := victimFixture(t)
		h.ct.AddFlow(flowTo("10.0.5.1:8080"))
		forged := func() *discoveryv1.EndpointSlice {
			return inNamespace("a", slice("forged", "web-a", v4, httpPorts(8080), notReady("10.0.5.1", "pod-b"), ready("10.0.6.1", "pod-a")))
		}
		check := func(when string) {
			t.Helper()
			for _, dr := range mustDump(t, h.dp).Drains {
				if dr.Key.Addr == netip.MustParseAddr("10.0.5.1") && dr.Policy != bpf.PolicyOff {
					t.Fatalf("%s: entry %v for B's serving pod has policy %v\n%s", when, dr.Key, dr.Policy, h.describe())
				}
			}
		}
		for round := range 4 {
			h.putSlice(forged())
			h.pass()
			check(fmt.Sprintf("round %d, forged slice present", round))
			h.deleteSlice("a", "forged")
			h.pass()
			check(fmt.Sprintf("round %d, forged slice deleted", round))
			h.clock.Step(2 * time.Second)
			h.pass()
			h.d.conntrackPolicy.pass(h.ctx)
			check(fmt.Sprintf("round %d, after the grace", round))
		}
		for _, call := range h.ct.ExpireCalls() {
			for _, f := range call {
				if f.ReplySrc.Addr() == netip.MustParseAddr("10.0.5.1") {
					t.Fatalf("B's flows expired by the forged slice's departure: %+v", f)
				}
			}
		}
	})
}
