package hosted

import (
	"context"
	"net/netip"
	"time"

	"github.com/draind/draind/daemon/nodeapi"
)

// Live connections, and where they come from:
//
//   - sockets: the connections the pod accepted since counting started on
//     the node (bpf.Datapath.CountingSince: the first time a draind with
//     the socket hooks attached to fresh maps). For a pod created after
//     that instant the count is complete, whatever the CNI does;
//   - conntrack: the node's flows whose reply source is the pod, but for
//     SYNs it never answered (conntrack.Counts.LiveTCP). Only CNIs
//     that pass pod traffic through the host's netfilter have them; for a
//     pod created before counting started they are the only record of its
//     older connections.
//
// A pod's live count is the larger of the two where both are read: each
// can only miss connections (the sockets those that predate counting,
// conntrack those its CNI never showed it), never invent them. The offline
// answer and `draind status` say which source gave the count.

// Sources of a live-connection count.
const (
	LiveFromSockets   = "sockets"
	LiveFromConntrack = "conntrack"
	// LiveFromNone: neither source is available; "drained" then means only
	// "no new SYN for quiet".
	LiveFromNone = "none"
)

// LiveCount is what this node knows of a hosted pod's live connections.
type LiveCount struct {
	Live int
	// Checked: at least one source was read (or none is configured).
	Checked bool
	// Sockets and Conntrack are each source's count (nil: not read).
	Sockets, Conntrack *int
	// SocketsPartial: the pod was created before counting started, so
	// Sockets misses the connections it accepted before.
	SocketsPartial bool
	// Source is the source Live came from.
	Source string
}

// countLive reads a pod's live connections from every source it has.
// created is the pod's creation time (zero if unknown: partial).
func countLive(ctx context.Context, sd Sockets, ct Conntrack, ips []netip.Addr, created time.Time, ctError func()) LiveCount {
	lc := LiveCount{Checked: true, Source: LiveFromNone}
	if sd != nil {
		n, ok := 0, true
		for _, ip := range ips {
			c, err := sd.Connections(ip)
			if err != nil {
				ok = false
				break
			}
			n += c.Live()
		}
		if ok {
			lc.Sockets = &n
			since, err := sd.CountingSince()
			lc.SocketsPartial = err != nil || since.IsZero() || created.IsZero() || created.Before(since)
		}
	}
	if ct != nil {
		n, ok := 0, true
		for _, ip := range ips {
			c, err := ct.Count(ctx, ip)
			if err != nil {
				ok = false
				if ctError != nil {
					ctError()
				}
				continue
			}
			n += c.LiveTCP()
		}
		if ok {
			lc.Conntrack = &n
		}
	}
	switch {
	case lc.Sockets != nil && lc.SocketsPartial && ct != nil && lc.Conntrack == nil:
		// The pod predates socket counting: its older connections are only
		// in conntrack, which could not be read. Not checked, so not
		// drained on this pass.
		lc.Checked = false
	case lc.Sockets != nil && (lc.Conntrack == nil || *lc.Sockets >= *lc.Conntrack):
		lc.Live, lc.Source = *lc.Sockets, LiveFromSockets
	case lc.Conntrack != nil:
		lc.Live, lc.Source = *lc.Conntrack, LiveFromConntrack
	case sd != nil || ct != nil:
		// A source exists but could not be read: not checked, so not
		// drained on this pass.
		lc.Checked = false
	}
	return lc
}

// liveOf reads a hosted drain's live connections (measure's goroutine).
func (l *Drains) liveOf(ctx context.Context, ld *drain, ips []netip.Addr) LiveCount {
	return countLive(ctx, l.cfg.Sockets, l.cfg.Conntrack, ips, ld.created, l.cfg.Metrics.CTErrors.Inc)
}

// fillOffline copies a drain's live count by source into an offline answer.
func (lc LiveCount) fillOffline(r *nodeapi.Result) {
	r.LiveSockets, r.LiveConntrack, r.LiveSource, r.LiveSocketsPartial = lc.Sockets, lc.Conntrack, lc.Source, lc.SocketsPartial
}
