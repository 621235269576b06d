package model

import (
	"iter"
	"maps"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/gonepeers"
)

// Gone returns the model as the gone peers read it (gonepeers.View):
// read-only, on the goroutine that owns the model, during its pass.
func (m *Model) Gone() gonepeers.View { return goneView{m} }

// goneView is the model's read-only view for the gone peers.
type goneView struct{ m *Model }

func (v goneView) NotesGen() uint64 { return v.m.notesGen }

func (v goneView) PodDrains() iter.Seq2[types.UID, gonepeers.Drain] {
	return func(yield func(types.UID, gonepeers.Drain) bool) {
		for uid, pd := range v.m.podDrains {
			if !yield(uid, goneDrainOf(pd)) {
				return
			}
		}
	}
}

func (v goneView) PodDrain(uid types.UID) (gonepeers.Drain, bool) {
	pd := v.m.podDrains[uid]
	if pd == nil {
		return gonepeers.Drain{}, false
	}
	return goneDrainOf(pd), true
}

func goneDrainOf(pd *PodDrain) gonepeers.Drain {
	return gonepeers.Drain{Namespace: pd.Namespace, IPs: pd.IPs, Expires: pd.Expires, Gone: pd.State == StateGone}
}

func (v goneView) ServicesListing(uid types.UID, namespace string) []string {
	return v.m.ServicesListing(uid, namespace)
}

func (v goneView) Listings(uid types.UID) iter.Seq[string] { return maps.Keys(v.m.listings[uid]) }

func (v goneView) VanishedServices(uid types.UID) []string { return v.m.vanishedServicesOf(uid) }

func (v goneView) Lingering(uid types.UID) bool {
	return v.m.lingeringOf(uid) || v.m.vanish.pendingUID(uid)
}

func (v goneView) ClaimedByOther(ip netip.Addr, uid types.UID) bool {
	return v.m.claims.ClaimedByOther(ip, uid)
}
