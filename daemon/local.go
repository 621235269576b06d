package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// Kubernetes Event reasons on the Pod.
const (
	EventDrainStarted  = "DrainStarted"
	EventDrained       = "Drained"
	EventDrainTimedOut = "DrainTimedOut"
)

// localDrain is the drain of a pod hosted on this node: the node that can
// see whether anything still reaches it, owns its drain Lease, and answers
// its offline call.
//
//	draining -> drained | timed-out -> gone -> forgotten (after Linger)
//	any state before gone -> cancelled (/v1/online, undrain, Lease expiry)
type localDrain struct {
	uid             types.UID
	namespace, name string
	ips             []netip.Addr
	reason          string
	started         time.Time
	state           string
	goneAt          time.Time
	leaseSeen       bool
	lastRenew       time.Time
	published       bool

	syns        uint64
	lastSYN     time.Time
	live        int
	steered     uint64
	synSamples  []synSample
	liveChecked bool

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
func (ld *localDrain) synsSince(now time.Time, d time.Duration) uint64 {
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

// OfflineResult answers /v1/offline.
type OfflineResult struct {
	Pod             string  `json:"pod"`
	State           string  `json:"state"`
	Drained         bool    `json:"drained"`
	WaitedSeconds   float64 `json:"waited_seconds"`
	SYNs            uint64  `json:"syns"`
	LiveConnections int     `json:"live_connections"`
	Steered         uint64  `json:"steered"`
	Error           string  `json:"error,omitempty"`
	code            int
}

type localDrains struct {
	d           *Daemon
	wakeCh      chan struct{}
	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster

	mu      sync.Mutex
	pods    map[types.UID]*localDrain
	nwait   int
	keysFor map[types.UID][]bpf.EndpointKey // from the last pass
}

func newLocalDrains(d *Daemon) *localDrains {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: d.client.CoreV1().Events("")})
	return &localDrains{
		d: d, wakeCh: make(chan struct{}, 1), broadcaster: b,
		recorder: b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "draind", Host: d.cfg.Node}),
		pods:     map[types.UID]*localDrain{},
		keysFor:  map[types.UID][]bpf.EndpointKey{},
	}
}

func (l *localDrains) wake() {
	select {
	case l.wakeCh <- struct{}{}:
	default:
	}
}

func (l *localDrains) loop(ctx context.Context) {
	t := l.d.clock.NewTicker(l.d.cfg.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.cancelAll("draind is stopping")
			l.broadcaster.Shutdown() // flushes queued Events, ends its goroutines
			return
		case <-l.wakeCh:
		case <-t.C():
		}
		l.reconcile(ctx)
	}
}

func (l *localDrains) event(ld *localDrain, typ, reason, msg string) {
	if ld.told[reason] {
		return
	}
	if ld.told == nil {
		ld.told = map[string]bool{}
	}
	ld.told[reason] = true
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ld.namespace, Name: ld.name, UID: ld.uid}
	l.recorder.Event(ref, typ, reason, msg)
}

// uids returns the pods drained on this node.
func (l *localDrains) uids() []types.UID {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]types.UID, 0, len(l.pods))
	for uid := range l.pods {
		out = append(out, uid)
	}
	return out
}

// setKeys records the entry keys of this node's drained pods (runner
// goroutine): their SYN counters are read under them.
func (l *localDrains) setKeys(keys map[types.UID][]bpf.EndpointKey) {
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
		l.wake() // measure under the new keys now
	}
}

// annotate fills a status row with what this node measured.
func (l *localDrains) annotate(ps *PodStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ld := l.pods[types.UID(ps.UID)]
	if ld == nil {
		return
	}
	ps.Local = true
	ps.State = ld.state
	ps.SYNs, ps.LiveConnections, ps.Steered = ld.syns, ld.live, ld.steered
	ps.SYNsLast10s = ld.synsSince(l.d.clock.Now(), 10*time.Second)
}

// podByIP finds the local pod (not host-network) owning ip.
func (l *localDrains) podByIP(ip netip.Addr) *k8s.Pod {
	ip = ip.Unmap()
	for _, p := range l.d.state.LocalPods() {
		if p.HostNetwork {
			continue
		}
		if slices.Contains(p.IPs, ip) {
			return p
		}
	}
	return nil
}

// reconcile is one pass over this node's drains.
func (l *localDrains) reconcile(ctx context.Context) {
	now := l.d.clock.Now()
	pods := map[types.UID]*k8s.Pod{}
	for _, p := range l.d.state.LocalPods() {
		pods[p.UID] = p
	}
	leases := map[types.UID]*k8s.DrainLease{}
	for _, dl := range l.d.state.DrainLeases() {
		leases[dl.PodUID] = dl
	}
	var publish []*localDrain
	var renew []*localDrain
	var deleteLeases []string

	l.mu.Lock()
	known := len(l.pods)
	// Local pods being deleted drain even without an offline call.
	for _, p := range pods {
		if p.Deleting() && !p.HostNetwork && len(p.IPs) > 0 {
			if ld := l.pods[p.UID]; ld == nil || ld.state == StateCancelled {
				ld = l.start(p, k8s.ReasonPodDeleting, now, true)
				publish = append(publish, ld)
			}
		}
	}
	// Drain Leases of local pods (an operator drain, or ours before a
	// restart): this node holds them now.
	for uid, dl := range leases {
		p := pods[uid]
		if p == nil {
			continue
		}
		ld := l.pods[uid]
		if ld == nil || ld.state == StateCancelled {
			// Adopted, not started: no second DrainStarted event.
			ld = l.start(p, dl.Reason, dl.Acquired, false)
			ld.published = true
			ld.lastRenew = dl.Renewed
		}
		ld.leaseSeen = true
	}
	// IP reuse: a Lease naming an IP that a different local pod now holds
	// is stale everywhere; the hosting node knows first and says so.
	for _, dl := range leases {
		if pods[dl.PodUID] != nil {
			continue
		}
		for _, ip := range dl.IPs {
			if owner, ok := l.d.claims.localOwner(ip); ok && owner != dl.PodUID {
				deleteLeases = append(deleteLeases, dl.Name)
				if ld := l.pods[dl.PodUID]; ld != nil {
					ld.goneAt = now.Add(-l.d.cfg.Linger) // forget at once
				}
				break
			}
		}
	}
	if len(l.pods) > known {
		// New drains here: the next pass tells us their entry keys.
		defer l.d.runner.Run()
	}
	for uid, ld := range l.pods {
		dl := leases[uid]
		p := pods[uid]
		switch {
		case ld.state == StateCancelled:
			delete(l.pods, uid)
			continue
		case p == nil && ld.state != StateGone:
			ld.state = StateGone
			ld.goneAt = now
			l.finishWaiters(ld, now, StateGone, 200)
			l.d.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
		case ld.state != StateGone && ld.published && ((ld.leaseSeen && dl == nil) || (dl != nil && !dl.Expires().After(now))):
			// /v1/online, draind undrain, or the Lease ran out.
			ld.state = StateCancelled
			l.finishWaiters(ld, now, StateCancelled, 409)
			l.d.Metrics.DrainOutcomes.WithLabelValues("cancelled").Inc()
			delete(l.pods, uid)
			continue
		}
		if ld.state == StateGone {
			if now.Sub(ld.goneAt) >= l.d.cfg.Linger {
				if ld.published {
					deleteLeases = append(deleteLeases, k8s.LeaseName(uid))
				}
				delete(l.pods, uid)
				continue
			}
		}
		if ld.published && now.Sub(ld.lastRenew) >= l.d.cfg.LeaseDuration/3 {
			renew = append(renew, ld)
		}
	}
	l.mu.Unlock()

	for _, ld := range publish {
		l.publish(ctx, ld, now)
	}
	l.measure(ctx, now)
	for _, ld := range renew {
		l.renew(ctx, ld, now)
	}
	for _, name := range deleteLeases {
		err := l.d.leases.Delete(ctx, name)
		l.d.Metrics.LeaseOps.WithLabelValues("delete", result(err)).Inc()
		if err != nil {
			l.d.log.Error("deleting drain lease", logKeyErr, err, "lease", name)
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
func (l *localDrains) start(p *k8s.Pod, reason string, since time.Time, announce bool) *localDrain {
	ld := &localDrain{uid: p.UID, namespace: p.Namespace, name: p.Name, ips: slices.Clone(p.IPs),
		reason: reason, started: since, state: StateDraining}
	l.pods[p.UID] = ld
	if !announce {
		l.d.log.Info("drain adopted", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
		return ld
	}
	l.d.Metrics.DrainStarts.WithLabelValues(reason).Inc()
	l.d.log.Info("drain started", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
	l.event(ld, corev1.EventTypeNormal, EventDrainStarted, fmt.Sprintf("draind started draining the pod (reason %s, node %s)", reason, l.d.cfg.Node))
	return ld
}

// publish creates (or joins) the pod's drain Lease.
func (l *localDrains) publish(ctx context.Context, ld *localDrain, now time.Time) error {
	l.mu.Lock()
	req := k8s.DrainRequest{PodNamespace: ld.namespace, PodName: ld.name, PodUID: ld.uid, IPs: ld.ips,
		Node: l.d.cfg.Node, Reason: ld.reason, Duration: l.d.cfg.LeaseDuration}
	l.mu.Unlock()
	_, created, err := l.d.leases.Publish(ctx, req, now)
	op := "renew"
	if created {
		op = "create"
	}
	l.d.Metrics.LeaseOps.WithLabelValues(op, result(err)).Inc()
	if err != nil {
		l.d.log.Error("publishing drain lease", logKeyPod, ld.namespace+"/"+ld.name, logKeyErr, err)
		return err
	}
	l.mu.Lock()
	ld.published = true
	ld.lastRenew = now
	l.mu.Unlock()
	return nil
}

func (l *localDrains) renew(ctx context.Context, ld *localDrain, now time.Time) {
	l.mu.Lock()
	name := k8s.LeaseName(ld.uid)
	progress := k8s.Progress{SYNs: ld.syns, SYNsLast10s: ld.synsSince(now, 10*time.Second), HasLast10s: true,
		Live: ld.live, Steered: ld.steered}.String()
	ann := map[string]string{k8s.AnnState: ld.state, k8s.AnnProgress: progress}
	l.mu.Unlock()
	_, err := l.d.leases.Renew(ctx, name, l.d.cfg.LeaseDuration, now, ann)
	l.d.Metrics.LeaseOps.WithLabelValues("renew", result(err)).Inc()
	if err != nil {
		l.d.log.Error("renewing drain lease", "lease", name, logKeyErr, err)
		return
	}
	l.mu.Lock()
	ld.lastRenew = now
	l.mu.Unlock()
}

// measure reads SYNs and live connections of draining pods and settles
// waiters.
func (l *localDrains) measure(ctx context.Context, now time.Time) {
	type job struct {
		ld   *localDrain
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
		for _, k := range j.keys {
			st, err := l.d.dp.DrainStats(k)
			if err != nil {
				continue
			}
			syns += st.SYNs
			steered += st.Steered + st.Refused
			if st.LastSYN.After(last) {
				last = st.LastSYN
			}
		}
		live, checked := 0, true
		if l.d.ct != nil {
			for _, ip := range j.ips {
				c, err := l.d.ct.Count(ctx, ip)
				if err != nil {
					checked = false
					l.d.Metrics.CTErrors.Inc()
					continue
				}
				live += c.LiveTCP()
			}
		}
		l.mu.Lock()
		ld := j.ld
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
func (l *localDrains) isDrained(ld *localDrain, now time.Time, quiet time.Duration) bool {
	from := ld.started
	if ld.lastSYN.After(from) {
		from = ld.lastSYN
	}
	return ld.liveChecked && ld.live == 0 && now.Sub(from) >= quiet
}

// settle updates the drain's state and answers waiters (l.mu held).
func (l *localDrains) settle(ld *localDrain, now time.Time) {
	if ld.state == StateDraining || ld.state == StateTimedOut {
		if l.isDrained(ld, now, l.d.cfg.Quiet) {
			ld.state = StateDrained
			dur := now.Sub(ld.started)
			l.d.Metrics.DrainOutcomes.WithLabelValues("drained").Inc()
			l.d.Metrics.DrainDuration.Observe(dur.Seconds())
			l.event(ld, corev1.EventTypeNormal, EventDrained, fmt.Sprintf("drained after %.1fs: %d SYNs seen, %d connections left, %d steered away on this node",
				dur.Seconds(), ld.syns, ld.live, ld.steered))
			l.d.log.Info("pod drained", logKeyPod, ld.namespace+"/"+ld.name, "seconds", dur.Seconds(), "syns", ld.syns)
		}
	}
	kept := ld.waiters[:0]
	for _, w := range ld.waiters {
		switch {
		case l.isDrained(ld, now, w.quiet):
			w.done <- l.resultOf(ld, now, w, StateDrained, 200)
			l.nwait--
		case !now.Before(w.deadline):
			if !ld.timedOut {
				ld.timedOut = true
				if ld.state != StateDrained {
					ld.state = StateTimedOut
				}
				l.d.Metrics.DrainOutcomes.WithLabelValues("timed_out").Inc()
				l.d.Metrics.DrainDuration.Observe(now.Sub(ld.started).Seconds())
				l.event(ld, corev1.EventTypeWarning, EventDrainTimedOut, fmt.Sprintf("not drained after %.1fs: %d live connections, last SYN %s ago",
					now.Sub(ld.started).Seconds(), ld.live, ago(now, ld.lastSYN)))
			}
			w.done <- l.resultOf(ld, now, w, StateTimedOut, 504)
			l.nwait--
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

func (l *localDrains) resultOf(ld *localDrain, now time.Time, w *waiter, state string, code int) OfflineResult {
	r := OfflineResult{Pod: ld.namespace + "/" + ld.name, State: state, Drained: state == StateDrained,
		SYNs: ld.syns, LiveConnections: ld.live, Steered: ld.steered, code: code}
	if w != nil {
		r.WaitedSeconds = now.Sub(w.started).Seconds()
	}
	return r
}

func (l *localDrains) finishWaiters(ld *localDrain, now time.Time, state string, code int) {
	for _, w := range ld.waiters {
		w.done <- l.resultOf(ld, now, w, state, code)
		l.nwait--
	}
	ld.waiters = nil
}

func (l *localDrains) cancelAll(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		for _, w := range ld.waiters {
			r := l.resultOf(ld, l.d.clock.Now(), w, ld.state, 503)
			r.Error = why
			w.done <- r
			l.nwait--
		}
		ld.waiters = nil
	}
}
