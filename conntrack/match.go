package conntrack

import (
	"errors"
	"fmt"
	"net/netip"
	"time"
)

// Tuple is one direction of a flow, as conntrack records it.
type Tuple struct {
	Src netip.AddrPort
	Dst netip.AddrPort
}

// Flow is one conntrack entry, reduced to what draind decides on.
//
// Orig is the tuple the client sent (for a Service flow: client -> VIP);
// Reply is the tuple the kernel expects back (pod -> client after DNAT), so
// Reply.Src is the endpoint that actually serves the flow.
type Flow struct {
	Proto Proto
	Orig  Tuple
	Reply Tuple
	// Zone is the conntrack zone the flow lives in (0 = default).
	Zone uint16
	// Start is when conntrack created the entry; zero when the entry has no
	// timestamp (created while nf_conntrack_timestamp was off).
	Start time.Time
	// State is the TCP state; meaningful for TCP flows only.
	State TCPState
}

// Verdict is what a FilterSet decides for one flow.
type Verdict uint8

const (
	// VerdictSkip: no filter selects the flow.
	VerdictSkip Verdict = iota
	// VerdictKeep: a filter selects the flow's tuple, but the flow is
	// younger than every such filter's CreatedBefore (a new pod on a
	// reused IP). Expire counts it in ExpireResult.Kept.
	VerdictKeep
	// VerdictExpire: at least one filter selects the flow and finds it old
	// enough. Expire deletes it.
	VerdictExpire
)

// validate normalises a filter (IPv4-mapped IPv6 addresses become IPv4) and
// rejects filters the kernel could not express or that would match too much:
// an empty ReplySrc would select every flow of the protocol.
func (f Filter) validate() (Filter, error) {
	if f.Proto != TCP && f.Proto != UDP {
		return f, fmt.Errorf("unsupported protocol %s (only tcp and udp)", f.Proto)
	}
	if !f.ReplySrc.Addr().IsValid() {
		return f, errors.New("reply source address is not set")
	}
	f.ReplySrc = netip.AddrPortFrom(f.ReplySrc.Addr().Unmap(), f.ReplySrc.Port())
	if f.OrigDst.Addr().IsValid() {
		f.OrigDst = netip.AddrPortFrom(f.OrigDst.Addr().Unmap(), f.OrigDst.Port())
		if f.OrigDst.Addr().Is4() != f.ReplySrc.Addr().Is4() {
			return f, fmt.Errorf("original destination %s and reply source %s are of different address families", f.OrigDst, f.ReplySrc)
		}
	} else if f.OrigDst.Port() != 0 {
		return f, errors.New("original destination has a port but no address")
	}
	return f, nil
}

// FilterSet is the filters of one Expire call, validated and normalised,
// for a handle that acts in one zone. It is the single place where filters
// decide a flow's fate: Netlink classifies every flow the kernel returns
// with it, and the in-memory table of conntrack/conntracktest classifies
// its flows with it, so the two cannot disagree on what a pass deletes.
type FilterSet struct {
	zone    uint16
	filters []Filter
}

// NewFilterSet validates filters for a handle that acts in zone and keeps
// normalised copies (IPv4-mapped IPv6 addresses become IPv4) in the order
// given, so Classify's filter index is a position in filters. The error
// names the first invalid filter by its position; Expire rejects the whole
// call with it before touching the table.
func NewFilterSet(zone uint16, filters []Filter) (FilterSet, error) {
	out := make([]Filter, len(filters))
	for i, f := range filters {
		n, err := f.validate()
		if err != nil {
			return FilterSet{}, fmt.Errorf("validating filter %d: %w", i, err)
		}
		out[i] = n
	}
	return FilterSet{zone: zone, filters: out}, nil
}

// matchesTuple reports whether the flow belongs to the endpoint the filter
// names, ignoring CreatedBefore. It is the single definition of a match,
// applied through FilterSet.Classify: Netlink re-checks every flow the
// kernel returns with it (the kernel filter is an accelerator, not the
// authority).
func (f Filter) matchesTuple(fl Flow) bool {
	if fl.Proto != f.Proto {
		return false
	}
	if fl.Reply.Src.Addr().Unmap() != f.ReplySrc.Addr() {
		return false
	}
	if f.ReplySrc.Port() != 0 && fl.Reply.Src.Port() != f.ReplySrc.Port() {
		return false
	}
	if f.OrigDst.Addr().IsValid() {
		if fl.Orig.Dst.Addr().Unmap() != f.OrigDst.Addr() {
			return false
		}
		if f.OrigDst.Port() != 0 && fl.Orig.Dst.Port() != f.OrigDst.Port() {
			return false
		}
	}
	return true
}

// isOld reports whether the flow started before CreatedBefore. A flow without
// a timestamp is old: it predates timestamping, so it cannot belong to a pod
// that appeared after draind enabled it.
func (f Filter) isOld(fl Flow) bool {
	if f.CreatedBefore.IsZero() || fl.Start.IsZero() {
		return true
	}
	return fl.Start.Before(f.CreatedBefore)
}

// Classify decides what Expire does with one flow. A flow of another zone
// than the set's is never selected, whatever its tuple: it is someone
// else's. For VerdictExpire, idx is the position of the first filter that
// expires the flow (the one credited in ExpireResult.PerFilter); for the
// other verdicts it is -1.
func (s FilterSet) Classify(fl Flow) (v Verdict, idx int) {
	v, idx = VerdictSkip, -1
	if fl.Zone != s.zone {
		return v, idx
	}
	for i, f := range s.filters {
		if !f.matchesTuple(fl) {
			continue
		}
		if f.isOld(fl) {
			return VerdictExpire, i
		}
		v = VerdictKeep
	}
	return v, idx
}

// CountedFor reports whether Count(addr) of a handle that acts in zone
// includes fl: every flow of the zone whose reply-direction source is addr
// (an IPv4-mapped address names the IPv4 one), whatever its protocol or
// port. EndpointFlows lists the same flows, narrowed to one protocol.
// Netlink re-checks every flow of its kernel-filtered dumps with it.
func CountedFor(zone uint16, addr netip.Addr, fl Flow) bool {
	return fl.Zone == zone && fl.Reply.Src.Addr().Unmap() == addr.Unmap()
}

// Add counts one flow into c: a TCP flow under its state, a UDP flow in
// UDP, a flow of another protocol nowhere. Count builds its result with
// it, flow by flow.
func (c *Counts) Add(fl Flow) {
	switch fl.Proto {
	case TCP:
		s := fl.State
		if s >= numTCPStates {
			// A state this package does not know (or none reported, as for
			// offloaded flows) is counted as live: undercounting live
			// connections would end a drain too early.
			s = TCPNone
		}
		c.TCP[s]++
	case UDP:
		c.UDP++
	}
}
