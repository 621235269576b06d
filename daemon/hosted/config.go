package hosted

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/k8s"
)

// Config is what the hosted drains depend on.
type Config struct {
	Node          string
	Linger        time.Duration // a gone pod's drain (and Lease) stays this long
	LeaseDuration time.Duration
	Quiet         time.Duration // drained = no SYN for this long and no live connection
	MaxWaiters    int
	// MaxWaitersPerPod caps one pod's waits (see reserve).
	MaxWaitersPerPod int

	State State
	// LocalPods is this node's pods as the passes see them (the Daemon's
	// snapshot).
	LocalPods func() *LocalPods
	Claims    Claims
	Datapath  Datapath  // SYN and steering counters
	Sockets   Sockets   // live connections from the socket hooks; nil: not loaded
	Conntrack Conntrack // live connections from conntrack; nil: not counted
	// Leases publishes a drain Lease at once, for an offline call; Writer
	// sends every other write of this node's Leases, off the round.
	Leases  Publisher
	Writer  LeaseWriter
	Events  typedcorev1.EventInterface
	Metrics Metrics
	Log     *slog.Logger
	Clock   clock.PassiveClock
	// RequestPass asks the Daemon for a pass (new keys to learn, a drain
	// that started or ended); Wake asks for a round (Drains.Reconcile)
	// soon: new keys to measure under, a wait to judge. Neither blocks.
	RequestPass, Wake func()
}

// State is what the hosted drains read of the cluster: the drain and claim
// Leases, as the informers cache them (k8s.Informers).
type State interface {
	DrainLeases() []*k8s.DrainLease
	ClaimLeases() []*k8s.DrainLease
}

// Claims says whose an IP is (model.Claims): a drain whose IP another pod
// claims ends its linger, and its Lease goes.
type Claims interface {
	ClaimedByOther(ip netip.Addr, uid types.UID) bool
}

// Datapath is what the hosted drains read of the datapath: the counters of
// a draining endpoint. *bpf.Datapath implements it.
type Datapath interface {
	DrainStats(bpf.EndpointKey) (bpf.DrainStats, error)
}

// Sockets is the socket hooks' count of a pod's live connections (see
// live.go). *bpf.Datapath implements it once they are loaded.
type Sockets interface {
	Connections(netip.Addr) (bpf.ConnCount, error)
	CountingSince() (time.Time, error)
}

// Conntrack counts the flows of a pod in the node's conntrack table
// (conntrack.Interface).
type Conntrack interface {
	Count(ctx context.Context, addr netip.Addr) (conntrack.Counts, error)
}

// Publisher creates (or joins) a drain Lease at once (k8s.Leases).
type Publisher interface {
	Publish(ctx context.Context, r k8s.DrainRequest, now time.Time) (lease *k8s.DrainLease, created bool, err error)
}

// LeaseWriter sends this node's Lease writes (lease.Writer): the hosted
// drains decide them, and are told of each result (Drains.LeaseWritten).
type LeaseWriter interface {
	Want(name string, w lease.Write)
	Has(name string) bool
	Drop(name string)
	DeleteNow(ctx context.Context, name string) error
}

var (
	_ Datapath    = (*bpf.Datapath)(nil)
	_ Sockets     = (*bpf.Datapath)(nil)
	_ Conntrack   = (conntrack.Interface)(nil)
	_ Publisher   = (*k8s.Leases)(nil)
	_ LeaseWriter = (*lease.Writer)(nil)
	_ State       = (*k8s.Informers)(nil)
)

// Metrics are the daemon's metrics the hosted drains count in.
type Metrics struct {
	DrainStarts   *prometheus.CounterVec // by reason
	DrainOutcomes *prometheus.CounterVec // by outcome
	DrainDuration prometheus.Observer
	LeaseOps      *prometheus.CounterVec // by op and result
	CTErrors      prometheus.Counter     // conntrack counts that failed
}

// Log keys, as package daemon names them.
const (
	logKeyPod    = "pod"
	logKeyErr    = "err"
	logKeyReason = "reason"
)
