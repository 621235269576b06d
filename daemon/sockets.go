package daemon

import (
	"net/netip"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/hosted"
)

// The socket hooks in the daemon: a draining pod's live connections are
// read from its own sockets (the sock_ops counts), with the node's
// conntrack table as a cross-check where it has the flows (package hosted
// counts them, its live.go); client sockets to gone pods are ended
// (package gonepeers); endpoints that vanish from their Service without
// draining are steered away from like departed ones (sockets_vanish.go).

// SocketDatapath is what the socket hooks add to a Datapath. *bpf.Datapath
// implements it; SocketsLoaded says whether the hooks are in place. A
// Datapath without it (datapathtest.Datapath, or a draind run without the socket
// hooks) counts live connections from conntrack alone and ends no sockets.
type SocketDatapath interface {
	SocketsLoaded() bool
	Connections(netip.Addr) (bpf.ConnCount, error)
	CountingSince() (time.Time, error)
	UpsertGonePeer(bpf.GonePeer) error
	DeleteGonePeer(netip.Addr) error
	UpsertGoneFlow(bpf.GoneFlow) error
	DeleteGoneFlow(local, remote netip.AddrPort) error
	GoneEntries() ([]bpf.GonePeer, []bpf.GoneFlow, error)
	SocketCounters() (bpf.SocketCounters, error)
	PruneConnections(keep func(netip.Addr) bool) (int, error)
}

var _ SocketDatapath = (*bpf.Datapath)(nil)

// socketsOf returns the datapath's socket hooks, or nil when it has none
// loaded.
func socketsOf(dp Datapath) SocketDatapath {
	if sd, ok := dp.(SocketDatapath); ok && sd.SocketsLoaded() {
		return sd
	}
	return nil
}

// Sources of a live-connection count (PodStatus.LiveSource,
// SocketStatus.LiveFrom), as package hosted names them.
const (
	LiveFromSockets   = hosted.LiveFromSockets
	LiveFromConntrack = hosted.LiveFromConntrack
	LiveFromNone      = hosted.LiveFromNone
)
