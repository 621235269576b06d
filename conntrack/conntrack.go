package conntrack

import (
	"context"
	"net/netip"
	"strconv"
	"time"
)

// Proto is an IP protocol number (the flow's layer-4 protocol).
//
// It is the one protocol type besides bpf.Protocol (which k8s and daemon
// use), on purpose: this package is a netlink client that stands alone (no
// BPF, no Kubernetes), and daemon converts in one place (conntrackpolicy.go)
// where the datapath's keys become conntrack filters.
type Proto uint8

// Protocols draind expires flows for.
const (
	TCP Proto = 6
	UDP Proto = 17
)

func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return "proto-" + strconv.Itoa(int(p))
}

// Filter selects the flows that belong to one endpoint.
//
// A flow matches when it lives in the handle's zone (Options.Zone for
// Netlink, SetZone for conntracktest.Fake), its protocol is Proto, its
// reply-direction source is ReplySrc (the pod IP, and the pod port unless ReplySrc.Port() is 0), and,
// when OrigDst is valid, its original-direction destination is OrigDst (a
// Service VIP:port, or the pod IP:port itself for direct dials; port 0 = any).
//
// CreatedBefore, when non-zero, restricts the match to flows that started
// before that instant. It protects a new pod that reused the IP: flows the new
// pod accepted are younger than the moment the old pod was seen gone.
// It needs conntrack timestamps (net.netfilter.nf_conntrack_timestamp=1,
// which Open enables); a flow without a start timestamp is treated as old.
type Filter struct {
	Proto         Proto
	ReplySrc      netip.AddrPort
	OrigDst       netip.AddrPort
	CreatedBefore time.Time
}

// ExpireResult reports one expiry pass.
type ExpireResult struct {
	// Deleted is the number of flows removed from the table.
	Deleted int
	// Kept is the number of flows that matched the tuple filter but were kept
	// because they started after CreatedBefore.
	Kept int
	// PerFilter holds Deleted per filter, in the order given.
	PerFilter []int
}

// TCPState is a conntrack TCP state (as the kernel numbers them).
type TCPState uint8

// The kernel's TCP conntrack states (enum tcp_conntrack).
const (
	TCPNone TCPState = iota
	TCPSynSent
	TCPSynRecv
	TCPEstablished
	TCPFinWait
	TCPCloseWait
	TCPLastAck
	TCPTimeWait
	TCPClose
	TCPSynSent2
	numTCPStates
)

// Counts is the number of flows of one endpoint.
type Counts struct {
	// TCP counts TCP flows by state.
	TCP [numTCPStates]int
	// UDP counts UDP flows.
	UDP int
}

// LiveTCP is the number of TCP flows that are a connection the endpoint
// holds: every state but SYN_SENT, TIME_WAIT and CLOSE (a half-closed
// connection still carries data). A SYN_SENT flow is a SYN the endpoint
// never answered: one dropped on its way (a NetworkPolicy, a pod whose
// network is being torn down) stays so for two minutes, and a SYN that
// does reach a draining pod is counted where it arrives, as a new
// connection, not here.
func (c Counts) LiveTCP() int {
	n := 0
	for s, v := range c.TCP {
		switch TCPState(s) {
		case TCPSynSent, TCPTimeWait, TCPClose:
		default:
			n += v
		}
	}
	return n
}

// Interface is what daemon/ uses; Netlink is the real one,
// conntracktest.Fake the test double.
type Interface interface {
	// Expire deletes, in one batched pass, every flow of the handle's zone
	// matched by any filter.
	Expire(ctx context.Context, filters []Filter) (ExpireResult, error)
	// Count returns the flows of the handle's zone whose reply-direction
	// source is addr.
	Count(ctx context.Context, addr netip.Addr) (Counts, error)
	// Timestamps reports whether flows carry start times. Without them
	// Filter.CreatedBefore cannot tell a new pod's flows on a reused IP
	// from the old pod's (every flow looks old), so the caller must not
	// expire a reused IP's flows.
	Timestamps() bool
	// Close releases the netlink sockets.
	Close() error
}
