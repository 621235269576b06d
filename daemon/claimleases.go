package daemon

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// Claim Leases: how every node learns that a pod IP was reused on another
// node. Package hosted publishes this node's and explains the protocol
// (its claims.go). Every node, the drain Lease's holder included, believes
// a claim exactly as it believes a drain Lease (lease.Judge.Believed):
// readClaims. Which pod owns the IP then is the model's claim rule
// (model.Claims.ClaimedByOther).

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
	local               *hosted.LocalPods
	claimsGen, trustGen uint64
	until               time.Time
	initialized         bool
}

// readClaims brings the believed claims up to date and returns the IPs
// whose claim changed (runner goroutine, modelMu held).
func (d *Daemon) readClaims(local *hosted.LocalPods, now time.Time) []netip.Addr {
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
		ips, ok, until := d.judge.Believed(l, local.ByIP, nil, now)
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
