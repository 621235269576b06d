package daemon

import (
	"net/netip"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// Claim Leases: how every node learns that a pod IP was reused on another
// node.
//
// A drain Lease names its pod's IPs; once the pod is gone the IPs are
// steered (or refused) for the linger. When the IP is given to a new pod
// on another node, only that node sees the new pod (each node watches its
// own pods), and only the drain Lease's holder may delete the Lease (the
// shipped Lease policy). So the new pod's node publishes a claim Lease of
// its own (k8s.LabelClaimValue): "pod P on this node has these IPs now".
// It lives while the node hosts P (not deleting) and a drain Lease of
// another pod, held by another node and not expired, names one of P's
// IPs; the node renews it as it renews a drain Lease and deletes it when
// that ends. If the node stops, the claim expires.
//
// Every node, the drain Lease's holder included, believes a claim exactly
// as it believes a drain Lease (lease.Judge.Believed: the holder must host
// the pod, by trusted slices or the Pod object, and only the pod's own IPs
// count), so neither a tenant nor another node can use one to end the
// drain of a pod it does not host. Which pod owns an IP, among the believed
// claims and the cluster's other records, is the model's claim rule
// (model.Claims.ClaimedByOther): a believed claim makes every other pod's
// steering of its IPs void at once, and the holder of the older drain Lease
// ends that drain's linger and deletes its own Lease.

// claimLister is a State that also has claim Leases (k8s.Informers; a
// test's State may have none).
type claimLister interface {
	ClaimLeases() []*k8s.DrainLease
}

func claimLeasesOf(st model.State) []*k8s.DrainLease {
	if cl, ok := st.(claimLister); ok {
		return cl.ClaimLeases()
	}
	return nil
}

// claimsMemo is what the believed claims were read from at the last
// reading (see readLeaseDrains' memo).
type claimsMemo struct {
	leases              *drainLeases
	local               *localPods
	claimsGen, trustGen uint64
	until               time.Time
	initialized         bool
}

// readClaims brings the believed claims up to date and returns the IPs
// whose claim changed (runner goroutine, modelMu held).
func (d *Daemon) readClaims(local *localPods, now time.Time) []netip.Addr {
	mm := &d.drainsState.claimsMemo
	leases := d.drainLeasesNow()
	claimsGen, trustGen := d.claims.Generation(), d.leaseTrust.Generation()
	if mm.initialized && mm.leases == leases && mm.local == local && mm.claimsGen == claimsGen &&
		mm.trustGen == trustGen && (mm.until.IsZero() || now.Before(mm.until)) {
		return nil
	}
	*mm = claimsMemo{leases: leases, local: local, claimsGen: claimsGen, trustGen: trustGen, initialized: true}
	deadline := func(t time.Time) {
		if !t.IsZero() && (mm.until.IsZero() || t.Before(mm.until)) {
			mm.until = t
		}
	}
	var next map[netip.Addr]types.UID
	for _, l := range leases.claims {
		ips, ok, until := d.judge.Believed(l, local.byIP, nil, now)
		deadline(until)
		if !ok {
			continue
		}
		if next == nil {
			next = map[netip.Addr]types.UID{}
		}
		for _, ip := range ips {
			next[ip] = l.PodUID
		}
	}
	changed := d.claims.SetRemote(next)
	if len(changed) > 0 {
		d.log.Info("pod IPs claimed by a pod of another node changed", "ips", changed)
		d.wakeHosted() // a drain of ours may have lost its IP
	}
	return changed
}

// claimPub is a claim Lease this node publishes.
type claimPub struct {
	req       k8s.DrainRequest
	published bool
	lastRenew time.Time
}

// claimant reports whether p can claim its IPs: it has them and is not
// going away.
func claimant(p *k8s.Pod) bool {
	return !p.HostNetwork && !p.Deleting() && !p.Finished() && len(p.IPs) > 0
}

// publishClaims publishes, renews and deletes this node's claim Leases
// (l.mu held): a local pod claims its IPs while a live drain Lease of
// another pod, held by another node, names one of them.
func (l *hostedDrains) publishClaims(leases map[types.UID]*k8s.DrainLease, lp *localPods, now time.Time) {
	want := map[types.UID]*k8s.Pod{}
	for _, dl := range leases {
		if dl.Holder == l.cfg.Node || !dl.Expires().After(now) {
			continue // ours: cleanStaleLeases decides whether to delete it
		}
		for _, ip := range dl.IPs {
			if p := lp.byIP[ip]; p != nil && p.UID != dl.PodUID && claimant(p) {
				want[p.UID] = p
			}
		}
	}
	if l.claimed == nil {
		l.claimed = map[types.UID]*claimPub{}
	}
	for uid := range l.claimed {
		if want[uid] == nil {
			delete(l.claimed, uid)
			l.deleteLease(k8s.ClaimName(uid), l.cfg.Node)
		}
	}
	for _, cl := range claimLeasesOf(l.cfg.State) {
		if want[cl.PodUID] == nil && !l.cfg.Writer.Has(cl.Name) {
			l.deleteLease(cl.Name, cl.Holder) // ours, left by an earlier run
		}
	}
	for uid, p := range want {
		c := l.claimed[uid]
		if c == nil {
			c = &claimPub{req: k8s.DrainRequest{PodNamespace: p.Namespace, PodName: p.Name, PodUID: uid, IPs: p.IPs,
				Node: l.cfg.Node, Reason: "ip-claim", Duration: l.cfg.LeaseDuration, Claim: true}}
			l.claimed[uid] = c
			l.cfg.Log.Info("claiming a reused pod IP", logKeyPod, p.Namespace+"/"+p.Name, "ips", p.IPs)
		}
		switch {
		case !c.published:
			l.cfg.Writer.Want(k8s.ClaimName(uid), lease.Write{Kind: lease.Publish, Req: c.req})
		case now.Sub(c.lastRenew) >= l.cfg.LeaseDuration/3:
			l.cfg.Writer.Want(k8s.ClaimName(uid), lease.Write{Kind: lease.Renew})
		}
	}
}

// claimWritten records a write of a claim Lease (the writer's goroutine).
func (l *hostedDrains) claimWritten(r lease.Result) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := l.claimed[types.UID(strings.TrimPrefix(r.Name, k8s.ClaimPrefix))]
	switch {
	case c == nil || r.Kind == lease.Delete:
	case r.Err == nil:
		c.published, c.lastRenew = true, r.At
	case apierrors.IsNotFound(r.Err):
		c.published = false // deleted under us: create it again
	}
}
