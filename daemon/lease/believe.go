package lease

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/k8s"
)

// Which Leases are believed, drain and claim Leases alike: Judge.Believed
// decides it, and nothing else does. Every node's draind shares one
// ServiceAccount that may write Leases, so a Lease is believed only while
// it has not expired, only when the cluster's own records agree that its
// holder hosts the pod, and only for the pod's own IPs. One rule
// (hostedIPs) reads one record (Record) at a time:
//
//   - this node's Leases: this node's pods;
//   - another node's Lease of a pod that trusted slices list: their
//     listings of the pod UID (model.Claims.HostOf, which remembers an
//     ended listing for a while); a listing on another node refuses it, and
//     listings on two nodes leave it to the Pod object;
//   - a pod no trusted slice lists (a registry-only workload): its Pod
//     object, read once per Lease off the runner's path (Trust, which
//     judges it with byPodObject); at start-up, a Lease whose pod the API
//     no longer has counts for the addresses the previous draind's pinned
//     maps still steered (Trust.Inherit).
//
// A Lease not (yet) confirmed drains nothing: fail open.

// Record is one of the cluster's records of where pods run: the node it
// places pod uid on at ip (listed: it lists the pod there at all, with a
// node or without), and when such a listing that ended stops counting
// (zero: it has not ended). model.Claims is the trusted slices' record.
type Record interface {
	HostOf(ip netip.Addr, uid types.UID) (node string, listed bool, until time.Time)
}

// Judge decides whether a Lease is believed (Believed).
type Judge struct {
	Node   string // this node
	Slices Record // the trusted slices' listings (model.Claims)
	Pods   *Trust // the Pod objects of pods no trusted slice lists
}

// Believed returns the IPs l may drain (a claim Lease: claim), appended to
// buf, or false; local is this node's pods by IP; until is when the answer
// may change with nothing else changing (zero: never).
func (j *Judge) Believed(l *k8s.DrainLease, local map[netip.Addr]*k8s.Pod, buf []netip.Addr, now time.Time) (ips []netip.Addr, ok bool, until time.Time) {
	exp := l.Expires()
	if !exp.After(now) {
		return buf, false, time.Time{}
	}
	ips, ok, until = j.judge(l, local, buf)
	return ips, ok, earliest(exp, until)
}

// judge is Believed for a Lease that has not expired.
func (j *Judge) judge(l *k8s.DrainLease, local map[netip.Addr]*k8s.Pod, buf []netip.Addr) ([]netip.Addr, bool, time.Time) {
	if l.Holder == "" {
		return buf, false, time.Time{} // no node hosts the pod for it
	}
	if l.Holder == j.Node {
		ips, _, _ := hostedIPs(l, localPods{node: j.Node, byIP: local}.HostOf, buf)
		return ips, len(ips) > len(buf), time.Time{}
	}
	ips, elsewhere, until := hostedIPs(l, j.Slices.HostOf, buf)
	switch {
	case elsewhere:
		return buf, false, until // the pod runs elsewhere: not the holder's to drain
	case len(ips) > len(buf):
		return ips, true, until
	}
	v, ok, recheck := j.Pods.verified(l)
	return append(buf, v...), ok, earliest(recheck, until) // a copy: buf is reused, the verdict kept
}

// hostedIPs is the rule, applied to one record (its HostOf): the IPs of l
// at which the record lists its pod on l's holder, appended to buf, unless
// it lists it at one of them on another node (elsewhere: the Lease is
// refused); until is the earliest end of an ended listing it read. (A
// method value, not a Record: it stays on the stack.)
func hostedIPs(l *k8s.DrainLease, hostOf func(netip.Addr, types.UID) (string, bool, time.Time), buf []netip.Addr) (ips []netip.Addr, elsewhere bool, until time.Time) {
	ips = buf
	for _, ip := range l.IPs {
		node, listed, end := hostOf(ip, l.PodUID)
		until = earliest(until, end)
		if listed && node != l.Holder {
			return buf, true, until
		}
		if listed {
			ips = append(ips, ip)
		}
	}
	return ips, false, until
}

// byPodObject judges l by its pod's object, pod (nil: the API has no pod of
// l's name with l's UID, so the pod is gone): the pod must run on l's
// holder, and only its own IPs count (hostedIPs); a gone pod's Lease counts
// for the inherited addresses among its IPs (Trust.Inherit).
func byPodObject(l *k8s.DrainLease, pod *k8s.Pod, inherited map[netip.Addr]bool) ([]netip.Addr, bool) {
	if pod == nil {
		var ips []netip.Addr
		for _, ip := range l.IPs {
			if inherited[ip] {
				ips = append(ips, ip)
			}
		}
		return ips, len(ips) > 0
	}
	ips, elsewhere, _ := hostedIPs(l, podObject{pod}.HostOf, nil)
	return ips, !elsewhere && len(ips) > 0
}

// localPods is this node's pods as a Record: a pod here runs on node.
type localPods struct {
	node string
	byIP map[netip.Addr]*k8s.Pod
}

func (r localPods) HostOf(ip netip.Addr, uid types.UID) (string, bool, time.Time) {
	if p := r.byIP[ip]; p != nil && p.UID == uid {
		return r.node, true, time.Time{}
	}
	return "", false, time.Time{}
}

// podObject is a Pod object as a Record: it lists its pod at its own IPs,
// on its node.
type podObject struct{ pod *k8s.Pod }

func (r podObject) HostOf(ip netip.Addr, uid types.UID) (string, bool, time.Time) {
	if r.pod.UID == uid && slices.Contains(r.pod.IPs, ip) {
		return r.pod.Node, true, time.Time{}
	}
	return "", false, time.Time{}
}

// earliest returns the earlier of a and b, either of which may be zero
// (none).
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}
