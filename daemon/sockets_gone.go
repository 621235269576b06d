package daemon

import (
	"iter"
	"maps"
	"net/netip"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/gonepeers"
	"github.com/draind/draind/k8s"
)

// newGonePeers wires the gone peers (package gonepeers: ending client
// sockets to gone pods) to the daemon's datapath and conntrack.
func (d *Daemon) newGonePeers() *gonepeers.Peers {
	cfg := gonepeers.Config{State: d.state, EntryTTL: d.cfg.EntryTTL,
		DatapathErrors: d.Metrics.DatapathErrors, CTErrors: d.Metrics.CTErrors, Log: d.log,
		OnWarning: func(svc, value string) {
			d.log.Warn("invalid "+k8s.AnnotationEndDeadConnections+" annotation, using the default (true)", logKeyService, svc, logKeyValue, value)
		}}
	if sd := socketsOf(d.datapath); sd != nil {
		cfg.Sockets = sd
	}
	if fl, ok := d.conntrack.(conntrack.FlowLister); ok && d.conntrack != nil {
		cfg.Flows = fl
	}
	if d.cfg.FlowLister != nil && d.conntrack != nil {
		cfg.Flows = d.cfg.FlowLister
	}
	return gonepeers.New(cfg)
}

// goneView is the model as the gone peers read it (gonepeers.View):
// read-only, on the goroutine that owns the model, during its pass.
type goneView struct{ m *model }

var _ gonepeers.View = goneView{}

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

func goneDrainOf(pd *podDrain) gonepeers.Drain {
	return gonepeers.Drain{Namespace: pd.Namespace, IPs: pd.IPs, Expires: pd.Expires, Gone: pd.State == StateGone}
}

func (v goneView) ServicesListing(uid types.UID, namespace string) []string {
	return v.m.servicesListing(uid, namespace)
}

func (v goneView) Listings(uid types.UID) iter.Seq[string] { return maps.Keys(v.m.listings[uid]) }

func (v goneView) VanishedServices(uid types.UID) []string { return v.m.vanishedServicesOf(uid) }

func (v goneView) Lingering(uid types.UID) bool {
	return v.m.lingeringOf(uid) || v.m.vanish.pendingUID(uid)
}

func (v goneView) ClaimedByOther(ip netip.Addr, uid types.UID) bool {
	return v.m.claims.claimedByOther(ip, uid)
}
