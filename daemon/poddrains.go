package daemon

import (
	"maps"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/daemon/reconcile"
	"github.com/draind/draind/k8s"
)

// Pod drains: what the drain Leases of the cluster and this node's own
// drains say, for the model (model.setPodDrains). Every pass asks, one per
// slice update of the cluster, and a rollout has hundreds of Leases: a pass
// reads them again only when something they depend on changed (the Lease
// snapshot, this node's pods, who trusted slices list where, the Pod checks
// of registry-only Leases) or a deadline among them passed; otherwise it
// costs a look at this node's own drains.

// podDrainsState is podDrains' own, kept from pass to pass (modelMu).
type podDrainsState struct {
	leases     leaseDrainsMemo
	hosted     map[types.UID]*model.PodDrain // this node's drains of the last pass
	merged     map[types.UID]*model.PodDrain // scratch
	ips        []netip.Addr                  // scratch, let go past reconcile.ScratchKeep
	leasesSeen *drainLeases
	claimsMemo claimsMemo // readClaims'
	// modelGen is the model's podDrainsGen once it took the last answer:
	// any other (an answer not taken, a model changed elsewhere) and the
	// memos are not the model's, so podDrains reads everything again.
	// Invariant: while it equals podDrainsGen, the model's pod drains are
	// leases.drains and hosted merged. Checked by FuzzSequenceDifferential.
	modelGen uint64
}

// leaseDrainsMemo is the drains the Leases gave at the last reading, and
// what that reading depended on. Invariant: drains is what reading every
// Lease gives now while the Lease snapshot, this node's pods (if a Lease of
// its own was read), claimsGen and trustGen are the ones recorded and until
// has not passed; any other, and readLeaseDrains reads them all again.
// Checked by FuzzSequenceDifferential.
type leaseDrainsMemo struct {
	drains      map[types.UID]*model.PodDrain
	leases      *drainLeases
	local       *hosted.LocalPods
	claimsGen   uint64
	trustGen    uint64
	until       time.Time // the first deadline among them (zero: none)
	initialized bool
	// ownLeases: a Lease of this node's was read, so the drains depend on
	// this node's pods (local); others' do not.
	ownLeases bool
}

// podDrains derives the pod drains from the drain Leases and this node's
// hosted drains, and reports whether they changed since the model's. An
// expired Lease ends its drain (fail open: its hosting node may be gone for
// good); a hosted drain holds whatever its Lease says (this node knows its
// pod is draining even when the API server could not be reached to renew
// the Lease). Unchanged drains keep their objects (and the model its map).
func (d *Daemon) podDrains(local *hosted.LocalPods, now time.Time) (map[types.UID]*model.PodDrain, bool) {
	st := &d.drainsState
	prev, gen := d.model.PodDrains()
	if st.modelGen != gen {
		st.leases.initialized = false
		clear(st.hosted)
	}
	st.modelGen = gen
	leasesRead := d.readLeaseDrains(local, prev, now)
	hostedChanged := st.readHosted(d.hosted, prev)
	if !leasesRead && !hostedChanged {
		return prev, false
	}
	if st.merged == nil {
		st.merged = map[types.UID]*model.PodDrain{}
	}
	next := st.merged
	clear(next)
	maps.Copy(next, st.leases.drains)
	maps.Copy(next, st.hosted) // this node's own word wins
	if maps.Equal(prev, next) {
		return prev, false // the same objects: nothing changed
	}
	st.modelGen++ // what setPodDrains makes it
	return maps.Clone(next), true
}

// readLeaseDrains brings st.leases up to date, reading every Lease again
// if anything it depended on changed. It reports whether it read them.
func (d *Daemon) readLeaseDrains(local *hosted.LocalPods, prev map[types.UID]*model.PodDrain, now time.Time) bool {
	st := &d.drainsState
	mm := &st.leases
	leases := d.drainLeasesNow()
	if leases != st.leasesSeen {
		st.leasesSeen = leases
		d.leaseTrust.ForgetExcept(leases.names)
		d.claims.Watch(otherNodesIPs(leases, d.cfg.Node))
	}
	claimsGen, trustGen := d.claims.Generation(), d.leaseTrust.Generation()
	if mm.initialized && mm.leases == leases && (mm.local == local || !mm.ownLeases) && mm.claimsGen == claimsGen &&
		mm.trustGen == trustGen && (mm.until.IsZero() || now.Before(mm.until)) {
		return false
	}
	*mm = leaseDrainsMemo{drains: mm.drains, leases: leases, local: local, claimsGen: claimsGen, trustGen: trustGen, initialized: true}
	if mm.drains == nil {
		mm.drains = map[types.UID]*model.PodDrain{}
	}
	clear(mm.drains)
	for _, l := range leases.list {
		mm.ownLeases = mm.ownLeases || l.Holder == d.cfg.Node
		ips, ok, until := d.judge.Believed(l, local.ByIP, st.ips[:0], now)
		mm.deadline(until)
		if cap(ips) <= reconcile.ScratchKeep {
			st.ips = ips[:0]
		}
		if ok {
			model.KeepPodDrain(mm.drains, prev, &model.PodDrain{UID: l.PodUID, Namespace: l.PodNamespace, Name: l.PodName, IPs: ips,
				Reason: l.Reason, Since: l.Acquired, Expires: l.Expires(), Holder: l.Holder, Lease: true, State: l.State,
				SteerPodIP: l.SteerPodIP || l.State == StateGone})
		}
	}
	return true
}

// otherNodesIPs returns the IPs the Leases (drains and claims) of nodes
// other than node name: those whose listings their answers depend on
// (claims.watch).
func otherNodesIPs(leases *drainLeases, node string) []netip.Addr {
	var ips []netip.Addr
	for _, list := range [2][]*k8s.DrainLease{leases.list, leases.claims} {
		for _, l := range list {
			if l.Holder != node {
				ips = append(ips, l.IPs...)
			}
		}
	}
	return ips
}

// deadline makes t (if set) a deadline of the memo.
func (mm *leaseDrainsMemo) deadline(t time.Time) {
	if !t.IsZero() && (mm.until.IsZero() || t.Before(mm.until)) {
		mm.until = t
	}
}

// readHosted reads this node's drains into st.hosted and reports whether
// they changed since the last pass.
func (st *podDrainsState) readHosted(h *hosted.Drains, prev map[types.UID]*model.PodDrain) bool {
	if st.hosted == nil {
		st.hosted = map[types.UID]*model.PodDrain{}
	}
	changed, n := false, 0
	h.EachPodDrain(func(pd *model.PodDrain) {
		n++
		if cur := st.hosted[pd.UID]; cur == nil || !cur.Identical(pd) {
			changed = true
		}
	})
	if !changed && n == len(st.hosted) {
		return false
	}
	clear(st.hosted)
	h.EachPodDrain(func(pd *model.PodDrain) { model.KeepPodDrain(st.hosted, prev, pd) })
	return true
}
