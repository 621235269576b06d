package datapathtest

import (
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/draind/draind/bpf"
)

// Sockets is Datapath with the socket hooks (daemon.SocketDatapath):
// connection counts the test sets, gone peers and gone flows recorded.
type Sockets struct {
	*Datapath

	mu        sync.Mutex
	since     time.Time
	conns     map[netip.Addr]bpf.ConnCount
	peers     map[netip.Addr]bpf.GonePeer
	flows     map[[2]netip.AddrPort]bpf.GoneFlow
	upsertErr error // what UpsertGonePeer fails with, if set
	readErr   error // what the status reads fail with, if set
	peerOps   int   // gone-peer upserts and deletes applied
}

// NewSockets returns empty socket maps whose counters started at since.
func NewSockets(since time.Time) *Sockets {
	return &Sockets{Datapath: New(), since: since, conns: map[netip.Addr]bpf.ConnCount{},
		peers: map[netip.Addr]bpf.GonePeer{}, flows: map[[2]netip.AddrPort]bpf.GoneFlow{}}
}

// SocketsLoaded implements daemon.SocketDatapath: the hooks are always there.
func (f *Sockets) SocketsLoaded() bool { return true }

// CountingSince implements daemon.SocketDatapath.
func (f *Sockets) CountingSince() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.since, f.readErr
}

// Connections implements daemon.SocketDatapath with the count SetLive set.
func (f *Sockets) Connections(a netip.Addr) (bpf.ConnCount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns[a], nil
}

// SetLive makes n connections to a open.
func (f *Sockets) SetLive(a netip.Addr, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns[a] = bpf.ConnCount{Opened: uint64(n) + 3, Closed: 3}
}

// SetUpsertErr makes UpsertGonePeer fail with err (nil: succeed again), as
// a full map would.
func (f *Sockets) SetUpsertErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.upsertErr = err
}

// SetReadErr makes CountingSince, GoneEntries and SocketCounters fail
// with err (nil: succeed again), as an unreadable map would.
func (f *Sockets) SetReadErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.readErr = err
}

// UpsertGonePeer implements daemon.SocketDatapath.
func (f *Sockets) UpsertGonePeer(p bpf.GonePeer) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.upsertErr != nil {
		return f.upsertErr
	}
	f.peerOps++
	f.peers[p.Addr] = p
	return nil
}

// DeleteGonePeer implements daemon.SocketDatapath.
func (f *Sockets) DeleteGonePeer(a netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.peerOps++
	delete(f.peers, a)
	return nil
}

// UpsertGoneFlow implements daemon.SocketDatapath.
func (f *Sockets) UpsertGoneFlow(g bpf.GoneFlow) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows[[2]netip.AddrPort{g.Local, g.Remote}] = g
	return nil
}

// DeleteGoneFlow implements daemon.SocketDatapath.
func (f *Sockets) DeleteGoneFlow(l, r netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.flows, [2]netip.AddrPort{l, r})
	return nil
}

// GoneEntries implements daemon.SocketDatapath.
func (f *Sockets) GoneEntries() ([]bpf.GonePeer, []bpf.GoneFlow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.readErr != nil {
		return nil, nil, f.readErr
	}
	return slices.Collect(maps.Values(f.peers)), slices.Collect(maps.Values(f.flows)), nil
}

// SocketCounters implements daemon.SocketDatapath: all zero.
func (f *Sockets) SocketCounters() (bpf.SocketCounters, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return bpf.SocketCounters{}, f.readErr
}

// PruneConnections implements daemon.SocketDatapath: nothing to prune.
func (f *Sockets) PruneConnections(func(netip.Addr) bool) (int, error) { return 0, nil }

// UpsertErr returns what SetUpsertErr set.
func (f *Sockets) UpsertErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.upsertErr
}

// GonePeers returns the gone peers' addresses, sorted.
func (f *Sockets) GonePeers() []netip.Addr {
	return slices.SortedFunc(maps.Keys(f.PeerMap()), netip.Addr.Compare)
}

// Peer returns the gone-peer entry of a.
func (f *Sockets) Peer(a string) (bpf.GonePeer, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.peers[netip.MustParseAddr(a)]
	return p, ok
}

// PeerMap returns a copy of the gone peers.
func (f *Sockets) PeerMap() map[netip.Addr]bpf.GonePeer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.peers)
}

// Flows returns the gone flows, in no order.
func (f *Sockets) Flows() []bpf.GoneFlow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Collect(maps.Values(f.flows))
}

// HasFlow reports whether the gone flow local → remote is listed.
func (f *Sockets) HasFlow(local, remote netip.AddrPort) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.flows[[2]netip.AddrPort{local, remote}]
	return ok
}

// PeerOps counts the gone-peer upserts and deletes applied.
func (f *Sockets) PeerOps() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peerOps
}
