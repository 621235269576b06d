package gonepeers

import (
	"iter"
	"log/slog"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/k8s"
)

// Config is what ending sockets to gone pods depends on.
type Config struct {
	Sockets  Sockets              // nil: the socket hooks are not loaded
	Flows    conntrack.FlowLister // nil: no conntrack (VIP flows are not found)
	State    State
	EntryTTL time.Duration
	// DatapathErrors counts failed map writes by kind (map_full, other);
	// CTErrors failed conntrack reads.
	DatapathErrors *prometheus.CounterVec
	CTErrors       prometheus.Counter
	Log            *slog.Logger
	OnWarning      func(service, value string) // a bad annotation value, once each
}

// View is the model as the gone peers read it: the pod drains, the
// Services noted for them and the claims of their IPs. It is read only
// during Pass, on the goroutine that owns the model; nothing here writes
// through it.
type View interface {
	// NotesGen changes whenever the pod drains, Listings or
	// VanishedServices change: what Peers derived from them may be reused
	// while it is the same.
	NotesGen() uint64
	// PodDrains yields every pod drain, in no order.
	PodDrains() iter.Seq2[types.UID, Drain]
	// PodDrain returns the pod's drain; false if the pod does not drain.
	PodDrain(uid types.UID) (Drain, bool)
	// ServicesListing returns the Services whose slices list the pod, or
	// listed it while it drained.
	ServicesListing(uid types.UID, namespace string) []string
	// Listings yields the Services that listed the pod while it drained.
	Listings(uid types.UID) iter.Seq[string]
	// VanishedServices returns the Services that listed the pod when its
	// endpoint vanished (left its slices while ready).
	VanishedServices(uid types.UID) []string
	// Lingering reports whether the pod's departed endpoints linger, or
	// the Services of its vanished endpoints are still on record.
	Lingering(uid types.UID) bool
	// ClaimedByOther reports whether a pod other than uid claims ip.
	ClaimedByOther(ip netip.Addr, uid types.UID) bool
}

// Drain is what the gone peers read of one pod drain.
type Drain struct {
	Namespace string
	IPs       []netip.Addr
	Expires   time.Time // zero: no deadline
	// Gone: the node hosting the pod says it is gone.
	Gone bool
}

// Sockets is the socket hooks' part of the datapath that the gone peers
// write. *bpf.Datapath implements it.
type Sockets interface {
	UpsertGonePeer(bpf.GonePeer) error
	DeleteGonePeer(netip.Addr) error
	UpsertGoneFlow(bpf.GoneFlow) error
	DeleteGoneFlow(local, remote netip.AddrPort) error
	GoneEntries() ([]bpf.GonePeer, []bpf.GoneFlow, error)
	PruneConnections(keep func(netip.Addr) bool) (int, error)
}

var _ Sockets = (*bpf.Datapath)(nil)

// State is what the gone peers read of the cluster: a Service's opt-out
// annotation, and the pods on this node (whose connection counts stay).
type State interface {
	Service(key string) *k8s.Service
	LocalPods() []*k8s.Pod
}

// Log keys, as package daemon names them.
const (
	logKeyErr = "err"
	logKeyIP  = "ip"
)
