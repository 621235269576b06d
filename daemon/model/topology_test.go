package model

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// topoEndpoint is a ready endpoint of pod uid on node with hints (nil:
// none).
func topoEndpoint(ip, uid, node string, conds uint8, h *k8s.Hints) k8s.Endpoint {
	e := catEndpoint(ip, uid, node, conds)
	e.Hints = h
	return e
}

// zoneHint is what the EndpointSlice controller writes for
// trafficDistribution PreferSameZone or PreferClose (the endpoint's own
// zone), or for the topology-mode annotation Auto (a zone it allots).
func zoneHint(zones ...string) *k8s.Hints { return &k8s.Hints{Zones: zones} }

// nodeHint is what it writes for PreferSameNode: the endpoint's node and
// its zone.
func nodeHint(node, zone string) *k8s.Hints {
	return &k8s.Hints{Nodes: []string{node}, Zones: []string{zone}}
}

// TestTopologyBackendSet tables the backends steering picks from against
// what kube-proxy's endpoint categorisation picks on this node
// ("this-node" in zone-a) with the draining endpoints removed: the
// internal traffic policy, each trafficDistribution (as the hints the
// controller writes for it), topology-mode Auto's hints, and the
// fallbacks. "d" is a pod that asked to go offline (ready, draining).
func TestTopologyBackendSet(t *testing.T) {
	// Pod d is listed at one of these addresses in each case.
	drains := byPod(map[types.UID]*PodDrain{"d": {UID: "d", Reason: k8s.ReasonOffline, IPs: addrs("10.0.0.1", "10.0.0.2", "10.0.0.3")}})
	local := func(s *k8s.Service) { s.InternalLocal = true }
	here := place{node: "this-node", zone: "zone-a"}
	for _, tc := range []struct {
		name string
		svc  *k8s.Service
		at   place // zero: here
		eps  []k8s.Endpoint
		want []string // selectable
	}{
		{"Cluster, no hints: every ready endpoint that does not drain", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, nil), topoEndpoint("10.0.0.2", "b", "n2", condReady, nil),
			topoEndpoint("10.0.0.3", "c", "n3", condTerminating, nil)},
			[]string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"Local: only this node's endpoints", catService(local), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, nil), topoEndpoint("10.0.0.2", "b", "n2", condReady, nil),
			topoEndpoint("10.0.0.3", "c", "this-node", condTerminating, nil)},
			[]string{"10.0.0.1:8080"}},
		{"Local, this node's only endpoint drains: none (kube-proxy keeps the connection, never another node)", catService(local), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "d", "this-node", condReady, nil), topoEndpoint("10.0.0.2", "b", "n2", condReady, nil)},
			nil},
		{"Local ignores hints", catService(local), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, zoneHint("zone-b")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-a")),
			topoEndpoint("10.0.0.3", "c", "n2", condTerminating, zoneHint("zone-a"))},
			[]string{"10.0.0.1:8080"}},
		{"PreferSameZone / PreferClose: the zone's endpoints", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-b")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.4", "e", "n4", condTerminating, zoneHint("zone-a"))},
			[]string{"10.0.0.1:8080", "10.0.0.3:8080"}},
		{"PreferSameZone, the zone's only endpoint drains: every other one", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "d", "n1", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-b")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, zoneHint("zone-c"))},
			[]string{"10.0.0.2:8080", "10.0.0.3:8080"}},
		{"PreferSameZone, a ready endpoint without a hint: hints ignored", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "b", "n2", condReady, nil),
			topoEndpoint("10.0.0.3", "c", "n3", condTerminating, zoneHint("zone-a"))},
			[]string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"PreferSameZone, only a draining endpoint lacks a hint: hints kept", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-b")),
			topoEndpoint("10.0.0.3", "d", "n3", condReady, nil), topoEndpoint("10.0.0.4", "c", "n4", condTerminating, nil)},
			[]string{"10.0.0.1:8080"}},
		{"PreferSameZone, this node has no zone label: every endpoint", catService(), place{node: "this-node"}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-b"))},
			[]string{"10.0.0.1:8080", "10.0.0.2:8080"}},
		{"PreferSameNode: this node's endpoints", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, nodeHint("this-node", "zone-a")),
			topoEndpoint("10.0.0.2", "b", "n2", condReady, nodeHint("n2", "zone-a")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, nodeHint("n3", "zone-b")),
			topoEndpoint("10.0.0.4", "e", "this-node", condTerminating, nodeHint("this-node", "zone-a"))},
			[]string{"10.0.0.1:8080"}},
		{"PreferSameNode, this node's endpoint drains: the zone's", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "d", "this-node", condReady, nodeHint("this-node", "zone-a")),
			topoEndpoint("10.0.0.2", "b", "n2", condReady, nodeHint("n2", "zone-a")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, nodeHint("n3", "zone-b"))},
			[]string{"10.0.0.2:8080"}},
		{"PreferSameNode, nothing on this node or in its zone: every endpoint", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "d", "this-node", condReady, nodeHint("this-node", "zone-a")),
			topoEndpoint("10.0.0.2", "b", "n2", condReady, nodeHint("n2", "zone-b")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, nodeHint("n3", "zone-c"))},
			[]string{"10.0.0.2:8080", "10.0.0.3:8080"}},
		{"PreferSameNode, a node without a zone: node hints alone", catService(), place{node: "this-node"}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, &k8s.Hints{Nodes: []string{"this-node"}}),
			topoEndpoint("10.0.0.2", "b", "n2", condReady, &k8s.Hints{Nodes: []string{"n2"}})},
			[]string{"10.0.0.1:8080"}},
		{"node hints on some endpoints only: zone hints decide", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "this-node", condReady, nodeHint("this-node", "zone-b")),
			topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-a"))},
			[]string{"10.0.0.2:8080"}},
		{"topology-mode Auto's hints: the zone the controller allots, whatever the endpoint's own", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-b")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-a")),
			topoEndpoint("10.0.0.3", "c", "n3", condReady, zoneHint("zone-a", "zone-c"))},
			[]string{"10.0.0.2:8080", "10.0.0.3:8080"}},
		{"hints without the annotation or a trafficDistribution: kept all the same (kube-proxy reads only hints)", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-b")), topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-a"))},
			[]string{"10.0.0.2:8080"}},
		{"no ready endpoint left: none (kube-proxy's serving-terminating fallback stays its own)", catService(), place{}, []k8s.Endpoint{
			topoEndpoint("10.0.0.1", "a", "n1", condTerminating, zoneHint("zone-a")), topoEndpoint("10.0.0.2", "d", "n2", condReady, zoneHint("zone-a"))},
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := tc.at
			if at == (place{}) {
				at = here
			}
			got := categorize(tc.svc, []*k8s.Slice{catSlice(k8s.IPv4, 8080, bpf.TCP, tc.eps...)}, drains, at, nil)
			var sel []string
			for _, sp := range got.servicePorts {
				for _, ap := range sp.selectable {
					sel = append(sel, ap.String())
				}
			}
			if !slices.Equal(sel, tc.want) {
				t.Errorf("selectable %v, want %v", sel, tc.want)
			}
		})
	}
}

// TestTopologyAcrossSlices: the hints of endpoints in different slices of
// a Service decide together, and a second service-port's set starts
// afresh.
func TestTopologyAcrossSlices(t *testing.T) {
	a := catSlice(k8s.IPv4, 8080, bpf.TCP, topoEndpoint("10.0.0.1", "a", "n1", condReady, zoneHint("zone-a")),
		topoEndpoint("10.0.0.9", "x", "n1", condTerminating, zoneHint("zone-a")))
	b := catSlice(k8s.IPv4, 8080, bpf.TCP, topoEndpoint("10.0.0.2", "b", "n2", condReady, zoneHint("zone-b")))
	c := catSlice(k8s.IPv4, 8080, bpf.TCP, topoEndpoint("10.0.0.3", "c", "n3", condReady, nil)) // no hints
	svc := catService()
	for _, tc := range []struct {
		slices []*k8s.Slice
		want   []string
	}{
		{[]*k8s.Slice{a, b}, []string{"10.0.0.1:8080"}},
		{[]*k8s.Slice{a, b, c}, []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"}},
	} {
		got := categorize(svc, tc.slices, nil, place{node: "this-node", zone: "zone-a"}, nil)
		if sel := got.servicePorts[0].selectable; !slices.Equal(sel, aps(tc.want...)) {
			t.Errorf("%d slices: selectable %v, want %v", len(tc.slices), sel, tc.want)
		}
	}
}
