package daemon

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/daemon/reconcile"
	"github.com/draind/draind/k8s"
)

var (
	v4 = discoveryv1.AddressTypeIPv4
	v6 = discoveryv1.AddressTypeIPv6
)

func httpPorts(p int32) []slicePort { return []slicePort{{"http", p, corev1.ProtocolTCP}} }

func webService(opts ...svcOpt) *corev1.Service {
	return svc("web", []string{"10.96.0.10"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}, opts...)
}

// expect is what the fake datapath should hold after a pass.
type expect struct {
	frontends  map[string][]string // "vip:port" -> sorted backends
	nFrontends int                 // when a VIP:port has several protocols
	noSteer    []string            // frontends that must carry NoSteer
	drains     map[bpf.EndpointKey]bpf.Policy
}

func (h *harness) check(e expect) {
	h.t.Helper()
	d, _ := h.dp.Dump()
	if n := max(e.nFrontends, len(e.frontends)); len(d.Frontends) != n {
		h.t.Errorf("want %d frontends, have:\n%s", len(e.frontends), h.describe())
	}
	for vip, want := range e.frontends {
		ap := netip.MustParseAddrPort(vip)
		got, ok := h.dp.BackendsOfFrontend(ap, bpf.TCP)
		if !ok {
			got, ok = h.dp.BackendsOfFrontend(ap, bpf.UDP)
		}
		if !ok || !slices.Equal(got, aps(want...)) {
			h.t.Errorf("frontend %s: want backends %v, got %v (present %v)\n%s", vip, want, got, ok, h.describe())
		}
	}
	for _, vip := range e.noSteer {
		ap := netip.MustParseAddrPort(vip)
		if fe := h.dp.Frontends[bpf.EndpointKey{Addr: ap.Addr(), Port: ap.Port(), Proto: bpf.TCP}]; !fe.NoSteer {
			h.t.Errorf("frontend %s must not steer", vip)
		}
	}
	if len(d.Drains) != len(e.drains) {
		h.t.Errorf("want %d drains %v, have:\n%s", len(e.drains), e.drains, h.describe())
	}
	for k, p := range e.drains {
		dr, ok := h.dp.Drains[k]
		if !ok || dr.Policy != p {
			h.t.Errorf("drain %v: want %v, got %v (present %v)\n%s", k, p, dr.Policy, ok, h.describe())
		}
		if ok && dr.Policy == bpf.PolicyRewrite {
			if be := h.dp.Backends[dr.Service]; len(be.Backends) == 0 {
				h.t.Errorf("drain %v rewrites to service-port %d which has no backends", k, dr.Service)
			}
		}
	}
}

// TestInvalidPolicyAnnotationWarns: an invalid pod-ip-steering value is
// read as the default (testdata/golden/pod-ip-policy.txtar) and warned
// about once, however often its Service is recomputed; a valid one never.
func TestInvalidPolicyAnnotationWarns(t *testing.T) {
	for value, warnings := range map[string]float64{"refuse": 0, "yes-please": 1} {
		t.Run(value, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				h.addService(webService(withAnnotation(value)))
				h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(terminating("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")))
				h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1")
				h.pass()
				for i := 0; i < 3; i++ {
					h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(terminating("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b"), ready("10.0.0.9", "z")))
					h.pass()
				}
				if got := testutilValue(t, h.d.Metrics.PolicyInvalid); got != warnings {
					t.Errorf("%v invalid-annotation warnings, want %v", got, warnings)
				}
			})
		})
	}
}

func TestServiceDeletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.deleteService("default", "web")
		h.pass()
		h.check(expect{})
		if len(h.dp.Backends) != 0 {
			t.Errorf("backends of a deleted Service remain: %v", h.dp.Backends)
		}
	})
}

func TestMalformedObjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(svc("bad", []string{"not-an-ip"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}))
		bad := slice("bad-1", "bad", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b"))
		bad.Endpoints = append(bad.Endpoints, discoveryv1.Endpoint{Addresses: []string{"300.1.2.3"}}, discoveryv1.Endpoint{})
		h.putSlice(bad)
		h.rawLease(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "drain-x", Namespace: testNS, Labels: map[string]string{k8s.LabelDrain: "true"}}})
		h.pass()
		// The good parts still work; the bad parts are skipped and counted.
		h.check(expect{drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyOff}})
		if n := h.d.inf.Malformed.Load(); n < 3 {
			t.Errorf("malformed objects counted %d, want ≥3 (service IP, slice addresses, lease)", n)
		}
	})
}

// TestPodDrainIdentical: a pass keeps the previous pass's pod drain only if
// it is equal in every field; a field identical does not compare (one added
// later, say) would leave a stale value in the model.
func TestPodDrainIdentical(t *testing.T) {
	base := model.PodDrain{UID: "a", Namespace: "default", Name: "pod-a", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		Reason: k8s.ReasonOffline, Since: time.Unix(100, 0), Expires: time.Unix(200, 0), Holder: "node-b", State: StateDraining}
	same := base
	same.IPs = slices.Clone(base.IPs)
	if !base.Identical(&same) {
		t.Fatal("a copy is not identical")
	}
	fields := reflect.TypeFor[model.PodDrain]()
	for i := range fields.NumField() {
		other := base
		other.IPs = slices.Clone(base.IPs)
		f := reflect.ValueOf(&other).Elem().Field(i)
		switch v := f.Addr().Interface().(type) {
		case *string:
			*v += "x"
		case *types.UID:
			*v += "x"
		case *[]netip.Addr:
			*v = append(*v, netip.MustParseAddr("10.0.0.2"))
		case *time.Time:
			*v = v.Add(time.Second)
		case *bool:
			*v = !*v
		default:
			t.Fatalf("model.PodDrain.%s: a field of a type this test does not change (%s)", fields.Field(i).Name, f.Type())
		}
		if base.Identical(&other) {
			t.Errorf("podDrains differing in %s are identical", fields.Field(i).Name)
		}
	}
}

// TestLeaseExpiry: the next pass is due when a Lease expires (the entries
// expire with it: testdata/golden/lease-expiry.txtar).
func TestLeaseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")))
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, 30*time.Second, "10.0.0.1")
		next := h.d.sync()
		if want := h.clock.Now().Add(30 * time.Second); !next.Equal(want) {
			t.Errorf("next pass at %v, want the Lease's expiry %v", next, want)
		}
		if len(h.dp.Drains) == 0 {
			t.Fatal("lease did not drain")
		}
	})
}

func TestRestartWithLeasesPresent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), onNode(ready("10.0.0.1", "a"), "node-b"), ready("10.0.0.2", "b")))
		h.lease("a", "default", "pod-a", "node-b", k8s.ReasonOffline, time.Minute, "10.0.0.1")
		h.pass()
		want := h.describe()
		// A new daemon over the same API and the same (pinned) maps, plus a
		// leftover entry nobody wants any more.
		stale := bpf.Drain{Key: key("10.9.9.9:80", bpf.TCP), Policy: bpf.PolicyRefuse, Expires: h.clock.Now().Add(time.Minute)}
		h.dp.UpsertDrain(stale)
		h2 := h.restart()
		h2.pass()
		if got := h2.describe(); got != want {
			t.Errorf("after restart:\n%s\nwant:\n%s", got, want)
		}
	})
}

// drainingServices is a harness with n Services, each with one
// terminating and one ready endpoint, after a first pass.
func drainingServices(t *testing.T, n int) *harness {
	t.Helper()
	h := newHarness(t)
	for i := range n {
		name := fmt.Sprintf("web%d", i)
		h.addService(svc(name, []string{fmt.Sprintf("10.96.1.%d", i)}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}))
		h.putSlice(slice(name+"-1", name, v4, httpPorts(8080),
			terminating(fmt.Sprintf("10.0.%d.1", i), name+"-a"), ready(fmt.Sprintf("10.0.%d.2", i), name+"-b")))
	}
	h.pass()
	return h
}

// TestRefreshSpreadOverPasses: the periodic refresh of every entry is
// spread over passes (no pass evaluates more than a batch, so an event never
// waits behind the whole state), and by the end of the round every entry's
// deadline is refreshed.
func TestRefreshSpreadOverPasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const services = 100 // 100 service-ports and 100 drain entries: 200 targets
		h := drainingServices(t, services)
		if n := len(h.dp.Drains); n != services {
			t.Fatalf("%d drain entries, want %d", n, services)
		}
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		passes := 0
		for {
			ops := h.pass()
			passes++
			if ops := h.pass(); ops != 0 { // no batch is due yet
				t.Fatalf("a second pass in the same instant cost %d operations", ops)
			}
			h.clock.Step(reconcile.RefreshStep) // the runner comes back for the next batch
			// A service-port costs at most its backends and its one frontend.
			if ops > 2*reconcile.RefreshBatch {
				t.Fatalf("refresh pass %d cost %d operations, more than a batch of %d targets", passes, ops, reconcile.RefreshBatch)
			}
			if !h.d.reconciler.Refreshing() {
				break
			}
			if passes > 3*services {
				t.Fatal("the refresh round does not end")
			}
		}
		if passes < 2 {
			t.Errorf("the refresh of %d targets took %d pass, want it spread", 2*services, passes)
		}
		checkRefreshed(t, h, h.clock.Now().Add(h.d.cfg.EntryTTL/2))
		if ops := h.pass(); ops != 0 {
			t.Errorf("a pass after the round cost %d operations", ops)
		}
	})
}

func TestResyncMakesNoOperations(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		if ops := h.pass(); ops != 0 {
			t.Fatalf("nothing drains, yet %d datapath operations", ops)
		}
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		// An update that changes nothing the model reads, and passes with no
		// events at all, write nothing.
		s := slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b"))
		s.Annotations = map[string]string{"irrelevant": "x"}
		h.putSlice(s)
		if ops := h.pass(); ops != 0 {
			t.Errorf("a no-op update cost %d datapath operations", ops)
		}
		for i := 0; i < 3; i++ {
			h.clock.Step(time.Second)
			if ops := h.pass(); ops != 0 {
				t.Errorf("an idle pass cost %d datapath operations", ops)
			}
		}
		// Refresh happens only when half the TTL is gone.
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)
		if ops := h.pass(); ops == 0 {
			t.Error("entries were not refreshed before expiring")
		}
		if ops := h.pass(); ops != 0 {
			t.Errorf("a second refresh right after the first cost %d operations", ops)
		}
	})
}

func TestDatapathFailureRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.dp.FailNext = 2
		h.pass()
		if got := testutilValue(t, h.d.Metrics.DatapathErrors.WithLabelValues("other")); got != 2 {
			t.Errorf("datapath errors counted %v, want 2", got)
		}
		h.pass() // the retry
		h.check(expect{frontends: map[string][]string{"10.96.0.10:80": {"10.0.0.2:8080"}},
			drains: map[bpf.EndpointKey]bpf.Policy{key("10.0.0.1:8080", bpf.TCP): bpf.PolicyOff}})
	})
}

func TestFullMapNeverCrashes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.dp.Capacity = 1
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), terminating("10.0.0.3", "c"), ready("10.0.0.2", "b")))
		h.pass()
		if len(h.dp.Drains) != 1 {
			t.Fatalf("want exactly the 1 entry that fits:\n%s", h.describe())
		}
		if got := testutilValue(t, h.d.Metrics.DatapathErrors.WithLabelValues("map_full")); got < 1 {
			t.Errorf("map_full errors %v", got)
		}
		st := h.d.Status(StatusSource{})
		_ = st
		h.dp.Capacity = 0
		h.pass()
		if len(h.dp.Drains) != 2 {
			t.Errorf("after room was made the missing entry was not written:\n%s", h.describe())
		}
	})
}

// departFromWeb1 lists ep, draining, and 10.0.0.2 ready in web's slice
// web-1, then drops ep from it: a pass after each.
func (h *harness) departFromWeb1(ep epSpec) {
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ep, ready("10.0.0.2", "b")))
	h.pass()
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
	h.pass()
}

// TestLingeringStatus: an endpoint of this node that left its slice while
// draining shows as lingering (its datapath:
// testdata/golden/linger-after-departure.txtar).
func TestLingeringStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.departFromWeb1(terminating("10.0.0.1", "a"))
		if ps := h.d.PodStatuses(); len(ps) != 1 || ps[0].State != StateLingering {
			t.Errorf("status during linger: %+v", ps)
		}
	})
}

// peersService stands for a headless Service with publishNotReadyAddresses
// (a StatefulSet's): its slices list a not-ready pod as ready.
func peersService() *corev1.Service {
	return svc("peers", []string{"10.96.0.20"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)})
}

// The same move with the pod also listed ready by another Service
// (publishNotReadyAddresses): its linger in web still ends once web lists
// it ready, and not before, whatever else changes at its IP.
func TestLingerEndsOnlyWhenItsServiceListsItAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.Linger = 2 * time.Minute })
		h.addService(webService())
		h.addService(peersService())
		h.putSlice(slice("peers-1", "peers", v4, httpPorts(8080), ready("10.0.0.1", "a")))
		h.departFromWeb1(notReady("10.0.0.1", "a"))
		k := key("10.0.0.1:8080", bpf.TCP)
		if !h.d.model.Gone().Lingering("a") {
			t.Fatal("no linger after the departure")
		}
		// The IP's ready claims change (peers lists it not ready, then ready
		// again) while web has not listed it again: the linger stays.
		h.putSlice(slice("peers-1", "peers", v4, httpPorts(8080), notReady("10.0.0.1", "a")))
		h.pass()
		h.putSlice(slice("peers-1", "peers", v4, httpPorts(8080), ready("10.0.0.1", "a")))
		h.pass()
		if !h.d.model.Gone().Lingering("a") {
			t.Fatal("linger ended by a change at the IP that is not web listing the pod again")
		}
		h.putSlice(slice("web-2", "web", v4, httpPorts(8080), notReady("10.0.0.1", "a")))
		h.pass()
		if !h.d.model.Gone().Lingering("a") {
			t.Fatal("linger ended while web lists the pod not ready")
		}
		h.putSlice(slice("web-2", "web", v4, httpPorts(8080), ready("10.0.0.1", "a")))
		h.pass()
		if h.d.model.Gone().Lingering("a") || slices.Contains(h.dp.DrainKeys(), k) {
			t.Errorf("linger kept although web lists pod a ready again: drains %v", h.dp.DrainKeys())
		}
	})
}

// A pod in two Services on two ports, deleted: one Service's controller
// drops it more than GoneGrace before the other's. The first departure is
// not withdrawn by the other Service still listing the pod: flows on each
// port are cut once that port's Service let it go.
func TestTCPExpiredPerServiceOfAPodInTwo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.GoneGrace = 5 * time.Second })
		h.addService(webService())
		h.addService(svc("api", []string{"10.96.0.30"}, []corev1.ServicePort{port("http", 90, corev1.ProtocolTCP)}))
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.putSlice(slice("api-1", "api", v4, httpPorts(9090), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
		h.pass()
		h.clock.Step(6 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		calls := h.ct.ExpireCalls()
		if len(calls) != 1 || len(calls[0]) != 1 || calls[0][0].ReplySrc != netip.MustParseAddrPort("10.0.0.1:8080") {
			t.Fatalf("want the flows of 10.0.0.1:8080 expired while api still lists the pod, got %+v", calls)
		}
		h.putSlice(slice("api-1", "api", v4, httpPorts(9090), ready("10.0.0.2", "b")))
		h.pass()
		h.clock.Step(6 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		calls = h.ct.ExpireCalls()
		if len(calls) != 2 || len(calls[1]) != 1 || calls[1][0].ReplySrc != netip.MustParseAddrPort("10.0.0.1:9090") {
			t.Fatalf("want the flows of 10.0.0.1:9090 expired next, got %+v", calls)
		}
	})
}

func TestTCPExpiredOnlyOnceGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.GoneGrace = 5 * time.Second })
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.d.conntrackPolicy.pass(h.ctx)
		for _, call := range h.ct.ExpireCalls() {
			for _, f := range call {
				if f.Proto == 6 {
					t.Fatalf("TCP flows expired while the endpoint still drains: %+v", f)
				}
			}
		}
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.2", "b")))
		goneAt := h.clock.Now()
		h.pass()
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 0 {
			t.Fatalf("expired before the grace period: %d calls", n)
		}
		h.clock.Step(6 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		calls := h.ct.ExpireCalls()
		if len(calls) != 1 || len(calls[0]) != 1 || calls[0][0].Proto != 6 || !calls[0][0].CreatedBefore.Equal(goneAt) ||
			calls[0][0].ReplySrc != netip.MustParseAddrPort("10.0.0.1:8080") {
			t.Fatalf("want one TCP expiry of 10.0.0.1:8080 created before %v, got %+v", goneAt, calls)
		}
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 1 {
			t.Errorf("a departure is expired once, got %d calls", n)
		}
	})
}

// TestTCPKeptWhenTheServiceIsDeleted: a Service deleted with its pods
// (kubectl delete -f) while they terminate: its endpoints did not leave
// because their pods are gone, so their connections are not cut, however
// long after.
func TestTCPKeptWhenTheServiceIsDeleted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.GoneGrace = 5 * time.Second })
		h.addService(webService())
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.deleteService("default", "web")
		h.deleteSlice("default", "web-1")
		h.pass()
		h.clock.Step(time.Minute)
		h.pass()
		h.d.conntrackPolicy.pass(h.ctx)
		for _, call := range h.ct.ExpireCalls() {
			for _, f := range call {
				if f.Proto == 6 {
					t.Fatalf("TCP flows of a terminating pod expired after its Service was deleted: %+v", f)
				}
			}
		}
		h.check(expect{})
	})
}

// A draining pod the EndpointSlice controller moves to another slice, in
// two updates with a pass between them, seems to leave every slice for a
// moment: its TCP flows are not cut when that departure falls due, since a
// slice lists it again. Once it really leaves, they are.
func TestTCPKeptWhenListedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.GoneGrace = 5 * time.Second })
		h.addService(webService())
		h.departFromWeb1(terminating("10.0.0.1", "a")) // departed, as far as the pass can tell
		h.clock.Step(time.Second)
		h.putSlice(slice("web-2", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a")))
		h.pass()
		h.clock.Step(5 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if calls := h.ct.ExpireCalls(); len(calls) != 0 {
			t.Fatalf("TCP flows of a pod listed again expired: %+v", calls)
		}
		h.deleteSlice("default", "web-2")
		goneAt := h.clock.Now()
		h.pass()
		h.clock.Step(6 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		calls := h.ct.ExpireCalls()
		if len(calls) != 1 || len(calls[0]) != 1 || !calls[0][0].CreatedBefore.Equal(goneAt) ||
			calls[0][0].ReplySrc != netip.MustParseAddrPort("10.0.0.1:8080") {
			t.Fatalf("want one TCP expiry of 10.0.0.1:8080 created before %v once it left, got %+v", goneAt, calls)
		}
	})
}

func TestUDPExpiredWhileDraining(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, func(c *Config) { c.UDPReexpire = 10 * time.Second })
		h.addService(svc("dns", []string{"10.96.0.53"}, []corev1.ServicePort{port("dns", 53, corev1.ProtocolUDP)}))
		h.putSlice(slice("dns-1", "dns", v4, []slicePort{{"dns", 53, corev1.ProtocolUDP}}, terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 0 {
			t.Fatalf("UDP flows expired as the drain starts, with replies still on their way: %d calls", n)
		}
		h.clock.Step(udpSettle)
		h.d.conntrackPolicy.pass(h.ctx)
		calls := h.ct.ExpireCalls()
		if len(calls) != 1 || calls[0][0].Proto != 17 || calls[0][0].ReplySrc != netip.MustParseAddrPort("10.0.0.1:53") {
			t.Fatalf("want the UDP flows of 10.0.0.1:53 expired %v after the drain started, got %+v", udpSettle, calls)
		}
		h.clock.Step(time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 1 {
			t.Fatalf("re-expired too early: %d calls", n)
		}
		// Once more after kube-proxy had time to drop the endpoint.
		h.clock.Step(udpFollowUp - time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 2 {
			t.Fatalf("no follow-up expiry: %d calls", n)
		}
		h.clock.Step(5 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 2 {
			t.Fatalf("re-expired too early: %d calls", n)
		}
		h.clock.Step(6 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 3 {
			t.Fatalf("not re-expired while draining: %d calls", n)
		}
		// A failing table is retried, counted, and never blocks a pass.
		h.ct.FailNext(1, nil)
		h.clock.Step(11 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if got := testutilValue(t, h.d.Metrics.CTErrors); got != 1 {
			t.Errorf("conntrack errors %v, want 1", got)
		}
		h.pass()
		h.clock.Step(2 * time.Second)
		h.d.conntrackPolicy.pass(h.ctx)
		if n := len(h.ct.ExpireCalls()); n != 5 {
			t.Errorf("failed expiry not retried: %d calls", n)
		}
	})
}

// TestRefreshPaceWithRarePasses: passes rarer than a refresh step (events
// scarce, or --min-sync-interval) take a batch per step elapsed, so a
// round ends as soon as it would with a pass every step.
func TestRefreshPaceWithRarePasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const services = 100 // 200 targets: 13 batches
		h := drainingServices(t, services)
		h.clock.Step(h.d.cfg.EntryTTL/2 + time.Second)       // every entry due
		if ops := h.pass(); ops > 2*reconcile.RefreshBatch { // the round starts: one batch
			t.Fatalf("the round's first pass cost %d operations, more than a batch", ops)
		}
		if !h.d.reconciler.Refreshing() {
			t.Fatal("a round of 200 targets ended in one pass")
		}
		h.clock.Step(20 * reconcile.RefreshStep)
		h.pass() // 20 batches' worth: the rest
		if h.d.reconciler.Refreshing() {
			t.Errorf("the round did not end in a pass 20 steps later")
		}
		checkRefreshed(t, h, h.clock.Now().Add(h.d.cfg.EntryTTL/2))
	})
}

// TestRefreshRoundOverrunFinishesAtOnce: when a refresh round is not
// finished by the time the next begins (passes too rare for the batch:
// --min-sync-interval), the next pass refreshes the whole round, so no
// entry runs out of its TTL for want of a turn.
func TestRefreshRoundOverrunFinishesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const services = 100
		h := drainingServices(t, services)
		h.clock.Step(h.d.cfg.EntryTTL/4 + time.Second)
		h.pass() // the round starts: one batch
		if !h.d.reconciler.Refreshing() {
			t.Fatal("a round of 200 targets ended in one pass")
		}
		h.clock.Step(h.d.cfg.EntryTTL/4 + time.Second)
		h.pass() // the next round begins before the first ended
		if h.d.reconciler.Refreshing() {
			t.Error("an overrun round was not finished in one pass")
		}
		checkRefreshed(t, h, h.clock.Now().Add(h.d.cfg.EntryTTL-time.Second))
	})
}

// checkRefreshed fails for every entry that expires before fresh.
func checkRefreshed(t *testing.T, h *harness, fresh time.Time) {
	t.Helper()
	for k, d := range h.dp.Drains {
		if d.Expires.Before(fresh) {
			t.Errorf("drain %v not refreshed: expires %v", k, d.Expires)
		}
	}
	for k, f := range h.dp.Frontends {
		if f.Expires.Before(fresh) {
			t.Errorf("frontend %v not refreshed: expires %v", k, f.Expires)
		}
	}
	for id, b := range h.dp.Backends {
		if b.Expires.Before(fresh) {
			t.Errorf("backends of %d not refreshed: expires %v", id, b.Expires)
		}
	}
}

// TestSharedEndpointRewritesInKeyOrder: a drained pod that two Services
// list rewrites connections to its IP to the Service first by name,
// whichever of them started steering first (and so got the lower
// service-port id): a restarted daemon writes the same entry.
func TestSharedEndpointRewritesInKeyOrder(t *testing.T) {
	for _, first := range []string{"a", "b"} {
		t.Run(first+" first", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t)
				h.lease("p0", "default", "pod-p0", "node-b", k8s.ReasonOffline, time.Hour, "10.0.0.1")
				for i, name := range []string{first, map[string]string{"a": "b", "b": "a"}[first]} {
					h.addService(svc(name, []string{fmt.Sprintf("10.96.0.%d", 20+i)}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}))
					h.putSlice(slice(name+"-1", name, v4, httpPorts(8080), onNode(ready("10.0.0.1", "p0"), "node-b"),
						onNode(ready(fmt.Sprintf("10.0.1.%d", 1+i), "q"+name), "node-b")))
					h.pass()
				}
				dr, ok := h.dp.Drains[key("10.0.0.1:8080", bpf.TCP)]
				if !ok || dr.Policy != bpf.PolicyRewrite {
					t.Fatalf("the drained pod's entry is %+v (present %v), want a rewrite:\n%s", dr, ok, h.describe())
				}
				to := ""
				for _, sp := range h.d.model.ServicePortStatuses() {
					if sp.ID == dr.Service {
						to = sp.Service
					}
				}
				if to != "default/a" {
					t.Fatalf("the drained pod's entry rewrites to %q, want default/a:\n%s", to, h.describe())
				}
			})
		})
	}
}
