package bpf

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// The socket hooks (sockops.c, egress.c) and their maps.
//
// Live connections: the sock_ops program counts every passively established
// TCP connection under its local (pod) address and every close of a counted
// one, so a draining pod's live connections are read from its own sockets,
// whatever the CNI does with conntrack. Connections established before the
// program was first attached to fresh maps are not counted (CountingSince).
//
// Gone peers: a gone pod's IP (UpsertGonePeer), or a client flow to a VIP
// that conntrack translated to a gone pod (UpsertGoneFlow), ends the client
// sockets connected to it before it went: TCP at its next retransmission
// timeout (TCP_USER_TIMEOUT set to 1 ms from the sock_ops RTO callback),
// connected UDP at its next send (EPERM: the egress hook drops it). A
// client socket is timestamped only if its peer is already listed gone when
// it connects (a new pod that reused the IP): it is spared. The "gone" flag
// in draind_node is up from before the first such entry until after the
// last is deleted; while it is down, the hooks look nothing up.

// socketAttachNames are the attachments Options.Sockets adds.
var socketAttachNames = []string{"sockops", "egress"}

func (d *Datapath) loadSockets(copts *ebpf.CollectionOptions, mapDir string) error {
	spec, err := loadSockops()
	if err != nil {
		return fmt.Errorf("loading sockops spec: %w", err)
	}
	var n uint32
	if err := spec.Variables["draind_num_sock_events"].Get(&n); err != nil || int(n) != NumSocketEvents {
		return fmt.Errorf("sockops object reports %d socket events, Go expects %d (regenerate with go generate ./bpf/...): %v", n, NumSocketEvents, err)
	}
	if err := spec.LoadAndAssign(&d.sock, copts); err != nil {
		return fmt.Errorf("loading the sock_ops program: %w", explainLoad(err, mapDir))
	}
	espec, err := loadEgress()
	if err != nil {
		d.sock.Close()
		return fmt.Errorf("loading egress spec: %w", err)
	}
	if err := espec.LoadAndAssign(&d.egr, copts); err != nil {
		d.sock.Close()
		return fmt.Errorf("loading the egress program: %w", explainLoad(err, mapDir))
	}
	d.sockets = true
	return nil
}

func (d *Datapath) socketAttachments() []attachment {
	return []attachment{
		{"sockops", d.sock.DraindSockops, ebpf.AttachCGroupSockOps},
		{"egress", d.egr.DraindEgress, ebpf.AttachCGroupInetEgress},
	}
}

// beforeAttach records, with the socket hooks, the instant counting starts
// unless the maps already hold one: before the programs are attached, so
// every socket they count is counted after it (the sock_ops program ignores
// the close of a socket counted before it).
func (d *Datapath) beforeAttach() error {
	if !d.sockets {
		return nil
	}
	zero := uint32(0)
	var info sockopsSockInfo
	if err := d.steer.DraindSockInfo.Lookup(&zero, &info); err != nil {
		return fmt.Errorf("reading %s: %w", MapSockInfo, err)
	}
	if info.CountingSinceNs != 0 {
		return nil
	}
	info.CountingSinceNs = uint64(bootNow())
	if err := d.put(MapSockInfo, d.steer.DraindSockInfo, &zero, &info); err != nil {
		return fmt.Errorf("recording when connection counting started: %w", err)
	}
	return nil
}

// afterAttach finishes Attach: without the socket hooks, links of them that
// an earlier draind pinned are detached (the configuration changed) and the
// counts are reset.
func (d *Datapath) afterAttach(linkDir string) error {
	if !d.sockets {
		for _, name := range socketAttachNames {
			pin := filepath.Join(linkDir, name)
			l, err := link.LoadPinnedLink(pin, nil)
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			if err != nil {
				return fmt.Errorf("loading pinned %s link: %w", name, err)
			}
			err = errors.Join(l.Unpin(), l.Close())
			if err != nil {
				return fmt.Errorf("detaching the %s program (socket hooks are off): %w", name, err)
			}
		}
		return d.resetCounting()
	}
	return nil
}

// resetCounting forgets the connection counts and when counting started:
// while the hooks are off no close is counted, so counts kept across that
// gap would hold connections that ended in it for ever (a pod never
// drained). The next draind with the hooks starts counting afresh, and the
// sock_ops program ignores the close of a socket counted before that.
func (d *Datapath) resetCounting() error {
	all, err := d.AllConnections()
	if err != nil {
		return err
	}
	for a := range all {
		k := sockopsAddrKey{Addr: addr16(a)}
		if err := d.del(MapLocalConns, d.steer.DraindLocalConns, &k); err != nil {
			return fmt.Errorf("resetting connection counts (socket hooks are off): %w", err)
		}
	}
	zero := uint32(0)
	var info sockopsSockInfo
	if err := d.put(MapSockInfo, d.steer.DraindSockInfo, &zero, &info); err != nil {
		return fmt.Errorf("resetting when connection counting started (socket hooks are off): %w", err)
	}
	return nil
}

// SocketsLoaded reports whether the socket hooks are loaded (Options.Sockets).
func (d *Datapath) SocketsLoaded() bool { return d.sockets }

// ConnCount is what the sock_ops program counted for one local address.
type ConnCount struct {
	// Opened counts passively established connections, Closed those of
	// them that ended; both only grow.
	Opened, Closed uint64
}

// Live is the number of connections still open.
func (c ConnCount) Live() int {
	if c.Closed > c.Opened {
		return 0
	}
	return int(c.Opened - c.Closed)
}

// Connections returns the counts of one local pod address (zero if none).
func (d *Datapath) Connections(addr netip.Addr) (ConnCount, error) {
	if !addr.IsValid() {
		return ConnCount{}, fmt.Errorf("reading connections: invalid address")
	}
	k := sockopsAddrKey{Addr: addr16(addr)}
	var v sockopsConnCount
	if err := d.steer.DraindLocalConns.Lookup(&k, &v); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return ConnCount{}, nil
		}
		return ConnCount{}, fmt.Errorf("reading connections of %s: %w", addr, err)
	}
	return ConnCount{Opened: v.Opened, Closed: v.Closed}, nil
}

// AllConnections returns the counts of every local address.
func (d *Datapath) AllConnections() (map[netip.Addr]ConnCount, error) {
	out := map[netip.Addr]ConnCount{}
	var k sockopsAddrKey
	var v sockopsConnCount
	it := d.steer.DraindLocalConns.Iterate()
	for it.Next(&k, &v) {
		out[decodeAddr(k.Addr)] = ConnCount{Opened: v.Opened, Closed: v.Closed}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", MapLocalConns, err)
	}
	return out, nil
}

// PruneConnections deletes the counts of addresses keep rejects that have no
// live connection (pods gone from the node). It returns how many it deleted.
func (d *Datapath) PruneConnections(keep func(netip.Addr) bool) (int, error) {
	all, err := d.AllConnections()
	if err != nil {
		return 0, err
	}
	n := 0
	for a, c := range all {
		if c.Live() > 0 || keep(a) {
			continue
		}
		k := sockopsAddrKey{Addr: addr16(a)}
		if err := d.del(MapLocalConns, d.steer.DraindLocalConns, &k); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// CountingSince is when connection counting started on these maps (zero if
// the socket hooks were never attached): a pod created before it may have
// connections the counts do not hold.
func (d *Datapath) CountingSince() (time.Time, error) {
	zero := uint32(0)
	var info sockopsSockInfo
	if err := d.steer.DraindSockInfo.Lookup(&zero, &info); err != nil {
		return time.Time{}, fmt.Errorf("reading %s: %w", MapSockInfo, err)
	}
	return fromBoot(info.CountingSinceNs), nil
}

// GonePeer is a gone pod IP: client sockets connected to it before GoneAt
// end.
type GonePeer struct {
	Addr    netip.Addr
	GoneAt  time.Time
	Expires time.Time
}

// GoneFlow is a client flow, as the client socket sees it (Local is the
// client, Remote usually a Service VIP), that the node's conntrack
// translated to a gone pod.
type GoneFlow struct {
	Local, Remote netip.AddrPort
	GoneAt        time.Time
	Expires       time.Time
}

func goneVal(goneAt, expires time.Time) sockopsGoneVal {
	return sockopsGoneVal{GoneNs: toBoot(goneAt), ExpiresNs: toBoot(expires)}
}

func flowKey(local, remote netip.AddrPort) sockopsFlowKey {
	return sockopsFlowKey{Local: addr16(local.Addr()), Remote: addr16(remote.Addr()),
		LocalPort: local.Port(), RemotePort: remote.Port()}
}

// UpsertGonePeer creates or replaces a gone peer.
func (d *Datapath) UpsertGonePeer(g GonePeer) error {
	if !g.Addr.IsValid() || g.GoneAt.IsZero() {
		return fmt.Errorf("upserting gone peer %v: an address and the instant it went are required", g.Addr)
	}
	k := sockopsAddrKey{Addr: addr16(g.Addr)}
	v := goneVal(g.GoneAt, g.Expires)
	d.entries.Lock()
	defer d.entries.Unlock()
	if err := d.raiseGone(); err != nil {
		return err
	}
	if err := d.put(MapGonePeers, d.steer.DraindGonePeers, &k, &v); err != nil {
		return errors.Join(err, d.afterGoneChange())
	}
	d.entries.gonePeers[k] = struct{}{}
	return nil
}

// DeleteGonePeer removes a gone peer (absent is fine).
func (d *Datapath) DeleteGonePeer(addr netip.Addr) error {
	k := sockopsAddrKey{Addr: addr16(addr)}
	d.entries.Lock()
	defer d.entries.Unlock()
	if err := d.del(MapGonePeers, d.steer.DraindGonePeers, &k); err != nil {
		return err
	}
	delete(d.entries.gonePeers, k)
	return d.afterGoneChange()
}

// UpsertGoneFlow creates or replaces a gone flow.
func (d *Datapath) UpsertGoneFlow(g GoneFlow) error {
	if !g.Local.IsValid() || !g.Remote.IsValid() || g.GoneAt.IsZero() {
		return fmt.Errorf("upserting gone flow %v -> %v: both ends and the instant it went are required", g.Local, g.Remote)
	}
	k := flowKey(g.Local, g.Remote)
	v := goneVal(g.GoneAt, g.Expires)
	d.entries.Lock()
	defer d.entries.Unlock()
	if err := d.raiseGone(); err != nil {
		return err
	}
	if err := d.put(MapGoneFlows, d.steer.DraindGoneFlows, &k, &v); err != nil {
		return errors.Join(err, d.afterGoneChange())
	}
	d.entries.goneFlows[k] = struct{}{}
	return nil
}

// DeleteGoneFlow removes a gone flow (absent is fine).
func (d *Datapath) DeleteGoneFlow(local, remote netip.AddrPort) error {
	k := flowKey(local, remote)
	d.entries.Lock()
	defer d.entries.Unlock()
	if err := d.del(MapGoneFlows, d.steer.DraindGoneFlows, &k); err != nil {
		return err
	}
	delete(d.entries.goneFlows, k)
	return d.afterGoneChange()
}

// raiseGone raises the gone flag before an entry is written. Callers hold
// d.entries.
func (d *Datapath) raiseGone() error {
	if d.entries.gone {
		return nil
	}
	if err := d.writeFlags(d.entries.draining, true); err != nil {
		return fmt.Errorf("raising the gone flag: %w", err)
	}
	return nil
}

// afterGoneChange lowers the gone flag once no gone entry is left. Callers
// hold d.entries. A failure leaves it raised: sockets get timestamps they
// do not need, nothing else.
func (d *Datapath) afterGoneChange() error {
	if !d.entries.gone || len(d.entries.gonePeers)+len(d.entries.goneFlows) > 0 {
		return nil
	}
	if err := d.writeFlags(d.entries.draining, false); err != nil {
		return fmt.Errorf("clearing the gone flag: %w", err)
	}
	return nil
}

// GoneEntries returns the gone peers and flows in the maps.
func (d *Datapath) GoneEntries() ([]GonePeer, []GoneFlow, error) {
	var peers []GonePeer
	var flows []GoneFlow
	var ak sockopsAddrKey
	var v sockopsGoneVal
	it := d.steer.DraindGonePeers.Iterate()
	for it.Next(&ak, &v) {
		peers = append(peers, GonePeer{Addr: decodeAddr(ak.Addr), GoneAt: fromBoot(v.GoneNs), Expires: fromBoot(v.ExpiresNs)})
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", MapGonePeers, err)
	}
	var fk sockopsFlowKey
	it = d.steer.DraindGoneFlows.Iterate()
	for it.Next(&fk, &v) {
		flows = append(flows, GoneFlow{
			Local:  netip.AddrPortFrom(decodeAddr(fk.Local), fk.LocalPort),
			Remote: netip.AddrPortFrom(decodeAddr(fk.Remote), fk.RemotePort),
			GoneAt: fromBoot(v.GoneNs), Expires: fromBoot(v.ExpiresNs)})
	}
	if err := it.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", MapGoneFlows, err)
	}
	return peers, flows, nil
}

// SocketEvent is something the socket hooks did (numbered as enum
// sock_event in bpf/draind.h).
type SocketEvent uint32

// Socket events.
const (
	SockCounted            = SocketEvent(sockopsSockEventSOCK_EV_COUNTED)
	SockUncounted          = SocketEvent(sockopsSockEventSOCK_EV_UNCOUNTED)
	SockNoStorage          = SocketEvent(sockopsSockEventSOCK_EV_NO_STORAGE)
	SockTCPEnded           = SocketEvent(sockopsSockEventSOCK_EV_TCP_ENDED)
	SockTCPEndedFlow       = SocketEvent(sockopsSockEventSOCK_EV_TCP_ENDED_FLOW)
	SockTCPSpared          = SocketEvent(sockopsSockEventSOCK_EV_TCP_SPARED)
	SockTCPSetsockoptError = SocketEvent(sockopsSockEventSOCK_EV_TCP_SETSOCKOPT_FAILED)
	SockUDPRefused         = SocketEvent(sockopsSockEventSOCK_EV_UDP_REFUSED)
	SockUDPEnded           = SocketEvent(sockopsSockEventSOCK_EV_UDP_ENDED)
	SockUDPSpared          = SocketEvent(sockopsSockEventSOCK_EV_UDP_SPARED)
	NumSocketEvents        = int(sockopsSockEventSOCK_EV_MAX)
)

var socketEventNames = [NumSocketEvents]string{
	SockCounted:            "conn_counted",
	SockUncounted:          "conn_closed",
	SockNoStorage:          "no_storage",
	SockTCPEnded:           "tcp_ended",
	SockTCPEndedFlow:       "tcp_ended_flow",
	SockTCPSpared:          "tcp_spared_newer",
	SockTCPSetsockoptError: "tcp_setsockopt_failed",
	SockUDPRefused:         "udp_send_refused",
	SockUDPEnded:           "udp_ended",
	SockUDPSpared:          "udp_spared_newer",
}

func (e SocketEvent) String() string {
	if int(e) < NumSocketEvents {
		return socketEventNames[e]
	}
	return fmt.Sprintf("socket-event-%d", uint32(e))
}

// SocketCounters are the socket hooks' event counters, summed over CPUs.
type SocketCounters [NumSocketEvents][2]uint64

// Get returns one counter.
func (c *SocketCounters) Get(e SocketEvent, f Family) uint64 { return c[e][f] }

// SocketCounters reads the socket hooks' event counters.
func (d *Datapath) SocketCounters() (SocketCounters, error) {
	var c SocketCounters
	var percpu []uint64
	for e := 0; e < NumSocketEvents; e++ {
		for f := 0; f < 2; f++ {
			idx := uint32(e*2 + f)
			if err := d.steer.DraindSockCounters.Lookup(&idx, &percpu); err != nil {
				return c, fmt.Errorf("reading socket counter %d: %w", idx, err)
			}
			for _, v := range percpu {
				c[e][f] += v
			}
		}
	}
	return c, nil
}

// clearGone deletes every gone entry and lowers the gone flag.
func (d *Datapath) clearGone() error {
	d.entries.Lock()
	defer d.entries.Unlock()
	for k := range d.entries.gonePeers {
		if err := d.del(MapGonePeers, d.steer.DraindGonePeers, &k); err != nil {
			return fmt.Errorf("clearing gone peers: %w", err)
		}
		delete(d.entries.gonePeers, k)
	}
	for k := range d.entries.goneFlows {
		if err := d.del(MapGoneFlows, d.steer.DraindGoneFlows, &k); err != nil {
			return fmt.Errorf("clearing gone flows: %w", err)
		}
		delete(d.entries.goneFlows, k)
	}
	return d.afterGoneChange()
}
