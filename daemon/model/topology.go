package model

import (
	"net/netip"

	"github.com/draind/draind/k8s"
)

// Topology: while a Service drains, steering picks each new connection's
// backend from its selectable endpoints. That set is the one kube-proxy's
// endpoint categorisation would pick on this node with the draining
// endpoints removed, so steering keeps where kube-proxy sends traffic:
//
//   - internalTrafficPolicy Local: only this node's endpoints (merge). With
//     none left the set is empty and nothing is steered: kube-proxy keeps
//     the connection (and drops it, as it does without draind).
//   - Cluster: the hints the EndpointSlice controller writes (for
//     trafficDistribution PreferSameNode, PreferSameZone or PreferClose, or
//     the topology-mode annotation Auto). kube-proxy reads only the hints,
//     never the Service's fields: node hints when every candidate has one
//     and one names this node; else zone hints when every candidate has one
//     and one names this node's zone; else every candidate (byTopology).
//
// A candidate is a ready endpoint that does not drain. When none is left
// the set is empty, nothing is steered, and kube-proxy falls back to the
// serving terminating endpoints as it always does.

// usesHints reports whether svc's selection reads hints: only under the
// Cluster policy, and only when some slice has one (cheap to ask).
func usesHints(svc *k8s.Service, sliceList []*k8s.Slice) bool {
	if svc.InternalLocal {
		return false
	}
	for _, sl := range sliceList {
		if sl.HasHints() {
			return true
		}
	}
	return false
}

// byTopology keeps, in place and in order, the candidates aps (with their
// k8s.Hint bits in hints) that the topology kube-proxy uses selects, and
// returns how many it kept.
func byTopology(aps []netip.AddrPort, hints []uint8) int {
	if len(aps) == 0 {
		return 0
	}
	allNode, allZone := true, true
	var anyNode, anyZone bool
	for _, h := range hints {
		allNode = allNode && h&k8s.HintNodes != 0
		allZone = allZone && h&k8s.HintZones != 0
		anyNode = anyNode || h&k8s.HintNodeMatch != 0
		anyZone = anyZone || h&k8s.HintZoneMatch != 0
	}
	var want uint8
	switch {
	case allNode && anyNode:
		want = k8s.HintNodeMatch
	case allZone && anyZone:
		want = k8s.HintZoneMatch
	default:
		return len(aps)
	}
	n := 0
	for i, ap := range aps {
		if hints[i]&want != 0 {
			aps[n] = ap
			n++
		}
	}
	return n
}
