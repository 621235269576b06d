package model

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// catEndpoint builds a slim endpoint for categorisation tables.
func catEndpoint(ip, uid, node string, conds uint8) k8s.Endpoint {
	return k8s.Endpoint{Addr: netip.MustParseAddr(ip), Conds: conds, Node: node, PodUID: types.UID(uid), PodName: "pod-" + uid}
}

const (
	condReady       = k8s.CondReady | k8s.CondServing
	condTerminating = k8s.CondServing | k8s.CondTerminating
	condNotReady    = uint8(0)
)

func catSlice(fam k8s.Family, port uint16, proto bpf.Protocol, eps ...k8s.Endpoint) *k8s.Slice {
	return apiSlice(&k8s.Slice{Service: "web", Controller: true, Family: fam, Ports: []k8s.SlicePort{{Name: "http", Port: port, Protocol: proto}}},
		catServiceUID, eps...)
}

const catServiceUID = "uid-web"

func catService(mod ...func(*k8s.Service)) *k8s.Service {
	s := &k8s.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10")},
		Ports: []k8s.ServicePort{{Name: "http", Port: 80, Protocol: bpf.TCP}}, HasSelector: true}
	s.Namespace, s.Name, s.UID = "default", "web", catServiceUID
	for _, m := range mod {
		m(s)
	}
	return s
}

// TestCategorize tables the pure categorisation: which endpoints are
// selectable, which drain and why, per service-port and family.
func TestCategorize(t *testing.T) {
	leaseExp := time.Date(2026, 11, 29, 12, 0, 30, 0, time.UTC)
	drains := map[types.UID]*PodDrain{"d": {UID: "d", Reason: k8s.ReasonOffline, Expires: leaseExp, IPs: addrs("10.0.0.1")}}
	type want struct {
		selectable []string
		draining   map[string]string // endpoint -> reason
		frontends  []string
		expires    map[string]time.Time
	}
	for _, tc := range []struct {
		name   string
		svc    *k8s.Service
		slices []*k8s.Slice
		want   []want // per service-port, in order (v4 before v6)
	}{
		{"all ready", catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
			catEndpoint("10.0.0.1", "a", "n1", condReady), catEndpoint("10.0.0.2", "b", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.1:8080", "10.0.0.2:8080"}, frontends: []string{"10.96.0.10:80"}}}},
		{"terminating and not ready drain with their reason", catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
			catEndpoint("10.0.0.1", "a", "n1", condTerminating), catEndpoint("10.0.0.2", "b", "n1", condNotReady),
			catEndpoint("10.0.0.3", "c", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.3:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.1:8080": ReasonTerminating, "10.0.0.2:8080": ReasonNotReady}}}},
		{"ready with terminating set is not ready (kube-proxy)", catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
			catEndpoint("10.0.0.1", "a", "n1", condReady|k8s.CondTerminating), catEndpoint("10.0.0.2", "b", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.2:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.1:8080": ReasonTerminating}}}},
		{"a pod drain drains a ready endpoint until the Lease expires", catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
			catEndpoint("10.0.0.1", "d", "n1", condReady), catEndpoint("10.0.0.2", "b", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.2:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.1:8080": k8s.ReasonOffline},
				expires:  map[string]time.Time{"10.0.0.1:8080": leaseExp}}}},
		{"a pod drain of a terminating endpoint has no Lease deadline", catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
			catEndpoint("10.0.0.1", "d", "n1", condTerminating), catEndpoint("10.0.0.2", "b", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.2:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.1:8080": k8s.ReasonOffline}, expires: map[string]time.Time{"10.0.0.1:8080": {}}}}},
		{"internalTrafficPolicy Local: only this node's endpoints are selectable",
			catService(func(s *k8s.Service) { s.InternalLocal = true }), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
				catEndpoint("10.0.0.1", "a", "this-node", condReady), catEndpoint("10.0.0.2", "b", "n2", condReady),
				catEndpoint("10.0.0.3", "c", "this-node", condTerminating))},
			[]want{{selectable: []string{"10.0.0.1:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.3:8080": ReasonTerminating}}}},
		{"an endpoint in two slices drains if either says so", catService(), []*k8s.Slice{
			catSlice(k8s.IPv4, 8080, bpf.TCP, catEndpoint("10.0.0.1", "a", "n1", condReady), catEndpoint("10.0.0.2", "b", "n1", condReady)),
			catSlice(k8s.IPv4, 8080, bpf.TCP, catEndpoint("10.0.0.1", "a", "n1", condTerminating))},
			[]want{{selectable: []string{"10.0.0.2:8080"}, frontends: []string{"10.96.0.10:80"},
				draining: map[string]string{"10.0.0.1:8080": ReasonTerminating}}}},
		{"families are separate service-ports; a VIP only fronts its family",
			catService(func(s *k8s.Service) {
				s.ClusterIPs = append(s.ClusterIPs, netip.MustParseAddr("fd00:96::10"))
			}), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP, catEndpoint("10.0.0.1", "a", "n1", condTerminating)),
				catSlice(k8s.IPv6, 8080, bpf.TCP, catEndpoint("fd00::1", "a", "n1", condReady))},
			[]want{{frontends: []string{"10.96.0.10:80"}, draining: map[string]string{"10.0.0.1:8080": ReasonTerminating}},
				{selectable: []string{"[fd00::1]:8080"}, frontends: []string{"[fd00:96::10]:80"}}}},
		{"a slice port of another protocol or name is not this service-port", catService(), []*k8s.Slice{
			catSlice(k8s.IPv4, 8080, bpf.UDP, catEndpoint("10.0.0.1", "a", "n1", condTerminating)),
			apiSlice(&k8s.Slice{Service: "web", Controller: true, Family: k8s.IPv4, Ports: []k8s.SlicePort{{Name: "metrics", Port: 9090, Protocol: bpf.TCP}}},
				"", catEndpoint("10.0.0.2", "b", "n1", condTerminating))},
			nil},
		{"headless: no frontends", catService(func(s *k8s.Service) { s.ClusterIPs, s.Headless = nil, true }),
			[]*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP, catEndpoint("10.0.0.1", "a", "n1", condTerminating), catEndpoint("10.0.0.2", "b", "n1", condReady))},
			[]want{{selectable: []string{"10.0.0.2:8080"}, draining: map[string]string{"10.0.0.1:8080": ReasonTerminating}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := categorize(tc.svc, tc.slices, byPod(drains), place{node: "this-node"}, nil)
			if len(got.servicePorts) != len(tc.want) {
				t.Fatalf("%d service-ports, want %d: %+v", len(got.servicePorts), len(tc.want), got.servicePorts)
			}
			for i, w := range tc.want {
				sp := got.servicePorts[i]
				var sel, fes []string
				for _, ap := range sp.selectable {
					sel = append(sel, ap.String())
				}
				for _, k := range sp.frontends {
					fes = append(fes, netip.AddrPortFrom(k.Addr, k.Port).String())
				}
				if !slices.Equal(sel, w.selectable) || !slices.Equal(fes, w.frontends) {
					t.Errorf("service-port %v: selectable %v frontends %v, want %v %v", sp.key, sel, fes, w.selectable, w.frontends)
				}
				if len(sp.draining) != len(w.draining) {
					t.Errorf("service-port %v: draining %+v, want %v", sp.key, sp.draining, w.draining)
				}
				for _, e := range sp.draining {
					ap := netip.AddrPortFrom(e.key.Addr, e.key.Port).String()
					if w.draining[ap] != e.reason {
						t.Errorf("%s: reason %q, want %q", ap, e.reason, w.draining[ap])
					}
					if exp, ok := w.expires[ap]; ok && !e.expires.Equal(exp) {
						t.Errorf("%s: expires %v, want %v", ap, e.expires, exp)
					}
				}
			}
		})
	}
}

// byPod keys pod drains as the model does for categorize.
func byPod(drains map[types.UID]*PodDrain) map[k8s.PodKey]*PodDrain {
	out := make(map[k8s.PodKey]*PodDrain, len(drains))
	for uid, d := range drains {
		out[k8s.PodKeyOf(uid)] = d
	}
	return out
}

// TestCategorizeListed: every listed endpoint is recorded with its pod
// (departure detection), and drained pods are reported. The listing
// reuses the last one's array and keeps nothing of it.
func TestCategorizeListed(t *testing.T) {
	drains := map[types.UID]*PodDrain{"d": {UID: "d", Reason: k8s.ReasonOffline, IPs: addrs("10.0.0.1")}}
	last := listedEndpoints{{key("10.0.0.9:8080", bpf.TCP), k8s.PodKeyOf("x")}, {key("10.0.0.1:8080", bpf.TCP), k8s.PodKeyOf("x")}}
	scratch := &catScratch{listed: last[:0], selectable: make([]netip.AddrPort, 1, 4)}
	got := categorize(catService(), []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP,
		catEndpoint("10.0.0.1", "d", "n1", condReady), catEndpoint("10.0.0.2", "b", "n1", condReady))}, byPod(drains), place{node: "n1"}, scratch)
	if &got.listed[0] != &last[0] {
		t.Error("the listing did not reuse the last one's array")
	}
	if sel := got.servicePorts[0].selectable; len(sel) != 1 || sel[0] != netip.MustParseAddrPort("10.0.0.2:8080") || &sel[0] != &scratch.selectable[0] {
		t.Errorf("selectable %v, want 10.0.0.2:8080 in the scratch array", sel)
	}
	podOf := func(ap string) k8s.PodKey { p, _ := got.listed.podOf(key(ap, bpf.TCP)); return p }
	if len(got.listed) != 2 || podOf("10.0.0.1:8080") != k8s.PodKeyOf("d") || podOf("10.0.0.2:8080") != k8s.PodKeyOf("b") {
		t.Errorf("listed %v", got.listed)
	}
	if _, ok := got.drainedPods["d"]; !ok || len(got.drainedPods) != 1 {
		t.Errorf("drained pods %v", got.drainedPods)
	}
}

// TestCategorizeListingOrder: an endpoint two slices list for two pods (an
// IP reused while the old pod's listing is still in another slice) is
// categorised the same whatever order the slices come in: the pod whose
// listing drains it is named, with that listing's reason and deadline; of
// several, the lowest pod.
func TestCategorizeListingOrder(t *testing.T) {
	exp1 := time.Date(2026, 11, 29, 12, 0, 30, 0, time.UTC)
	drains := map[types.UID]*PodDrain{
		"d1": {UID: "d1", Reason: k8s.ReasonOffline, Expires: exp1, IPs: addrs("10.0.0.1")},
		"d2": {UID: "d2", Reason: k8s.ReasonOperator, Expires: exp1.Add(time.Minute), IPs: addrs("10.0.0.1")},
	}
	named := func(name string, eps ...k8s.Endpoint) *k8s.Slice {
		s := catSlice(k8s.IPv4, 8080, bpf.TCP, eps...)
		s.Name, s.Namespace = name, "default"
		return s
	}
	for _, tc := range []struct {
		name         string
		a, b         k8s.Endpoint
		uid, reason  string
		expires      time.Time
		listed       types.UID
		notDrainedAt bool
	}{
		{"the old pod terminating, the new one ready", catEndpoint("10.0.0.1", "old", "n1", condTerminating),
			catEndpoint("10.0.0.1", "new", "n2", condReady), "old", ReasonTerminating, time.Time{}, "old", false},
		{"two pods draining: the lowest", catEndpoint("10.0.0.1", "p2", "n1", condNotReady),
			catEndpoint("10.0.0.1", "p1", "n2", condTerminating), "p1", ReasonTerminating, time.Time{}, "p1", false},
		{"two drained pods: the lowest, with its deadline", catEndpoint("10.0.0.1", "d2", "n1", condReady),
			catEndpoint("10.0.0.1", "d1", "n2", condReady), "d1", k8s.ReasonOffline, exp1, "d1", false},
		{"a drained pod and a ready one", catEndpoint("10.0.0.1", "a", "n1", condReady),
			catEndpoint("10.0.0.1", "d2", "n2", condReady), "d2", k8s.ReasonOperator, exp1.Add(time.Minute), "d2", false},
		{"two ready pods: the lowest is listed", catEndpoint("10.0.0.1", "b", "n1", condReady),
			catEndpoint("10.0.0.1", "a", "n2", condReady), "", "", time.Time{}, "a", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sa, sb := named("web-a", tc.a), named("web-b", tc.b)
			for _, order := range [][]*k8s.Slice{{sa, sb}, {sb, sa}} {
				got := categorize(catService(), order, byPod(drains), place{node: "n1"}, nil)
				if wantSel := tc.notDrainedAt; len(got.servicePorts) != 1 || (len(got.servicePorts[0].selectable) == 1) != wantSel {
					t.Fatalf("slices %s, %s: %+v", order[0].Name, order[1].Name, got.servicePorts)
				}
				dr := got.servicePorts[0].draining
				switch {
				case tc.notDrainedAt && len(dr) != 0:
					t.Errorf("slices %s, %s: draining %+v, want none", order[0].Name, order[1].Name, dr)
				case !tc.notDrainedAt && (len(dr) != 1 || dr[0].uid != types.UID(tc.uid) || dr[0].reason != tc.reason ||
					!dr[0].expires.Equal(tc.expires) || !dr[0].identified):
					t.Errorf("slices %s, %s: draining %+v, want pod %s reason %s until %v", order[0].Name, order[1].Name, dr, tc.uid, tc.reason, tc.expires)
				}
				if p, ok := got.listed.podOf(key("10.0.0.1:8080", bpf.TCP)); !ok || p != k8s.PodKeyOf(tc.listed) {
					t.Errorf("slices %s, %s: listed %v, want pod %s", order[0].Name, order[1].Name, got.listed, tc.listed)
				}
			}
		})
	}
}

// addrs parses addresses.
func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}
