package daemon

import (
	"net/netip"
	"time"

	"github.com/draind/draind/k8s"
)

// Which drain Leases are honoured. Every node's draind shares one
// ServiceAccount that may write drain Leases; a Lease is honoured only when
// the cluster's own records agree that its holder hosts the pod, and only
// for the pod's own IPs:
//
//   - this node's Leases: the pod is one of this node's pods;
//   - a pod that trusted slices list: their endpoints for the pod UID name
//     the holder as the node (a listing on another node rejects the Lease);
//   - a pod no trusted slice lists (a registry-only workload): the Pod
//     object itself, read once per Lease, names the holder and the IPs
//     (lease.Trust, off the runner's path).
//
// A Lease not (yet) confirmed drains nothing: fail open.

// honouredIPs returns the IPs a Lease may drain, appended to buf, or false;
// until is when the answer may change with nothing else changing (zero:
// never).
func (d *Daemon) honouredIPs(l *k8s.DrainLease, local map[netip.Addr]*k8s.Pod, buf []netip.Addr, now time.Time) (ips []netip.Addr, ok bool, until time.Time) {
	ips = buf
	if l.Holder == d.cfg.Node {
		for _, ip := range l.IPs {
			if p := local[ip]; p != nil && p.UID == l.PodUID {
				ips = append(ips, ip)
			}
		}
		return ips, len(ips) > 0, time.Time{}
	}
	switch h := d.drainsState.hostsOf(d.claims, l, now); {
	case h.elsewhere:
		return ips, false, h.until // the pod runs elsewhere: not the holder's to drain
	case len(h.ips) > 0:
		return append(ips, h.ips...), true, h.until
	default:
		v, ok, recheck := d.leaseTrust.Verified(l)
		if !h.until.IsZero() && (recheck.IsZero() || h.until.Before(recheck)) {
			recheck = h.until
		}
		return append(ips, v...), ok, recheck // a copy: buf is reused, the verdict kept
	}
}

// leaseHosts is what trusted slices said of a Lease's pod: the IPs they
// list it at on the Lease's holder, or that they list it on another node.
// Invariant: it is hostOf's answer for the Lease's IPs while the Lease
// object, the generation of those IPs' listings (gen, claims.ipsGeneration)
// and a departed host's answer (until) last. Checked by
// FuzzSequenceDifferential.
type leaseHosts struct {
	lease     *k8s.DrainLease
	gen       uint64    // the generation of its IPs' listings it was read at
	cached    bool      // gen is one (the IPs were watched)
	until     time.Time // a departed host's answer ends (zero: none)
	ips       []netip.Addr
	elsewhere bool
}

// hostsOf returns what trusted slices say of the pod of l, a Lease of
// another node: one index lookup per IP, kept (by Lease name) while the
// Lease object, the generation of its IPs' listings and a departed host's
// answer last.
func (st *podDrainsState) hostsOf(c *claims, l *k8s.DrainLease, now time.Time) *leaseHosts {
	gen, cached := c.ipsGeneration(l.IPs)
	if h := st.hostAnswers[l.Name]; h != nil && cached && h.cached && h.lease == l && h.gen == gen && (h.until.IsZero() || now.Before(h.until)) {
		return h
	}
	h := &leaseHosts{lease: l, gen: gen, cached: cached}
	for _, ip := range l.IPs {
		node, listed, until := c.hostOf(ip, l.PodUID)
		if !until.IsZero() && (h.until.IsZero() || until.Before(h.until)) {
			h.until = until
		}
		if listed && node != l.Holder {
			h.elsewhere, h.ips = true, nil
			break
		}
		if listed {
			h.ips = append(h.ips, ip)
		}
	}
	if st.hostAnswers == nil {
		st.hostAnswers = map[string]*leaseHosts{}
	}
	st.hostAnswers[l.Name] = h
	return h
}

// forgetHostAnswers drops the answers of Leases that are gone.
func (st *podDrainsState) forgetHostAnswers(names map[string]bool) {
	for name := range st.hostAnswers {
		if !names[name] {
			delete(st.hostAnswers, name)
		}
	}
}
