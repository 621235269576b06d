package k8s

import "strings"

// Topology hints: the EndpointSlice controller writes them for a Service
// with a trafficDistribution (PreferSameZone and PreferClose: a zone hint,
// the endpoint's own zone; PreferSameNode: its node and its zone) or the
// topology-mode annotation Auto (zone hints spread by capacity).
// kube-proxy reads only the hints, never the Service's fields, and so does
// draind (see daemon/model's topology.go).

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
// when none has one). The names are copied once, into one string.
func packHints[T bytestring](eps []endpointIn[T]) *sliceHints {
	n := 0
	for i := range eps {
		if !eps[i].dropped() {
			n += len(eps[i].hints)
		}
	}
	if n == 0 {
		return nil
	}
	h := &sliceHints{at: make([]uint32, 1, len(eps)+1), refs: make([]uint16, 0, n)}
	var small [8]T
	names := hintNames[T]{list: small[:0]}
	for i := range eps {
		e := &eps[i]
		if e.dropped() {
			continue
		}
		for _, p := range e.hints {
			ref := uint16(names.index(p.name)) << 1
			if p.node {
				ref |= 1
			}
			h.refs = append(h.refs, ref)
		}
		h.at = append(h.at, uint32(len(h.refs)))
	}
	var b strings.Builder
	b.Grow(names.size)
	for _, name := range names.list {
		writeText(&b, name)
	}
	all := b.String()
	h.text = make([]string, len(names.list))
	off := 0
	for k, name := range names.list {
		h.text[k] = all[off : off+len(name)]
		off += len(name)
	}
	return h
}

// hintNames numbers the distinct names of a slice's hints, in the order
// first seen: by a scan while they are few (a Service's slice names a few
// zones), by a map past that (PreferSameNode names every node).
type hintNames[T bytestring] struct {
	list   []T
	byName map[string]int
	size   int // bytes of the names
}

// manyHintNames is when hintNames starts a map.
const manyHintNames = 16

// index returns name's number (maxHintNames when the table is full: the
// name then matches nothing).
func (t *hintNames[T]) index(name T) int {
	if t.byName != nil {
		if k, ok := t.byName[string(name)]; ok {
			return k
		}
	} else {
		for k, v := range t.list {
			if string(v) == string(name) {
				return k
			}
		}
	}
	if len(t.list) >= maxHintNames {
		return maxHintNames
	}
	t.list = append(t.list, name)
	t.size += len(name)
	k := len(t.list) - 1
	switch {
	case t.byName != nil:
		t.byName[string(name)] = k
	case len(t.list) > manyHintNames:
		t.byName = make(map[string]int, 2*len(t.list))
		for j, v := range t.list {
			t.byName[string(v)] = j
		}
	}
	return k
}

// Hints are an endpoint's topology hints: the names of its hints' forZones
// and forNodes.
type Hints struct {
	Zones, Nodes []string
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
