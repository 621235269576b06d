package daemon

import (
	"net/netip"
	"time"

	"github.com/draind/draind/daemon/model"
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
	switch h := hostsOf(d.claims, l); {
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

// leaseHosts is what trusted slices say of a Lease's pod: the IPs they
// list it at on the Lease's holder, or that they list it on another node.
type leaseHosts struct {
	until     time.Time // a departed host's answer ends (zero: none)
	ips       []netip.Addr
	elsewhere bool
}

// hostsOf returns what trusted slices say of the pod of l, a Lease of
// another node: one index lookup per IP. It is asked only when the Leases
// are read again (leaseDrainsMemo), so its answers are not kept.
func hostsOf(c *model.Claims, l *k8s.DrainLease) leaseHosts {
	var h leaseHosts
	for _, ip := range l.IPs {
		node, listed, until := c.HostOf(ip, l.PodUID)
		if !until.IsZero() && (h.until.IsZero() || until.Before(h.until)) {
			h.until = until
		}
		if listed && node != l.Holder {
			return leaseHosts{until: h.until, elsewhere: true}
		}
		if listed {
			h.ips = append(h.ips, ip)
		}
	}
	return h
}
