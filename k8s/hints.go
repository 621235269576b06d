package k8s

import "strings"

// Topology hints: the EndpointSlice controller writes them for a Service
// with a trafficDistribution (PreferSameZone and PreferClose: a zone hint,
// the endpoint's own zone; PreferSameNode: its node and its zone) or the
// topology-mode annotation Auto (zone hints spread by capacity).
// kube-proxy reads only the hints, never the Service's fields, and so does
// draind (see the daemon's topology.go).

// Hint bits: what an endpoint's hints say about one node (HintsFor).
const (
	HintZones     uint8 = 1 << iota // the endpoint has a zone hint
	HintZoneMatch                   // one of them names the node's zone
	HintNodes                       // the endpoint has a node hint
	HintNodeMatch                   // one of them names the node
)

// hintPart is one forZones or forNodes name as received.
type hintPart[T bytestring] struct {
	name T
	node bool
}

// sliceHints are a slice's hints, packed: a slice's endpoints name a few
// zones and nodes, each kept once.
type sliceHints struct {
	text []string // the distinct names
	at   []uint32 // endpoint i's hints are refs[at[i]:at[i+1]]
	refs []uint16 // an index in text, shifted left; the low bit marks a node hint
}

// maxHintNames bounds the names a slice's hints keep (the API allows 8 of
// each per endpoint, and 1,000 endpoints): past it, an endpoint's hint is
// kept as one naming no zone or node this package is asked about.
const maxHintNames = 1 << 14

// packHints packs the hints of the endpoints packEndpoints keeps (nil
// when none has one).
func packHints[T bytestring](eps []endpointIn[T]) *sliceHints {
	any := false
	for i := range eps {
		any = any || (len(eps[i].hints) > 0 && !eps[i].dropped())
	}
	if !any {
		return nil
	}
	h := &sliceHints{at: make([]uint32, 1, len(eps)+1)}
	index := map[string]int{}
	for i := range eps {
		e := &eps[i]
		if e.dropped() {
			continue
		}
		for _, p := range e.hints {
			k, ok := index[string(p.name)]
			switch {
			case ok:
			case len(h.text) < maxHintNames:
				k = len(h.text)
				h.text = append(h.text, strings.Clone(string(p.name)))
				index[h.text[k]] = k
			default:
				k = maxHintNames // no name: matches nothing
			}
			ref := uint16(k) << 1
			if p.node {
				ref |= 1
			}
			h.refs = append(h.refs, ref)
		}
		h.at = append(h.at, uint32(len(h.refs)))
	}
	return h
}

// Hints are an endpoint's topology hints: the names of its hints' forZones
// and forNodes.
type Hints struct {
	Zones, Nodes []string
}

func (h *Hints) parts() []hintPart[string] {
	var out []hintPart[string]
	for _, z := range h.Zones {
		out = append(out, hintPart[string]{name: z})
	}
	for _, n := range h.Nodes {
		out = append(out, hintPart[string]{name: n, node: true})
	}
	return out
}

// names returns endpoint i's hints (nil: none).
func (h *sliceHints) names(i int) *Hints {
	refs := h.refs[h.at[i]:h.at[i+1]]
	if len(refs) == 0 {
		return nil
	}
	out := &Hints{}
	for _, r := range refs {
		name := h.name(r)
		if r&1 != 0 {
			out.Nodes = append(out.Nodes, name)
		} else {
			out.Zones = append(out.Zones, name)
		}
	}
	return out
}

func (h *sliceHints) name(r uint16) string {
	if k := int(r >> 1); k < len(h.text) {
		return h.text[k]
	}
	return "\x00" // past maxHintNames: no name the API allows
}

// HasHints reports whether some endpoint of the slice has a hint.
func (s *Slice) HasHints() bool { return s.hints != nil }

// HintsFor returns what endpoint i's hints say about the node named node,
// in zone zone: the Hint bits. It allocates nothing.
func (s *Slice) HintsFor(i int, zone, node string) uint8 {
	h := s.hints
	if h == nil {
		return 0
	}
	var bits uint8
	for _, r := range h.refs[h.at[i]:h.at[i+1]] {
		name := h.name(r)
		if r&1 != 0 {
			bits |= HintNodes
			if name == node {
				bits |= HintNodeMatch
			}
		} else {
			bits |= HintZones
			if name == zone {
				bits |= HintZoneMatch
			}
		}
	}
	return bits
}
