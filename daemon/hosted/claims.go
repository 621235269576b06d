package hosted

import (
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/lease"
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
// count; package daemon reads the believed claims), so neither a tenant
// nor another node can use one to end the drain of a pod it does not host.
// Which pod owns an IP, among the believed claims and the cluster's other
// records, is the model's claim rule (model.Claims.ClaimedByOther): a
// believed claim makes every other pod's steering of its IPs void at once,
// and the holder of the older drain Lease ends that drain's linger and
// deletes its own Lease (cleanStaleLeases).

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
func (l *Drains) publishClaims(leases map[types.UID]*k8s.DrainLease, lp *LocalPods, now time.Time) {
	want := map[types.UID]*k8s.Pod{}
	for _, dl := range leases {
		if dl.Holder == l.cfg.Node || !dl.Expires().After(now) {
			continue // ours: cleanStaleLeases decides whether to delete it
		}
		for _, ip := range dl.IPs {
			if p := lp.ByIP[ip]; p != nil && p.UID != dl.PodUID && claimant(p) {
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
	seen := map[types.UID]*k8s.DrainLease{}
	for _, cl := range l.cfg.State.ClaimLeases() {
		seen[cl.PodUID] = cl
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
		if cl := seen[uid]; c.published && cl != nil && !c.req.Describes(cl) {
			// Replaced by another node's claim: no node believes that
			// one for this pod. Publishing replaces it.
			c.published = false
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
func (l *Drains) claimWritten(r lease.Result) {
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
