package hosted

import (
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// States of a hosted drain (as status and the drain Lease show them).
const (
	StateDraining  = "draining"
	StateDrained   = "drained"
	StateTimedOut  = "timed-out"
	StateGone      = model.StateGone // the pod was deleted; its IP still steered
	StateCancelled = "cancelled"     // /v1/online or undrain
)

// Kubernetes Event reasons on the Pod.
const (
	EventDrainStarted  = "DrainStarted"
	EventDrained       = "Drained"
	EventDrainTimedOut = "DrainTimedOut"
)

// drain is the drain of a pod hosted on this node: the node that can
// see whether anything still reaches it, owns its drain Lease, and answers
// its offline call.
//
//	draining -> drained | timed-out -> gone -> forgotten (after Linger)
//	any state before gone -> cancelled (/v1/online, undrain, Lease expiry)
type drain struct {
	uid             types.UID
	namespace, name string
	ips             []netip.Addr
	reason          string
	started         time.Time
	state           string
	goneAt          time.Time
	leaseSeen       bool      // the informer has shown this drain's Lease
	published       bool      // a write of the Lease landed
	steerPodIP      bool      // k8s.SteersPodIP: direct pod-IP steering applies
	lastRenew       time.Time // when the last renewal landed
	// leaseLost: a renewal found the Lease deleted (before the informer
	// said so); claimedElsewhere: the gone pod's IP is another pod's now
	// (the linger ends).
	leaseLost, claimedElsewhere bool

	syns        uint64
	lastSYN     time.Time
	live        int
	steered     uint64
	synSamples  []synSample
	liveChecked bool
	liveBy      LiveCount // live by source (live.go)
	created     time.Time // the pod's creation (socket counts complete?)

	waiters  []*waiter
	told     map[string]bool // events sent
	timedOut bool
}

type synSample struct {
	at   time.Time
	syns uint64
}

// synsSince returns the SYNs counted in the last d. The counters start with
// the drain, so with no sample older than d every SYN is recent.
func (ld *drain) synsSince(now time.Time, d time.Duration) uint64 {
	cutoff := now.Add(-d)
	var base uint64
	for _, s := range ld.synSamples {
		if s.at.After(cutoff) {
			break
		}
		base = s.syns
	}
	return ld.syns - base
}

// renewAnnotations are what a renewal publishes: progress, and whether
// the drain steers the pod's own IP.
func (ld *drain) renewAnnotations(now time.Time) map[string]string {
	progress := k8s.Progress{SYNs: ld.syns, SYNsLast10s: ld.synsSince(now, 10*time.Second), HasLast10s: true,
		Live: ld.live, Steered: ld.steered}.String()
	ann := map[string]string{k8s.AnnState: ld.state, k8s.AnnProgress: progress}
	if ld.steerPodIP {
		ann[k8s.AnnSteerPodIP] = "true"
	}
	return ann
}

// Progress is what this node knows of a drain it hosts: its state and
// what the last measure read.
type Progress struct {
	Namespace, Name string
	State           string
	SYNs            uint64
	SYNsLast10s     uint64
	Live            int
	Steered         uint64
	LiveBy          LiveCount // live by source
}

// progress returns ld's Progress at now (l.mu held).
func (ld *drain) progress(now time.Time) Progress {
	return Progress{Namespace: ld.namespace, Name: ld.name, State: ld.state, SYNs: ld.syns,
		SYNsLast10s: ld.synsSince(now, 10*time.Second), Live: ld.live, Steered: ld.steered, LiveBy: ld.liveBy}
}
