package daemon

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/k8s"
)

// Faults: steering never lapses through draind's own restart, an API
// server outage, or the reuse of a departed pod's IP by any pod.

// restartFixture builds a cluster state with every kind of entry: a
// terminating endpoint (ClusterIP frontend + pod-IP rewrite), a Lease-drained
// still-Ready pod of a second Service, a headless Service with a terminating
// endpoint (policy off), a registry-only Lease, and a quiet Service.
func restartFixture(h *harness) {
	h.addService(webService())
	h.addService(svc("api", []string{"10.96.0.20"}, []corev1.ServicePort{port("http", 90, corev1.ProtocolTCP)}))
	h.addService(svc("db", nil, []corev1.ServicePort{port("sql", 5432, corev1.ProtocolTCP)}, func(s *corev1.Service) {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
	}))
	h.addService(svc("quiet", []string{"10.96.0.30"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}))
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b"), ready("10.0.0.3", "c")))
	h.putSlice(slice("api-1", "api", v4, httpPorts(9090), onNode(ready("10.0.1.1", "d"), "node-b"), ready("10.0.1.2", "e")))
	h.putSlice(slice("db-1", "db", v4, []slicePort{{"sql", 5432, corev1.ProtocolTCP}}, terminating("10.0.2.1", "f"), ready("10.0.2.2", "g")))
	h.putSlice(slice("quiet-1", "quiet", v4, httpPorts(8080), ready("10.0.3.1", "h")))
	h.lease("d", "default", "pod-d", "node-b", k8s.ReasonOffline, time.Minute, "10.0.1.1")
	h.podElsewhere("nacos-client", "reg", "node-b", "10.0.4.1")
	h.lease("reg", "default", "nacos-client", "node-b", k8s.ReasonOffline, time.Minute, "10.0.4.1")
}

// restartFixtureChange moves the fixture on: web's drained pod recovers, a
// second api pod terminates.
func restartFixtureChange(h *harness) {
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), ready("10.0.0.2", "b"), ready("10.0.0.3", "c")))
	h.putSlice(slice("api-1", "api", v4, httpPorts(9090), onNode(ready("10.0.1.1", "d"), "node-b"), terminating("10.0.1.2", "e"), ready("10.0.1.3", "i")))
}

// normalized renders a datapath with service-port ids replaced by what they
// resolve to, so that states written under different ids compare equal.
func normalized(d *bpf.Dump) string {
	be := map[bpf.ServicePortID][]netip.AddrPort{}
	for _, b := range d.Backends {
		be[b.Service] = b.Backends
	}
	var lines []string
	for _, f := range d.Frontends {
		lines = append(lines, fmt.Sprintf("frontend %v nosteer=%v -> %v", f.Key, f.NoSteer, be[f.Service]))
	}
	for _, dr := range d.Drains {
		target := ""
		if dr.Policy == bpf.PolicyRewrite {
			target = fmt.Sprint(be[dr.Service])
		}
		lines = append(lines, fmt.Sprintf("drain %v %v %s", dr.Key, dr.Policy, target))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// strength is how firmly an entry keeps connections away from a draining
// endpoint: 2 steers or refuses, 1 is present but lets connections through,
// 0 is absent.
type dpState struct {
	frontends map[bpf.EndpointKey]bpf.Frontend
	backends  map[bpf.ServicePortID]int
	drains    map[bpf.EndpointKey]bpf.Drain
}

func stateOf(d *bpf.Dump) *dpState {
	s := &dpState{frontends: map[bpf.EndpointKey]bpf.Frontend{}, backends: map[bpf.ServicePortID]int{}, drains: map[bpf.EndpointKey]bpf.Drain{}}
	for _, f := range d.Frontends {
		s.frontends[f.Key] = f
	}
	for _, b := range d.Backends {
		s.backends[b.Service] = len(b.Backends)
	}
	for _, dr := range d.Drains {
		s.drains[dr.Key] = dr
	}
	return s
}

func (s *dpState) apply(op datapathtest.Op) {
	switch op.Kind {
	case datapathtest.OpUpsertFrontend:
		s.frontends[op.Frontend.Key] = op.Frontend
	case datapathtest.OpDeleteFrontend:
		delete(s.frontends, op.Key)
	case datapathtest.OpSetBackends:
		s.backends[op.Backends.Service] = len(op.Backends.Backends)
	case datapathtest.OpDeleteBackends:
		delete(s.backends, op.Service)
	case datapathtest.OpUpsertDrain:
		s.drains[op.Drain.Key] = op.Drain
	case datapathtest.OpDeleteDrain:
		delete(s.drains, op.Key)
	}
}

func (s *dpState) frontendStrength(k bpf.EndpointKey) int {
	f, ok := s.frontends[k]
	switch {
	case !ok:
		return 0
	case f.NoSteer || s.backends[f.Service] == 0:
		return 1
	}
	return 2
}

func (s *dpState) drainStrength(k bpf.EndpointKey) int {
	d, ok := s.drains[k]
	switch {
	case !ok:
		return 0
	case d.Policy == bpf.PolicyRefuse, d.Policy == bpf.PolicyRewrite && s.backends[d.Service] > 0:
		return 2
	}
	return 1
}

// checkNoLapse replays ops over before and fails if any instant weakens an
// entry that is wanted at the end and was already in force before.
func checkNoLapse(t *testing.T, what string, before *bpf.Dump, ops []datapathtest.Op, after *bpf.Dump) {
	t.Helper()
	s, end := stateOf(before), stateOf(after)
	type watched struct {
		fe   bool
		k    bpf.EndpointKey
		want int
	}
	var ws []watched
	for k := range end.frontends {
		if st := min(s.frontendStrength(k), end.frontendStrength(k)); st > 0 {
			ws = append(ws, watched{true, k, st})
		}
	}
	for k := range end.drains {
		if st := min(s.drainStrength(k), end.drainStrength(k)); st > 0 {
			ws = append(ws, watched{false, k, st})
		}
	}
	for i, op := range ops {
		s.apply(op)
		for _, w := range ws {
			got := s.drainStrength(w.k)
			if w.fe {
				got = s.frontendStrength(w.k)
			}
			if got < w.want {
				t.Fatalf("%s: operation %d (%s) weakened %v from %d to %d; operations:\n%s", what, i, op, w.k, w.want, got, opsString(ops))
			}
		}
	}
}

func opsString(ops []datapathtest.Op) string {
	var b strings.Builder
	for i, op := range ops {
		fmt.Fprintf(&b, "  %d %s\n", i, op)
	}
	return b.String()
}

// TestFaultRestartAdoptsIDs: a plain restart writes nothing but refreshes,
// and never deletes an entry the new daemon wants (the adopted service-port
// ids are kept, not replaced by fresh ones).
func TestFaultRestartAdoptsIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		restartFixture(h)
		h.pass()
		want := normalized(mustDump(t, h.dp))
		before := mustDump(t, h.dp)

		_, ops := h.restartAndPass()
		after := mustDump(t, h.dp)
		if got := normalized(after); got != want {
			t.Fatalf("after restart:\n%s\nwant:\n%s\noperations:\n%s", got, want, opsString(ops))
		}
		checkNoLapse(t, "restart", before, ops, after)
		for _, op := range ops {
			if op.Kind != datapathtest.OpUpsertFrontend && op.Kind != datapathtest.OpUpsertDrain && op.Kind != datapathtest.OpSetBackends {
				t.Errorf("a restart over an up-to-date datapath deleted something: %s\n%s", op, opsString(ops))
			}
		}
		if d := mustDump(t, h.dp); !sameIDs(before, d) {
			t.Errorf("service-port ids changed across the restart:\nbefore %v\nafter  %v", idsOf(before), idsOf(d))
		}
	})
}

// TestFaultRestartAtAnyInstant kills the daemon after every possible number
// of datapath operations of its passes (a first pass, then a pass over a
// changed cluster) and checks that the restarted daemon converges to the
// right state without weakening, at any instant, an entry it also wants.
func TestFaultRestartAtAnyInstant(t *testing.T) {
	// Count the operations of an uninterrupted run.
	var total int
	var want string
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		restartFixture(h)
		total = h.pass()
		restartFixtureChange(h)
		total += h.pass()
		want = normalized(mustDump(t, h.dp))
	})
	if total < 10 {
		t.Fatalf("fixture too small: %d operations", total)
	}
	for crash := 0; crash <= total; crash++ {
		t.Run(fmt.Sprintf("crash-after-%d", crash), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				restartFixture(h)
				h.dp.CrashAfter(crash)
				h.pass()
				restartFixtureChange(h)
				h.pass()
				h.dp.Recover()
				before := mustDump(t, h.dp)

				h2, ops := h.restartAndPass()
				after := mustDump(t, h.dp)
				if got := normalized(after); got != want {
					t.Fatalf("after a crash at operation %d and a restart:\n%s\nwant:\n%s\noperations:\n%s", crash, got, want, opsString(ops))
				}
				checkNoLapse(t, fmt.Sprintf("restart after a crash at operation %d", crash), before, ops, after)
				// A second pass has nothing left to do.
				if n := h2.pass(); n != 0 {
					t.Errorf("%d operations in the pass after the restart", n)
				}
			})
		})
	}
}

// restartAndPass restarts the daemon (restart) and runs the new one's
// first pass, returning it and the datapath operations of that pass.
func (h *harness) restartAndPass() (*harness, []datapathtest.Op) {
	h.t.Helper()
	h2 := h.restart()
	h.dp.StartLog()
	h2.pass()
	return h2, h.dp.StopLog()
}

func mustDump(t *testing.T, dp Datapath) *bpf.Dump {
	t.Helper()
	d, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func idsOf(d *bpf.Dump) map[bpf.EndpointKey]bpf.ServicePortID {
	out := map[bpf.EndpointKey]bpf.ServicePortID{}
	for _, f := range d.Frontends {
		out[f.Key] = f.Service
	}
	return out
}

func sameIDs(a, b *bpf.Dump) bool { return maps.Equal(idsOf(a), idsOf(b)) }

// outage makes every Lease call of the fake API fail (or succeed again).
func (h *harness) outage(on bool) {
	h.apiDown.Store(on)
}

// TestFaultAPIOutageHostingNode: an API server outage longer than the Lease
// never ends the drain on the node hosting the pod: its waiter stays, its
// steering stays, nothing is adopted and cancelled in a loop, and the Lease
// is renewed as soon as the API answers again.
func TestFaultAPIOutageHostingNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t, func(c *Config) { c.LeaseDuration = 30 * time.Second })
		call := h.offline(podIP, 5*time.Minute, 2*time.Second)
		h.openConn() // keeps the pod from counting as drained
		h.tick(0)
		drains := h.dp.DrainKeys()
		if !slices.Contains(drains, key("10.0.0.1:8080", bpf.TCP)) {
			t.Fatalf("not drained before the outage:\n%s", h.describe())
		}
		h.outage(true)
		// 80 s without the API (more than twice the Lease), in steps of the
		// local loop.
		for i := 0; i < 400; i++ {
			h.clock.Step(200 * time.Millisecond)
			h.pass()
			h.d.hosted.Reconcile(h.ctx)
			h.d.leaseWriter.Flush(h.ctx)
		}
		if r, answered := call.answered(t); answered {
			t.Fatalf("the waiter was answered during the outage: %+v", r)
		}
		if got := h.dp.DrainKeys(); !slices.Contains(got, key("10.0.0.1:8080", bpf.TCP)) {
			t.Fatalf("the hosting node dropped its own steering during the outage:\n%s", h.describe())
		}
		if n := testutilValue(t, h.d.Metrics.DrainOutcomes.WithLabelValues("cancelled")); n != 0 {
			t.Errorf("%v drains cancelled during the outage", n)
		}
		if ld := h.hostedDrain("p0"); ld == nil || ld.State != StateDraining {
			t.Fatalf("local drain during the outage: %+v", ld)
		}
		// The API is back: the Lease is renewed at the next retry.
		h.outage(false)
		back := h.clock.Now()
		h.tick(lease.RetryMax)
		h.waitLeases(1)
		l := h.d.state.DrainLeases()[0]
		if l.Renewed.Before(back) || !l.Expires().After(back) {
			t.Fatalf("the Lease was not renewed when the API came back: renewed %v, now %v", l.Renewed, back)
		}
		// It still ends as a drain should.
		h.closeConns()
		h.tick(3 * time.Second)
		if r, ok := call.result(t); !ok || r.Code != 200 || !r.Drained {
			t.Fatalf("after the outage: %+v answered=%v", r, ok)
		}
	})
}

// TestFaultAPIOutageRecreatesLease: a Lease that could not be created (the
// offline call came during the outage), or was lost, is recreated as soon
// as the API answers.
func TestFaultAPIOutageRecreatesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t, func(c *Config) { c.LeaseDuration = 30 * time.Second })
		p := h.deletingPod("pod-p0", "p0", "10.0.0.1")
		h.outage(true)
		h.putPod(p) // deleted during the outage: the drain starts locally
		h.tick(0)
		if !slices.Contains(h.dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
			t.Fatalf("a deleting pod is not steered on its own node during an outage:\n%s", h.describe())
		}
		for i := 0; i < 10; i++ {
			h.tick(time.Second)
		}
		h.outage(false)
		h.tick(lease.RetryMax)
		h.waitLeases(1)
		if l := h.d.state.DrainLeases()[0]; l.PodUID != "p0" || l.Holder != testNode {
			t.Fatalf("lease %+v", l)
		}
	})
}

// TestFaultAPIOutageRetriesLeaseDelete: the Lease of a gone pod whose linger
// ends during an outage is deleted once the API is back.
func TestFaultAPIOutageRetriesLeaseDelete(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t, func(c *Config) { c.Linger = 10 * time.Second })
		p := h.deletingPod("pod-p0", "p0", "10.0.0.1")
		h.putPod(p)
		h.tick(0)
		h.waitLeases(1)
		h.deletePod("default", "pod-p0")
		h.tick(time.Second)
		h.outage(true)
		for i := 0; i < 30; i++ {
			h.tick(time.Second)
		}
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Fatalf("%d leases during the outage", n)
		}
		h.outage(false)
		h.tick(time.Second)
		h.tick(time.Second)
		h.waitLeases(0)
	})
}

// TestFaultAPIOutageRemoteNode: a node that does not host the pod fails open
// when the Lease expires (the hosting node may be gone for good), and
// steers again at the first pass after the hosting node renewed it.
func TestFaultAPIOutageRemoteNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, 30*time.Second, "10.0.0.1")
		h.pass()
		steered := expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.2:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyRewrite,
				wildcard("10.0.0.1", bpf.TCP): bpf.PolicyOff, wildcard("10.0.0.1", bpf.UDP): bpf.PolicyOff}}
		h.check(steered)
		h.clock.Step(31 * time.Second)
		h.pass()
		h.check(expect{})
		// node-b renews it once the API answers.
		h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
			_, err := (&k8s.Leases{Client: h.client, Namespace: testNS}).Renew(ctx, k8s.LeaseName("a"), 30*time.Second, h.clock.Now(), nil)
			return err
		})
		h.pass()
		h.check(steered)
	})
}

// TestFaultIPReuseByPodInNoService: a departed pod's IP lingers on a remote
// node; the hosting node sees a new pod (in no Service) take the IP and
// deletes the old pod's Lease; the remote node ends the linger at once.
func TestFaultIPReuseByPodInNoService(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "old"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		// node-b: pod "old" is deleted; its draind publishes the Lease.
		h.lease("old", "default", "pod-old", "node-b", k8s.ReasonPodDeleting, 30*time.Second, "10.0.0.1")
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(terminating("10.0.0.1", "old"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		// Gone from the slice: it lingers here.
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		if !slices.Contains(h.dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
			t.Fatalf("no linger after departure:\n%s", h.describe())
		}
		// node-b: a pod in no Service now has 10.0.0.1; node-b deletes the
		// Lease of "old". Nothing else tells this node.
		h.deleteLease("old")
		h.pass()
		for _, k := range h.dp.DrainKeys() {
			if k.Addr == netip.MustParseAddr("10.0.0.1") {
				t.Fatalf("10.0.0.1 still steered after its new owner was announced:\n%s", h.describe())
			}
		}
	})
}

// TestFaultIPReuseLeaseDeleteRetried: the hosting node's delete of the stale
// Lease is retried until it lands.
func TestFaultIPReuseLeaseDeleteRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.lease("old", "default", "pod-old", testNode, k8s.ReasonPodDeleting, time.Minute, "10.0.0.7")
		h.outage(true)
		h.putPod(pod("pod-new", "new", "10.0.0.7"))
		h.tick(0)
		h.tick(time.Second)
		if n := len(h.d.state.DrainLeases()); n != 1 {
			t.Fatalf("%d leases during the outage", n)
		}
		h.outage(false)
		h.tick(time.Second)
		h.waitLeases(0)
	})
}

// TestFaultHeadlessPodGoneNotRefused: a headless Service's pods are not
// interchangeable (policy off); once such a pod is gone its IP is not
// refused for the linger either.
func TestFaultHeadlessPodGoneNotRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		h.addService(svc("db", nil, []corev1.ServicePort{port("sql", 5432, corev1.ProtocolTCP)}, func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
		}))
		sql := []slicePort{{"sql", 5432, corev1.ProtocolTCP}}
		h.putSlice(slice("db-1", "db", v4, sql, onNode(ready("10.0.2.1", "f"), "node-b"), onNode(ready("10.0.2.2", "g"), "node-b")))
		h.lease("f", "default", "pod-f", "node-b", k8s.ReasonPodDeleting, time.Minute, "10.0.2.1")
		h.putSlice(slice("db-1", "db", v4, sql, onNode(terminating("10.0.2.1", "f"), "node-b"), onNode(ready("10.0.2.2", "g"), "node-b")))
		h.pass()
		h.putSlice(slice("db-1", "db", v4, sql, onNode(ready("10.0.2.2", "g"), "node-b")))
		h.pass()
		for _, dr := range mustDump(t, h.dp).Drains {
			if dr.Key.Addr == netip.MustParseAddr("10.0.2.1") && dr.Policy != bpf.PolicyOff {
				t.Fatalf("a gone headless pod's IP is %v:\n%s", dr.Policy, h.describe())
			}
		}
	})
}

// TestFaultRemoteStatusShowsGone: a node that does not host a pod shows it
// lingering once it left every slice, not draining.
func TestFaultRemoteStatusShowsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonPodDeleting, time.Minute, "10.0.0.1")
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(terminating("10.0.0.1", "a"), "node-b"), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		if ps := h.d.PodStatuses(); len(ps) != 1 || ps[0].State != StateDraining {
			t.Fatalf("status while draining: %+v", ps)
		}
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.2", "b"), "node-b")))
		h.pass()
		if ps := h.d.PodStatuses(); len(ps) != 1 || ps[0].State != StateLingering {
			t.Fatalf("status of a gone pod on a remote node: %+v", ps)
		}
	})
}

// TestFaultUDPReexpiredAfterKubeProxy: kube-proxy drops a terminating
// endpoint from its rules a moment after the slice says so; a datagram in
// between re-pins a connected UDP socket to the draining pod. The flows are
// expired again once kube-proxy has had time to sync, not only 10 s later.
func TestFaultUDPReexpiredAfterKubeProxy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.UDPReexpire = 10 * time.Second })
		h.addService(svc("dns", []string{"10.96.0.53"}, []corev1.ServicePort{port("dns", 53, corev1.ProtocolUDP)}))
		h.putSlice(slice("dns-1", "dns", v4, []slicePort{{"dns", 53, corev1.ProtocolUDP}}, terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.clock.Step(udpSettle)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 1 {
			t.Fatalf("%d expiries %v after the drain started", n, udpSettle)
		}
		h.clock.Step(udpFollowUp)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 2 {
			t.Fatalf("UDP flows not expired again %v after the first expiry: %d calls", udpFollowUp, n)
		}
		if udpFollowUp >= 10*time.Second {
			t.Fatalf("follow-up %v is no sooner than the periodic pass", udpFollowUp)
		}
	})
}

// drainingElsewhere is a harness after a pass over web's pod a (10.0.0.1)
// draining on node-b, offline by its Lease, and b ready here.
func drainingElsewhere(t *testing.T) *harness {
	h := newHarness(t)
	h.addService(webService())
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(terminating("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")))
	h.podElsewhere("pod-a", "a", "node-b", "10.0.0.1")
	h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1")
	h.pass()
	return h
}

// TestRestartKeepsGonePodOfAnotherNode: a pod of another node drained,
// left its Service and was deleted; a draind that starts over the pinned
// maps cannot confirm its gone Lease from the cluster any more, yet keeps
// its address steered as before the restart (rewritten to the Service,
// refused on other ports), until the Lease is deleted. A gone Lease the
// pinned maps did not steer is not honoured.
func TestRestartKeepsGonePodOfAnotherNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := drainingElsewhere(t)
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
		h.deletePod("default", "pod-a")
		h.goneLeaseUpdate("a", "10.0.0.1")
		h.pass()
		want := normalized(mustDump(t, h.dp))
		if !strings.Contains(want, "drain 10.0.0.1:8080/TCP rewrite [10.0.0.2:8080]") {
			t.Fatalf("before the restart:\n%s", want)
		}
		// Gone while no draind ran here: never steered, not confirmable.
		h.goneLeaseFor("z", "pod-z", "node-b", time.Minute, "10.0.0.9")

		h2, ops := h.restartAndPass()
		// The first pass drains it as a vanished endpoint of web: the rewrite
		// stays; its other ports pass for that one pass (web lists it).
		if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, "drain 10.0.0.1:8080/TCP rewrite [10.0.0.2:8080]") {
			t.Fatalf("after the restart:\n%s\nwant the rewrite of:\n%s\noperations:\n%s", got, want, opsString(ops))
		}
		for _, op := range ops {
			if op.Kind == datapathtest.OpDeleteDrain {
				t.Errorf("the restart deleted an entry: %s", op)
			}
		}
		// From the next pass (the one it asks for) it lingers as a departed
		// endpoint, as before the restart.
		h2.pass()
		if got := normalized(mustDump(t, h.dp)); got != want {
			t.Fatalf("a pass after the restart:\n%s\nwant:\n%s", got, want)
		}
		if ps := h2.d.PodStatuses(); !slices.ContainsFunc(ps, func(p PodStatus) bool { return p.State == StateLingering }) {
			t.Errorf("no lingering pod after the restart: %+v", ps)
		}
		h2.deleteLease("a")
		h2.pass()
		if got := normalized(mustDump(t, h.dp)); strings.Contains(got, "10.0.0.1") {
			t.Errorf("still steered after its Lease was deleted:\n%s", got)
		}
	})
}

// TestRestartKeepsDepartureSeenByNoOne: a draining pod of another node
// left its Service while draind was down here (its Pod object still
// exists); the restarted draind finds a pod no slice lists, yet rewrites
// its address to the Service as the pinned entry did (lingering from the
// next pass), rather than refusing it as a pod no Service lists.
func TestRestartKeepsDepartureSeenByNoOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := drainingElsewhere(t)
		const rewrite = "drain 10.0.0.1:8080/TCP rewrite [10.0.0.2:8080]"
		if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, rewrite) {
			t.Fatalf("before the restart:\n%s", got)
		}
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b"))) // no pass: draind is down

		h2 := h.restart()
		for i := range 2 {
			h2.pass()
			if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, rewrite) {
				t.Fatalf("pass %d after the restart:\n%s\nwant %q", i+1, got, rewrite)
			}
		}
		if ps := h2.d.PodStatuses(); !slices.ContainsFunc(ps, func(p PodStatus) bool { return p.State == StateLingering }) {
			t.Errorf("no lingering pod after the restart: %+v", ps)
		}
	})
}

// goneLocalRewrite is the entry of goneWhileDown's pod once it is gone.
const goneLocalRewrite = "drain 10.0.0.1:8080/TCP rewrite [10.0.0.2:8080]"

// goneWhileDown: localFixture's pod p0 is deleted and drains (its Lease
// published, its entries pinned, not steering yet: it still serves); then,
// with h's draind taken as down, it leaves its slice and its object goes.
func goneWhileDown(t *testing.T, h *harness) *harness {
	t.Helper()
	h.putPod(h.deletingPod("pod-p0", "p0", "10.0.0.1"))
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
	h.tick(0)
	h.waitLeases(1)
	if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, "drain 10.0.0.1:8080/TCP off") {
		t.Fatalf("the draining pod, before the restart:\n%s", got)
	}
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.2", "p1"), "node-b")))
	h.deletePod("default", "pod-p0")
	return h
}

// TestRestartKeepsGoneLocalPod: a pod of this node is deleted and its
// drain begins (its address rewritten to the Service); draind restarts,
// and while none runs the pod drains, leaves its Service and is deleted.
// The restarted draind finds its Lease and no pod of its UID on the node,
// and keeps the pinned rewrite, lingering, as a pod of another node gone
// while draind was down, until the Lease is deleted: a stale caller's
// connection to the address never goes to the dead address.
func TestRestartKeepsGoneLocalPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := goneWhileDown(t, localFixture(t))
		h2, ops := h.restartAndPass()
		if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, goneLocalRewrite) {
			t.Fatalf("after the restart:\n%s\nwant %q; operations:\n%s", got, goneLocalRewrite, opsString(ops))
		}
		h2.pass()
		if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, goneLocalRewrite) {
			t.Fatalf("a pass after the restart:\n%s\nwant %q", got, goneLocalRewrite)
		}
		if ps := h2.d.PodStatuses(); !slices.ContainsFunc(ps, func(p PodStatus) bool { return p.Local && p.State == StateGone && p.UID == "p0" }) {
			t.Errorf("the pod is not gone, steered, after the restart: %+v", ps)
		}
		h2.deleteLease("p0") // draind undrain
		h2.tick(0)
		h2.pass()
		if got := normalized(mustDump(t, h.dp)); strings.Contains(got, "10.0.0.1") {
			t.Errorf("still steered after its Lease was deleted:\n%s", got)
		}
	})
}

// TestRestartGoneLocalPodLingersFromRestart: the drain of a pod of this
// node gone while no draind ran ends --linger after the restart, and its
// Lease is deleted then.
func TestRestartGoneLocalPodLingersFromRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := goneWhileDown(t, localFixture(t, func(c *Config) { c.Linger = 20 * time.Second }))
		h2, _ := h.restartAndPass()
		h2.tick(10 * time.Second)
		if got := normalized(mustDump(t, h.dp)); !strings.Contains(got, goneLocalRewrite) {
			t.Fatalf("10 s after the restart:\n%s\nwant %q", got, goneLocalRewrite)
		}
		h2.tick(11 * time.Second)
		h2.tick(0)
		h2.waitLeases(0)
		h2.pass()
		if got := normalized(mustDump(t, h.dp)); strings.Contains(got, "10.0.0.1") {
			t.Errorf("still steered after the linger:\n%s", got)
		}
	})
}

// TestRestartAdoptsOnlyHeldLeases: a Lease of this node for a pod it does
// not have, whose addresses no pinned entry held (no draind here acted on
// it), adopts nothing at a restart: nothing steers its address.
func TestRestartAdoptsOnlyHeldLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		h.lease("z", "default", "pod-z", testNode, k8s.ReasonOffline, time.Minute, "10.0.0.9")
		h2, _ := h.restartAndPass()
		h2.tick(0)
		if got := normalized(mustDump(t, h.dp)); strings.Contains(got, "10.0.0.9") {
			t.Errorf("a Lease no draind acted on steers after a restart:\n%s", got)
		}
		if ld := h2.hostedDrain("z"); ld != nil {
			t.Errorf("adopted: %+v", ld)
		}
	})
}
