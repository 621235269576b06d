package daemon

import (
	"net/netip"
	"slices"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// What a restart keeps steering.
//
// A draind that starts over pinned maps adopts its predecessor's entries,
// but rebuilds its model from what the cluster records now, which may no
// longer say why an entry is there: a pod of another node that drained and
// was deleted while no draind ran here has left its slices and its Pod
// object is gone, so nothing can confirm its gone Lease, and its departure
// (the linger that rewrites a stale caller's connection to the Service)
// was never seen here. Left at that, a restart would end that steering at
// once, and the stale callers' connections would go to a dead address.
// So, from the pinned entries still in force at start-up:
//
//   - a Lease of another node whose pod the API no longer has is honoured
//     for the addresses the pinned entries steered (lease.Trust.Inherit):
//     the predecessor confirmed them while the pod existed;
//   - a pinned rewrite of a draining pod's address to a Service its slices
//     no longer list (the pod left while draind was down) comes back as a
//     departure of that Service, the way a vanished endpoint does
//     (sockets_vanish.go): it drains in the first pass and departs from the
//     next, then lingers as if this draind had seen it leave, rewritten to
//     the Service rather than refused as a pod no Service lists;
//   - a Lease of this node whose pod this node no longer has (it drained
//     and was deleted while no draind ran here) becomes a gone drain of
//     this node (hosted.Drains.AdoptGone) for the addresses the pinned
//     entries held, steering or not yet: the pod's address lingers, and
//     its pinned entries come back as a departure from its Service as
//     above.
//
// Nothing outlives what the cluster still says: the Lease must exist
// (its deletion ends both), another pod claiming the address ends
// them, and the linger runs at most --linger from the restart.
// The Lease check does not inherit Leases of this node
// (lease.Trust.Inherit): this node's own pods confirm them, and the
// Leases of its gone pods come back as its own gone drains
// (AdoptGone, above).

// pinnedSteering is what the pinned maps steered at start-up.
type pinnedSteering struct {
	addrs    map[netip.Addr]bool // addresses with an entry in force (policy not off)
	held     map[netip.Addr]bool // addresses with an entry, in force or not yet (off)
	rewrites []pinnedRewrite
}

// pinnedRewrite is a pinned entry rewriting key to the service-port whose
// frontends were vips; off: the entry did not steer yet (a pod of this
// node, draining and still serving its established connections).
type pinnedRewrite struct {
	key  bpf.EndpointKey
	vips []bpf.EndpointKey
	off  bool
}

// pinnedFrom reads what d steered at now.
func pinnedFrom(d *bpf.Dump, now time.Time) pinnedSteering {
	vips := map[bpf.ServicePortID][]bpf.EndpointKey{}
	for _, f := range d.Frontends {
		vips[f.Service] = append(vips[f.Service], f.Key)
	}
	p := pinnedSteering{addrs: map[netip.Addr]bool{}, held: map[netip.Addr]bool{}}
	for _, dr := range d.Drains {
		if !dr.Expires.After(now) {
			continue
		}
		p.held[dr.Key.Addr] = true
		off := dr.Policy == bpf.PolicyOff
		if !off {
			p.addrs[dr.Key.Addr] = true
		}
		if (off || dr.Policy == bpf.PolicyRewrite) && dr.Key.Port != 0 && len(vips[dr.Service]) > 0 {
			p.rewrites = append(p.rewrites, pinnedRewrite{key: dr.Key, vips: vips[dr.Service], off: off})
		}
	}
	return p
}

// restoreDepartures queues the pinned rewrites of pods that drain Leases
// name as departures of their Services (sockets_vanish.go): the model
// takes those whose pod drain it honours and no slice lists any more.
func (d *Daemon) restoreDepartures(now time.Time) {
	var out []model.VanishedEndpoint
	for _, l := range d.drainLeasesNow().list {
		if !l.Expires().After(now) {
			continue
		}
		for _, r := range d.pinned.rewrites {
			// An entry that did not steer yet comes back only for a pod
			// of this node, whose drain this node decides (AdoptGone).
			if !slices.Contains(l.IPs, r.key.Addr) || (r.off && l.Holder != d.cfg.Node) {
				continue
			}
			svc, port, ok := d.serviceOfVIPs(l.PodNamespace, r.vips)
			if !ok {
				continue
			}
			out = append(out, model.VanishedEndpoint{Service: svc, Key: r.key, PortName: port, Family: k8s.FamilyOf(r.key.Addr),
				UID: l.PodUID, Pod: l.PodNamespace + "/" + l.PodName, At: now, Restored: true})
		}
	}
	d.vanished.add(out)
}

// serviceOfVIPs finds the Service of namespace ns (one its slices name)
// with a port at one of vips: its key and that port's name.
func (d *Daemon) serviceOfVIPs(ns string, vips []bpf.EndpointKey) (key, port string, ok bool) {
	seen := map[string]bool{}
	for _, s := range d.inf.SlicesInNamespace(ns) {
		k := ns + "/" + s.Service
		if s.Service == "" || seen[k] {
			continue
		}
		seen[k] = true
		svc := d.inf.Service(k)
		if svc == nil {
			continue
		}
		for _, v := range vips {
			if !slices.Contains(svc.ClusterIPs, v.Addr) {
				continue
			}
			for _, sp := range svc.Ports {
				if sp.Port == v.Port && sp.Protocol == v.Proto {
					return k, sp.Name, true
				}
			}
		}
	}
	return "", "", false
}
