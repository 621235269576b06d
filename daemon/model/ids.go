package model

import (
	"net/netip"
	"strings"

	"github.com/draind/draind/bpf"
)

// serviceIDs hands out service-port ids: the ones a previous draind left in
// the pinned maps first (a restart keeps them, so it rewrites nothing that
// is still right), then fresh ones, reusing released ids oldest first (so
// an id is not reused while a just-deleted entry may linger).
type serviceIDs struct {
	next uint32
	free []bpf.ServicePortID
	// pinnedByKey are the pinned ids by the frontends and rewritten
	// endpoints that name them; pinnedBySet by backend set (service-ports
	// with neither, e.g. headless). Both are forgotten after the first pass.
	pinnedByKey map[bpf.EndpointKey]bpf.ServicePortID
	pinnedBySet map[string]bpf.ServicePortID
}

// adopt records the ids of a previous draind's pinned entries; fresh ids
// are allocated above all of them.
func (a *serviceIDs) adopt(d *bpf.Dump) {
	a.pinnedByKey = map[bpf.EndpointKey]bpf.ServicePortID{}
	a.pinnedBySet = map[string]bpf.ServicePortID{}
	seen := func(id bpf.ServicePortID) { a.next = max(a.next, uint32(id)) }
	for _, b := range d.Backends {
		seen(b.Service)
		a.pinnedBySet[backendSetKey(b.Backends)] = b.Service
	}
	for _, f := range d.Frontends {
		seen(f.Service)
		a.pinnedByKey[f.Key] = f.Service
	}
	for _, dr := range d.Drains {
		seen(dr.Service)
		if dr.Service != 0 && dr.Policy == bpf.PolicyRewrite {
			a.pinnedByKey[dr.Key] = dr.Service
		}
	}
}

// forgetPinned ends the adoption of pinned ids (after the first pass).
func (a *serviceIDs) forgetPinned() { a.pinnedByKey, a.pinnedBySet = nil, nil }

// alloc returns the id for a newly active service-port: the one its pinned
// frontends, rewritten endpoints or backend set carry if no active
// service-port holds it, else a fresh one.
func (a *serviceIDs) alloc(frontends, draining []bpf.EndpointKey, selectable []netip.AddrPort, active map[bpf.ServicePortID]*servicePort) bpf.ServicePortID {
	for _, keys := range [][]bpf.EndpointKey{frontends, draining} {
		for _, k := range keys {
			if id, ok := a.pinnedByKey[k]; ok && active[id] == nil {
				delete(a.pinnedByKey, k)
				return id
			}
		}
	}
	if len(selectable) > 0 && len(a.pinnedBySet) > 0 { // none after the first pass: no key to build
		sk := backendSetKey(selectable)
		if id, ok := a.pinnedBySet[sk]; ok && active[id] == nil {
			delete(a.pinnedBySet, sk)
			return id
		}
	}
	if len(a.free) > 64 {
		id := a.free[0]
		a.free = a.free[1:]
		return id
	}
	a.next++
	return bpf.ServicePortID(a.next)
}

func (a *serviceIDs) release(id bpf.ServicePortID) { a.free = append(a.free, id) }

func backendSetKey(b []netip.AddrPort) string {
	var sb strings.Builder
	for _, ap := range b {
		sb.WriteString(ap.String())
		sb.WriteByte(',')
	}
	return sb.String()
}
