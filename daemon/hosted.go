package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s"
)

// Kubernetes Event reasons on the Pod.
const (
	EventDrainStarted  = "DrainStarted"
	EventDrained       = "Drained"
	EventDrainTimedOut = "DrainTimedOut"
)

// hostedDrain is the drain of a pod hosted on this node: the node that can
// see whether anything still reaches it, owns its drain Lease, and answers
// its offline call.
//
//	draining -> drained | timed-out -> gone -> forgotten (after Linger)
//	any state before gone -> cancelled (/v1/online, undrain, Lease expiry)
type hostedDrain struct {
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
	liveBy      LiveCount // live by source (sockets.go)
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
func (ld *hostedDrain) synsSince(now time.Time, d time.Duration) uint64 {
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

// waiter is one blocked /v1/offline?wait= call.
type waiter struct {
	quiet    time.Duration
	deadline time.Time
	started  time.Time
	done     chan OfflineResult
}

// OfflineResult is the answer of the offline API (nodeapi.Result).
type OfflineResult = nodeapi.Result

// hostedDrainsConfig is what the hosted drains depend on.
type hostedDrainsConfig struct {
	Node          string
	Linger        time.Duration // a gone pod's drain (and Lease) stays this long
	LeaseDuration time.Duration
	Quiet         time.Duration // drained = no SYN for this long and no live connection
	MaxWaiters    int
	// MaxWaitersPerPod caps one pod's waits (see reserve).
	MaxWaitersPerPod int

	State model.State
	// LocalPods is this node's pods as the passes see them (the Daemon's
	// snapshot); nil: read from State.
	LocalPods func() *localPods
	Claims    *model.Claims
	Datapath  Datapath            // SYN and steering counters
	Conntrack conntrack.Interface // live connections; nil: not counted
	Leases    *k8s.Leases         // publishes an offline call's Lease at once
	Writer    *lease.Writer       // sends every other Lease write, off the round
	Events    typedcorev1.EventInterface
	Metrics   *Metrics
	Log       *slog.Logger
	Clock     clock.PassiveClock
	// RequestPass asks the runner for a pass (new keys to learn); Wake
	// asks for a round (reconcile) soon: new keys to measure under, a wait
	// to judge. Neither blocks.
	RequestPass, Wake func()
}

// hostedDrains are the drains of the pods this node hosts.
type hostedDrains struct {
	cfg hostedDrainsConfig

	broadcaster record.EventBroadcaster // between Start and Stop
	recorder    record.EventRecorder

	mu       sync.Mutex
	pods     map[types.UID]*hostedDrain
	nwait    int                             // waits of every pod
	podWaits map[types.UID]int               // waits per pod
	keysFor  map[types.UID][]bpf.EndpointKey // from the last pass
	seen     map[types.UID]*k8s.Pod          // local pods at the last look (drainVanished)
	// looked is the snapshot of that look and unlisted the count of
	// drains forgotten then: drainDeleting decides again only if either
	// changed since (a forgotten drain of a deleting pod starts again).
	// Invariant: while both are the same, every deleting local pod has a
	// drain. Checked by FuzzSequenceDifferential.
	looked          *localPods
	unlisted, lookU uint64
	claimed         map[types.UID]*claimPub // this node's claim Leases (claimleases.go)
}

func newHostedDrains(cfg hostedDrainsConfig) *hostedDrains {
	return &hostedDrains{cfg: cfg, pods: map[types.UID]*hostedDrain{}, podWaits: map[types.UID]int{},
		keysFor: map[types.UID][]bpf.EndpointKey{}}
}

// Start starts sending Kubernetes Events.
func (l *hostedDrains) Start() {
	l.broadcaster = record.NewBroadcaster()
	l.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: l.cfg.Events})
	l.recorder = l.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "draind", Host: l.cfg.Node})
}

// Stop answers every waiter with why (503) and flushes the queued Events.
// Called again, it does nothing more.
func (l *hostedDrains) Stop(why string) {
	l.cancelAll(why)
	if l.broadcaster != nil {
		l.broadcaster.Shutdown() // flushes queued Events, ends its goroutines
		l.broadcaster = nil
	}
}

func (l *hostedDrains) event(ld *hostedDrain, typ, reason, msg string) {
	if ld.told[reason] {
		return
	}
	if ld.told == nil {
		ld.told = map[string]bool{}
	}
	ld.told[reason] = true
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ld.namespace, Name: ld.name, UID: ld.uid}
	if l.recorder != nil {
		l.recorder.Event(ref, typ, reason, msg)
	}
}

// eachPodDrain calls fn with this node's drains as the model takes them: no
// deadline (this node renews nothing to itself), and a gone pod's drain
// lasts its linger. fn may keep nothing of the object but a copy.
func (l *hostedDrains) eachPodDrain(fn func(*model.PodDrain)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		if ld.state == StateCancelled {
			continue
		}
		pd := model.PodDrain{UID: ld.uid, Namespace: ld.namespace, Name: ld.name, IPs: ld.ips, Reason: ld.reason,
			Since: ld.started, Holder: l.cfg.Node, Lease: ld.published, State: ld.state,
			SteerPodIP: ld.steerPodIP || ld.state == StateGone}
		if ld.state == StateGone {
			pd.Expires = ld.goneAt.Add(l.cfg.Linger)
		}
		fn(&pd)
	}
}

// uids returns the pods drained on this node.
func (l *hostedDrains) uids() []types.UID {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]types.UID, 0, len(l.pods))
	for uid := range l.pods {
		out = append(out, uid)
	}
	return out
}

// setKeys records the entry keys of this node's drained pods, as keysOf
// gives them for their UIDs (runner goroutine): their SYN counters are
// read under them.
func (l *hostedDrains) setKeys(keysOf func([]types.UID) map[types.UID][]bpf.EndpointKey) {
	keys := keysOf(l.uids())
	l.mu.Lock()
	changed := len(keys) != len(l.keysFor)
	for uid, k := range keys {
		if !slices.Equal(k, l.keysFor[uid]) {
			changed = true
		}
	}
	l.keysFor = keys
	l.mu.Unlock()
	if changed {
		l.cfg.Wake() // measure under the new keys now
	}
}

// progress returns what this node knows of each of its drains, by pod
// UID.
func (l *hostedDrains) progress() map[types.UID]hostedProgress {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Clock.Now()
	out := make(map[types.UID]hostedProgress, len(l.pods))
	for uid, ld := range l.pods {
		out[uid] = hostedProgress{Namespace: ld.namespace, Name: ld.name, State: ld.state, SYNs: ld.syns,
			SYNsLast10s: ld.synsSince(now, 10*time.Second), Live: ld.live, Steered: ld.steered, LiveBy: ld.liveBy}
	}
	return out
}

// hostedProgress is what this node knows of a drain it hosts: its state
// and what the last measure read.
type hostedProgress struct {
	Namespace, Name string
	State           string
	SYNs            uint64
	SYNsLast10s     uint64
	Live            int
	Steered         uint64
	LiveBy          LiveCount // live by source
}

// podByIP finds the local pod (not host-network) owning ip, in the pods
// the passes and reconcile see (a drain started for a pod they did not
// see yet would be taken for a vanished pod's).
//
// A pod that finished (Succeeded, Failed) may still list the IP its
// sandbox had, which the kubelet gives to a new pod: a finished pod is
// never the caller, and of several live pods sharing an IP (which the
// kubelet never does) none is.
func (l *hostedDrains) podByIP(ip netip.Addr) *k8s.Pod {
	ip = ip.Unmap()
	var found *k8s.Pod
	for _, p := range l.localPods().byUID {
		if p.HostNetwork || p.Finished() || !slices.Contains(p.IPs, ip) {
			continue
		}
		if found != nil {
			return nil // ambiguous
		}
		found = p
	}
	return found
}

// reconcile is one round over this node's drains: start the drains of
// local pods being deleted or gone, adopt this node's Leases of its pods,
// delete the Leases that are over, publish the claims, move each drain on
// and measure it. The Daemon runs a round every PollEvery and when asked
// (hostedDrainsConfig.Wake).
func (l *hostedDrains) reconcile(ctx context.Context) {
	now := l.cfg.Clock.Now()
	leases := map[types.UID]*k8s.DrainLease{}
	for _, dl := range l.cfg.State.DrainLeases() {
		leases[dl.PodUID] = dl
	}

	l.mu.Lock()
	known := len(l.pods)
	lp := l.localPods()
	pods := lp.byUID
	l.drainDeleting(lp, now)
	// Drain Leases of local pods (an operator drain, or ours before a
	// restart): this node holds them now. An expired one is adopted too:
	// the pod asked to go offline and nobody undid it; only the renewals
	// stopped (this node was down, or the API server was).
	for uid, dl := range leases {
		p := pods[uid]
		if p == nil || dl.Holder != l.cfg.Node {
			continue // not a drain this node holds: never adopted
		}
		ld := l.pods[uid]
		if ld == nil || ld.state == StateCancelled {
			ld = l.adopt(p, dl)
		}
		ld.leaseSeen = true
	}
	l.cleanStaleLeases(leases, pods, now)
	l.publishClaims(leases, lp, now)
	if len(l.pods) > known {
		// New drains here: the next pass tells us their entry keys.
		defer l.cfg.RequestPass()
	}
	for uid, ld := range l.pods {
		l.step(uid, ld, leases[uid], pods[uid], now)
	}
	l.mu.Unlock()
	l.measure(ctx, now)
}

// sawLease records that the informer has shown the Lease of this node's
// drain of pod uid (the Lease handler). Recorded at the event, not at the
// next reconcile: a Lease deleted before that reconcile (draind undrain
// right after an offline call) is then a deletion, which cancels the
// drain, not a Lease that never landed, which step would publish again.
func (l *hostedDrains) sawLease(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ld := l.pods[uid]; ld != nil {
		ld.leaseSeen = true
	}
}

// step moves one of this node's drains on (l.mu held): its pod p and its
// Lease dl as the informers show them (nil: none).
func (l *hostedDrains) step(uid types.UID, ld *hostedDrain, dl *k8s.DrainLease, p *k8s.Pod, now time.Time) {
	name := k8s.LeaseName(uid)
	if dl != nil && dl.Holder == l.cfg.Node {
		ld.leaseSeen = true
	}
	deleted := ld.leaseLost || (ld.leaseSeen && dl == nil)
	switch {
	case ld.state == StateCancelled:
		l.forget(uid, false)
		return
	case p == nil && deleted:
		// A gone pod's Lease was deleted (draind undrain): the
		// linger ends, and nothing renews the Lease again.
		if ld.state != StateGone {
			l.finishWaiters(ld, now, StateGone, 200)
		}
		l.forget(uid, false)
		return
	case p == nil && ld.state != StateGone:
		ld.state = StateGone
		ld.goneAt = now
		l.finishWaiters(ld, now, StateGone, 200)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
	case p != nil && deleted:
		// The Lease was deleted: /v1/online or draind undrain. A
		// pod being deleted drains all the same: publish it again.
		if p.Deleting() {
			ld.leaseSeen, ld.published, ld.leaseLost = false, false, false
			break
		}
		ld.state = StateCancelled
		l.finishWaiters(ld, now, StateCancelled, 409)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("cancelled").Inc()
		l.forget(uid, false)
		return
	}
	if ld.state == StateGone && (ld.claimedElsewhere || now.Sub(ld.goneAt) >= l.cfg.Linger) {
		l.forget(uid, ld.published || ld.leaseSeen)
		return
	}
	switch {
	case !ld.published:
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Publish, Req: l.request(ld)})
	case now.Sub(ld.lastRenew) >= l.cfg.LeaseDuration/3:
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Renew, Req: l.request(ld), Ann: ld.renewAnnotations(now)})
	}
}

// renewAnnotations are what a renewal publishes: progress, and whether
// the drain steers the pod's own IP.
func (ld *hostedDrain) renewAnnotations(now time.Time) map[string]string {
	progress := k8s.Progress{SYNs: ld.syns, SYNsLast10s: ld.synsSince(now, 10*time.Second), HasLast10s: true,
		Live: ld.live, Steered: ld.steered}.String()
	ann := map[string]string{k8s.AnnState: ld.state, k8s.AnnProgress: progress}
	if ld.steerPodIP {
		ann[k8s.AnnSteerPodIP] = "true"
	}
	return ann
}

// observeLocalPods starts the drains of local pods being deleted: they
// drain even without an offline call. The runner calls it at the start of
// every pass, so a deletion reaches the datapath in that same pass.
func (l *hostedDrains) observeLocalPods(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainDeleting(l.localPods(), now)
}

// localPods reads this node's pods (under l.mu where two reads are compared:
// the reads are then in order, and so are the snapshots they get).
func (l *hostedDrains) localPods() *localPods {
	if l.cfg.LocalPods != nil {
		return l.cfg.LocalPods()
	}
	return newLocalPods(l.cfg.State.LocalPods())
}

// unlist forgets uid's drain (l.mu held).
func (l *hostedDrains) unlist(uid types.UID) {
	delete(l.pods, uid)
	l.unlisted++
}

// drainDeleting is the one place that decides that a deleting local pod
// drains (l.mu held). It decides again only when the pods or the drains
// it left changed: every pass asks.
func (l *hostedDrains) drainDeleting(lp *localPods, now time.Time) {
	if lp == l.looked && l.unlisted == l.lookU {
		return
	}
	l.looked, l.lookU = lp, l.unlisted
	pods := lp.byUID
	l.drainVanished(pods, now)
	for _, p := range pods {
		if p.Deleting() && !p.HostNetwork && len(p.IPs) > 0 {
			if ld := l.pods[p.UID]; ld == nil || ld.state == StateCancelled {
				if dl := l.ownLease(p.UID); dl != nil {
					// A drain from before a restart (an offline call, an
					// operator's): it goes on as its Lease says.
					l.adopt(p, dl)
				} else {
					l.start(p, k8s.ReasonPodDeleting, now, true)
				}
			}
		}
	}
}

// drainVanished gives local pods that disappeared without a drain (a force
// delete: ready, then gone) or are being deleted with no grace (killed now)
// a hosted drain that is gone from the start, so that its drain Lease tells
// every node at once; and makes the Lease of a drained pod that just went
// say so at once too (l.mu held).
func (l *hostedDrains) drainVanished(pods map[types.UID]*k8s.Pod, now time.Time) {
	for uid, p := range pods {
		if !p.KilledWithoutGrace() || p.HostNetwork || p.Finished() || len(p.IPs) == 0 {
			continue
		}
		ld := l.pods[uid]
		if ld != nil && ld.state == StateGone {
			continue
		}
		if ld == nil || ld.state == StateCancelled {
			ld = l.start(p, model.ReasonVanished, now, false)
			l.cfg.Metrics.DrainStarts.WithLabelValues(model.ReasonVanished).Inc()
		}
		ld.state, ld.goneAt, ld.lastRenew = StateGone, now, time.Time{}
		l.finishWaiters(ld, now, StateGone, 200)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
		l.cfg.Log.Info("pod killed without grace: gone", logKeyPod, p.Namespace+"/"+p.Name)
	}
	for uid, p := range l.seen {
		// A finished pod (a Job's, an evicted one) released its IPs when
		// it finished: removing its object later ends nobody's connections,
		// and its IPs may be another pod's by then.
		if pods[uid] != nil || p.HostNetwork || p.Finished() || len(p.IPs) == 0 {
			continue
		}
		if ld := l.pods[uid]; ld != nil && ld.state != StateCancelled {
			continue // draining already: the usual path makes it gone
		}
		ld := l.start(p, model.ReasonVanished, now, false)
		ld.state, ld.goneAt = StateGone, now
		l.cfg.Metrics.DrainStarts.WithLabelValues(model.ReasonVanished).Inc()
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
		l.cfg.Log.Info("pod vanished without a drain", logKeyPod, p.Namespace+"/"+p.Name)
	}
	// A draining pod that is about to turn gone in this reconcile: its
	// Lease is renewed at once, so every node learns it now, not at the next
	// periodic renewal.
	for uid, ld := range l.pods {
		if pods[uid] == nil && ld.state != StateGone && ld.state != StateCancelled {
			ld.lastRenew = time.Time{}
		}
	}
	l.seen = pods // a localPods snapshot's: nothing writes to it
}

// ownLease returns this node's drain Lease of pod uid (nil: none).
func (l *hostedDrains) ownLease(uid types.UID) *k8s.DrainLease {
	for _, dl := range l.cfg.State.DrainLeases() {
		if dl.PodUID == uid && dl.Holder == l.cfg.Node {
			return dl
		}
	}
	return nil
}

// adopt takes over the drain of local pod p that this node's Lease dl
// records (l.mu held): adopted, not started (no second DrainStarted
// event), with the Lease's reason, start and pod-IP steering.
func (l *hostedDrains) adopt(p *k8s.Pod, dl *k8s.DrainLease) *hostedDrain {
	ld := l.start(p, dl.Reason, dl.Acquired, false)
	ld.steerPodIP = ld.steerPodIP || dl.SteerPodIP
	ld.published = true
	ld.lastRenew = dl.Renewed
	return ld
}

// cleanStaleLeases deletes the drain Leases that are over (l.mu held):
//   - a Lease this node holds naming an IP that a different pod now
//     holds (a local pod, a believed claim Lease of another node, a ready
//     listing): pod IPs are reused; deleting the Lease tells every node to
//     stop steering the old pod's IP at once;
//   - a Lease this node holds whose pod is gone and that expired (left by
//     a draind that stopped before its cleanup).
func (l *hostedDrains) cleanStaleLeases(leases map[types.UID]*k8s.DrainLease, pods map[types.UID]*k8s.Pod, now time.Time) {
	for uid, dl := range leases {
		if pods[uid] != nil {
			continue
		}
		mine := l.deletes(dl.Holder)
		stale := mine && l.pods[uid] == nil && !dl.Expires().After(now)
		for _, ip := range dl.IPs {
			if mine && l.cfg.Claims.ClaimedByOther(ip, uid) {
				stale = true
				if ld := l.pods[uid]; ld != nil {
					ld.claimedElsewhere = true // the linger ends now
				}
				break
			}
		}
		if stale {
			l.deleteLease(dl.Name, dl.Holder)
		}
	}
}

// deleteLease asks the writer to delete Lease name of holder, if this
// node deletes it (deletes). It takes no lock of its own: callers hold l.mu.
func (l *hostedDrains) deleteLease(name, holder string) {
	if l.deletes(holder) {
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Delete})
	}
}

// deleteLeaseNow is deleteLease at once, for /v1/online
// (hostedDrains.online): the pod's own drain Lease, deleted while the
// call's answer waits for it and reports its error.
func (l *hostedDrains) deleteLeaseNow(ctx context.Context, name, holder string) error {
	if !l.deletes(holder) {
		return fmt.Errorf("drain lease %s is held by %s: only its holder deletes it", name, holder)
	}
	return l.cfg.Writer.DeleteNow(ctx, name)
}

// deletes is the one place that decides whether this node deletes a
// Lease; the writer (lease.Writer) is the one that does. Only a Lease's
// holder deletes it: the shipped Lease policy denies any other node, and a
// local pod at the IP of another node's drain Lease claims the IP instead
// (publishClaims), so a Lease of another holder is never deleted here.
// The holder deletes:
//   - a drain Lease whose drain ended: its pod gone and the linger over,
//     or its IP claimed elsewhere (forget);
//   - a drain Lease it holds naming an IP a different pod now holds, or
//     whose pod is gone and that expired (cleanStaleLeases);
//   - a claim Lease no longer needed, or left by an earlier run
//     (publishClaims);
//   - a drain Lease whose drain /v1/online cancels (deleteLeaseNow).
func (l *hostedDrains) deletes(holder string) bool { return holder == l.cfg.Node }

// forget drops a drain (l.mu held); deleteLease also deletes its Lease.
func (l *hostedDrains) forget(uid types.UID, deleteLease bool) {
	l.unlist(uid)
	if deleteLease {
		l.deleteLease(k8s.LeaseName(uid), l.cfg.Node)
	} else {
		l.cfg.Writer.Drop(k8s.LeaseName(uid))
	}
}

// request is the Lease a drain publishes (l.mu held).
func (l *hostedDrains) request(ld *hostedDrain) k8s.DrainRequest {
	r := k8s.DrainRequest{PodNamespace: ld.namespace, PodName: ld.name, PodUID: ld.uid, IPs: ld.ips,
		Node: l.cfg.Node, Reason: ld.reason, Duration: l.cfg.LeaseDuration, SteerPodIP: ld.steerPodIP}
	if ld.state == StateGone {
		r.State = StateGone // a pod that vanished: gone from the first write
	}
	return r
}

// leaseWritten records a write of this node's Leases that landed or
// failed: the writer's result (lease.Writer's onResult, on its goroutine).
func (l *hostedDrains) leaseWritten(r lease.Result) {
	op := r.Kind.String()
	switch {
	case r.Err == nil:
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "ok").Inc()
	case lease.Gone(r.Kind, r.Err):
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "refused").Inc()
		l.cfg.Log.Info("drain lease deleted, not renewed again", "lease", r.Name)
	case lease.Permanent(r.Kind, r.Err):
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "refused").Inc()
		l.cfg.Log.Warn("drain lease write refused, retried with backoff up to "+lease.RefusedMax.String(),
			"lease", r.Name, "op", op, logKeyErr, r.Err)
	default:
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "error").Inc()
		l.cfg.Log.Error("writing drain lease, will retry", "lease", r.Name, "op", op, logKeyErr, r.Err)
	}
	if strings.HasPrefix(r.Name, k8s.ClaimPrefix) {
		l.claimWritten(r)
		return
	}
	if r.Kind == lease.Delete {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		if k8s.LeaseName(ld.uid) != r.Name {
			continue
		}
		switch {
		case r.Err == nil:
			ld.published, ld.lastRenew = true, r.At
		case apierrors.IsNotFound(r.Err) && !ld.leaseSeen:
			ld.published = false // never landed: create it
		case lease.Gone(r.Kind, r.Err):
			ld.leaseLost = true // deleted: reconcile ends the drain
		}
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// start records a drain of a local pod (l.mu held); announce is false
// when adopting a drain already in progress (a Lease found at start-up).
func (l *hostedDrains) start(p *k8s.Pod, reason string, since time.Time, announce bool) *hostedDrain {
	ld := &hostedDrain{uid: p.UID, namespace: p.Namespace, name: p.Name, ips: slices.Clone(p.IPs),
		reason: reason, started: since, state: StateDraining, created: p.CreationTimestamp.Time,
		steerPodIP: k8s.SteersPodIP(reason, p.SteerOnDelete)}
	l.pods[p.UID] = ld
	if !announce {
		l.cfg.Log.Info("drain adopted", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
		return ld
	}
	l.cfg.Metrics.DrainStarts.WithLabelValues(reason).Inc()
	l.cfg.Log.Info("drain started", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
	l.event(ld, corev1.EventTypeNormal, EventDrainStarted, fmt.Sprintf("draind started draining the pod (reason %s, node %s)", reason, l.cfg.Node))
	return ld
}

// publish creates (or joins) the pod's drain Lease now, for an offline
// call that answers only once the drain is announced cluster-wide.
func (l *hostedDrains) publish(ctx context.Context, ld *hostedDrain, now time.Time) error {
	l.mu.Lock()
	req := l.request(ld)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, lease.CallTimeout)
	defer cancel()
	_, created, err := l.cfg.Leases.Publish(ctx, req, now)
	op := "renew"
	if created {
		op = "create"
	}
	l.cfg.Metrics.LeaseOps.WithLabelValues(op, result(err)).Inc()
	if err != nil {
		l.cfg.Log.Error("publishing drain lease", logKeyPod, ld.namespace+"/"+ld.name, logKeyErr, err)
		return err
	}
	l.mu.Lock()
	ld.published = true
	ld.lastRenew = now
	l.mu.Unlock()
	return nil
}

// measure reads SYNs and live connections of draining pods and settles
// waiters.
func (l *hostedDrains) measure(ctx context.Context, now time.Time) {
	type job struct {
		ld   *hostedDrain
		keys []bpf.EndpointKey
		ips  []netip.Addr
	}
	var jobs []job
	l.mu.Lock()
	for uid, ld := range l.pods {
		if ld.state == StateGone || ld.state == StateCancelled {
			continue
		}
		keys := slices.Clone(l.keysFor[uid])
		for _, ip := range ld.ips {
			for _, proto := range []bpf.Protocol{bpf.TCP, bpf.UDP} {
				k := bpf.EndpointKey{Addr: ip, Proto: proto}
				if !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
		jobs = append(jobs, job{ld, keys, slices.Clone(ld.ips)})
	}
	l.mu.Unlock()
	for _, j := range jobs {
		var syns, steered uint64
		var last time.Time
		statsRead := true
		for _, k := range j.keys {
			st, err := l.cfg.Datapath.DrainStats(k)
			if err != nil {
				// A SYN not counted could declare "drained" early: an
				// unreadable count blocks it, as an unknown live count does.
				statsRead = false
				l.cfg.Log.Warn("reading a draining endpoint's SYN count", logKeyErr, err)
				continue
			}
			syns += st.SYNs
			steered += st.Steered + st.Refused
			if st.LastSYN.After(last) {
				last = st.LastSYN
			}
		}
		lc := l.liveOf(ctx, j.ld, j.ips)
		live, checked := lc.Live, lc.Checked && statsRead
		l.mu.Lock()
		ld := j.ld
		ld.liveBy = lc
		if syns < ld.syns {
			syns = ld.syns // the stats entry was recreated: counts only grow
		}
		switch {
		case last.After(ld.lastSYN):
			// The observer's own timestamp of the last SYN: right even
			// for SYNs counted before this draind started.
			ld.lastSYN = last
		case syns > ld.syns && last.IsZero():
			ld.lastSYN = now // no timestamp: the growth is all we know
		}
		ld.syns, ld.steered, ld.live, ld.liveChecked = syns, steered, live, checked
		ld.synSamples = append(ld.synSamples, synSample{now, syns})
		for len(ld.synSamples) > 0 && now.Sub(ld.synSamples[0].at) > 11*time.Second {
			ld.synSamples = ld.synSamples[1:]
		}
		l.settle(ld, now)
		l.mu.Unlock()
	}
}

// isDrained applies the definition: no new SYN for quiet and no live
// connection left (l.mu held).
func (l *hostedDrains) isDrained(ld *hostedDrain, now time.Time, quiet time.Duration) bool {
	from := ld.started
	if ld.lastSYN.After(from) {
		from = ld.lastSYN
	}
	return ld.liveChecked && ld.live == 0 && now.Sub(from) >= quiet
}

// settle updates the drain's state and answers waiters (l.mu held).
func (l *hostedDrains) settle(ld *hostedDrain, now time.Time) {
	if ld.state == StateDraining || ld.state == StateTimedOut {
		if l.isDrained(ld, now, l.cfg.Quiet) {
			ld.state = StateDrained
			dur := now.Sub(ld.started)
			l.cfg.Metrics.DrainOutcomes.WithLabelValues("drained").Inc()
			l.cfg.Metrics.DrainDuration.Observe(dur.Seconds())
			l.event(ld, corev1.EventTypeNormal, EventDrained, fmt.Sprintf("drained after %.1fs: %d SYNs seen, %d connections left, %d steered away on this node",
				dur.Seconds(), ld.syns, ld.live, ld.steered))
			l.cfg.Log.Info("pod drained", logKeyPod, ld.namespace+"/"+ld.name, "seconds", dur.Seconds(), "syns", ld.syns)
		}
	}
	kept := ld.waiters[:0]
	for _, w := range ld.waiters {
		switch {
		case l.isDrained(ld, now, w.quiet):
			w.done <- l.resultOf(ld, now, w, StateDrained, 200)
			l.release(ld.uid)
		case !now.Before(w.deadline):
			if !ld.timedOut {
				ld.timedOut = true
				if ld.state != StateDrained {
					ld.state = StateTimedOut
				}
				l.cfg.Metrics.DrainOutcomes.WithLabelValues("timed_out").Inc()
				l.cfg.Metrics.DrainDuration.Observe(now.Sub(ld.started).Seconds())
				l.event(ld, corev1.EventTypeWarning, EventDrainTimedOut, fmt.Sprintf("not drained after %.1fs: %d live connections, last SYN %s ago",
					now.Sub(ld.started).Seconds(), ld.live, ago(now, ld.lastSYN)))
			}
			w.done <- l.resultOf(ld, now, w, StateTimedOut, 504)
			l.release(ld.uid)
		default:
			kept = append(kept, w)
		}
	}
	ld.waiters = kept
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return now.Sub(t).Round(100 * time.Millisecond).String()
}

func (l *hostedDrains) resultOf(ld *hostedDrain, now time.Time, w *waiter, state string, code int) OfflineResult {
	r := OfflineResult{Pod: ld.namespace + "/" + ld.name, State: state, Drained: state == StateDrained,
		SYNs: ld.syns, LiveConnections: ld.live, Steered: ld.steered, Code: code}
	ld.liveBy.fillOffline(&r)
	if w != nil {
		r.WaitedSeconds = now.Sub(w.started).Seconds()
	}
	return r
}

func (l *hostedDrains) finishWaiters(ld *hostedDrain, now time.Time, state string, code int) {
	for _, w := range ld.waiters {
		w.done <- l.resultOf(ld, now, w, state, code)
		l.release(ld.uid)
	}
	ld.waiters = nil
}

func (l *hostedDrains) cancelAll(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		for _, w := range ld.waiters {
			r := l.resultOf(ld, l.cfg.Clock.Now(), w, ld.state, 503)
			r.Error = why
			w.done <- r
			l.release(ld.uid)
		}
		ld.waiters = nil
	}
}

// newHosted wires the hosted drains and their Lease writer.
func (d *Daemon) newHosted(client kubernetes.Interface) {
	cfg := d.cfg
	leases := &k8s.Leases{Client: client, Namespace: cfg.Namespace}
	d.hostedWake = make(chan struct{}, 1)
	d.leaseWriter = lease.NewWriter(leases, cfg.LeaseDuration, cfg.Clock, func(r lease.Result) { d.hosted.leaseWritten(r) })
	d.hosted = newHostedDrains(hostedDrainsConfig{
		Node: cfg.Node, Linger: cfg.Linger, LeaseDuration: cfg.LeaseDuration, Quiet: cfg.Quiet,
		MaxWaiters: cfg.MaxWaiters, MaxWaitersPerPod: cfg.MaxWaitersPerPod,
		State: d.state, LocalPods: d.localPodsNow, Claims: d.claims, Datapath: d.datapath, Conntrack: d.conntrack,
		Leases: leases, Writer: d.leaseWriter, Events: client.CoreV1().Events(""), Metrics: d.Metrics,
		Log: cfg.Logger, Clock: cfg.Clock, RequestPass: d.runner.Run, Wake: d.wakeHosted,
	})
}

// startHosted starts the hosted drains' Events, the Lease writer and the
// loop of their rounds.
func (d *Daemon) startHosted(ctx context.Context) {
	d.hosted.Start()
	d.leaseWriting.Start(ctx, d.leaseWriter.Run)
	d.hostedLoop.Start(ctx, d.runHosted)
}

// stopHosted stops what startHosted began: no round runs once it returns,
// waiters are answered with why (503), queued Events are flushed.
func (d *Daemon) stopHosted(why string) {
	d.hostedLoop.Stop()
	d.hosted.Stop(why)
	d.leaseWriting.Stop()
}

// runHosted runs a round of the hosted drains (measure and settle them,
// publish and renew their Leases) every PollEvery, and at once when
// something asks (wakeHosted).
func (d *Daemon) runHosted(ctx context.Context) {
	t := d.clock.NewTicker(d.cfg.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.hostedWake:
		case <-t.C():
		}
		d.hosted.reconcile(ctx)
	}
}

// wakeHosted asks for a round of the hosted drains; it never blocks.
func (d *Daemon) wakeHosted() {
	select {
	case d.hostedWake <- struct{}{}:
	default:
	}
}
