package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/internal/runloop"
	"github.com/draind/draind/daemon/model"
)

// udpSettle is how long after a drain starts its UDP flows are first
// expired. Expiring a flow whose reply is on its way loses that reply: a
// DNATed flow's reply that finds no conntrack entry keeps the pod's source
// address, and a socket connected to the Service IP (Go's resolver, one
// socket per query) or a resolver that checks the source drops it. When a
// drain starts, queries sent through kube-proxy just before steering took
// effect still await the draining pod's answer, which it gives: it serves
// until drained. From the drain's start on, steered sockets no longer use
// those flows (unconnected ones are steered per datagram, new connects at
// connect()), so once their replies are back, expiring them loses nothing.
// What still needs moving is a socket that stays connected to the Service
// IP through a pinned flow, and the pod serves it meanwhile.
const udpSettle = time.Second

// udpFollowUp is when a draining endpoint's UDP flows are expired a second
// time after the first. kube-proxy drops the endpoint from its rules a
// moment after the slice says so (its sync takes up to about a second); a
// datagram in between gets a fresh conntrack entry to the draining pod,
// which this second pass removes instead of the periodic one.
const udpFollowUp = 2 * time.Second

// expiryBackoff is the wait after the nth failed expiry in a row: 200 ms
// doubling up to 30 s.
func expiryBackoff(n int) time.Duration {
	return min(100*time.Millisecond<<min(n, 9), 30*time.Second)
}

// udpDue is when a draining UDP endpoint's flows are expired next.
type udpDue struct {
	at     time.Time
	passes int // expiries done
}

// conntrackPolicyConfig is what the conntrack policy depends on.
type conntrackPolicyConfig struct {
	Conntrack   conntrack.Interface // nil: no expiry at all
	Claims      *model.Claims
	Clock       clock.WithTicker
	Metrics     *Metrics
	Log         *slog.Logger
	GoneGrace   time.Duration
	UDPReexpire time.Duration
}

// conntrackPolicy owns draind's conntrack policy, off the reconciler's goroutine
// (a full or busy table must never stall steering):
//
//   - UDP flows of a draining endpoint are expired udpSettle after its
//     drain starts, again udpFollowUp later, and then every UDPReexpire
//     while it drains: the next datagram is balanced afresh, and stale
//     rules elsewhere cannot pin it back for long;
//   - TCP flows of an endpoint are expired only once it is gone (it left
//     every slice, and no trusted slice lists the same pod ready at the IP
//     nor does this node host it alive) and GoneGrace has passed, never
//     while it drains; only
//     flows older than its departure, so a new pod that reused the IP keeps
//     its own (conntrack timestamps; without them, a reused IP is skipped),
//     and only if no trusted slice of its Service lists the pod there
//     again by then.
//
// Failed passes are retried with backoff, logged and counted.
type conntrackPolicy struct {
	cfg  conntrackPolicyConfig
	wake chan struct{}
	loop runloop.Loop

	mu        sync.Mutex
	udp       map[bpf.EndpointKey]udpDue // draining UDP keys -> next expiry
	gone      []model.Departure
	failures  int
	nextRetry time.Time
}

func newConntrackPolicy(cfg conntrackPolicyConfig) *conntrackPolicy {
	return &conntrackPolicy{cfg: cfg, wake: make(chan struct{}, 1), udp: map[bpf.EndpointKey]udpDue{}}
}

// Start runs the expiry loop (nothing without conntrack); Stop ends it.
func (w *conntrackPolicy) Start(ctx context.Context) {
	if w.cfg.Conntrack != nil {
		w.loop.Start(ctx, w.run)
	}
}

// Stop stops what Start began.
func (w *conntrackPolicy) Stop() { w.loop.Stop() }

func (w *conntrackPolicy) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// udpDrain is told when a drain entry appears or goes: UDP ones are
// expired udpSettle later, then periodically while they stay.
func (w *conntrackPolicy) udpDrain(k bpf.EndpointKey, present bool, now time.Time) {
	if w.cfg.Conntrack == nil || k.Proto != bpf.UDP {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !present {
		delete(w.udp, k)
		return
	}
	if _, ok := w.udp[k]; !ok {
		// Not at once: replies to queries sent just before steering
		// took effect are still on their way (see udpSettle). The
		// loop's one-second tick runs the pass once it is due.
		w.udp[k] = udpDue{at: now.Add(udpSettle)}
	}
}

// departed queues the TCP expiry of an endpoint that left every slice.
func (w *conntrackPolicy) departed(dep model.Departure) {
	if w.cfg.Conntrack == nil || dep.Key.Proto != bpf.TCP {
		return
	}
	w.mu.Lock()
	w.gone = append(w.gone, dep)
	w.mu.Unlock()
	w.kick()
}

func (w *conntrackPolicy) run(ctx context.Context) {
	t := w.cfg.Clock.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.wake:
		case <-t.C():
		}
		w.pass(ctx)
	}
}

// goneFilters appends the TCP expiry of each departure that is due and
// still gone.
func (w *conntrackPolicy) goneFilters(filters []conntrack.Filter, due []model.Departure) []conntrack.Filter {
	ts := w.cfg.Conntrack.Timestamps()
	for _, g := range due {
		// Listed again by its Service since, at that port (the
		// EndpointSlice controller moved it to another slice in two
		// updates): not gone. Its flows stay; if it leaves again, that is
		// a new departure.
		if w.cfg.Claims.ListsPodAt(g.Service, g.Key, g.UID) {
			continue
		}
		// The same pod still serves at the IP (listed ready elsewhere, or
		// a local pod not being deleted): it is not gone, its flows stay.
		if w.cfg.Claims.StillServes(g.Key.Addr, g.UID) {
			continue
		}
		// Without timestamps the age of a flow is unknown: if the IP
		// already belongs to a new pod, leave its flows alone.
		if !ts && w.cfg.Claims.ClaimedByOther(g.Key.Addr, g.UID) {
			continue
		}
		filters = append(filters, conntrack.Filter{Proto: conntrack.TCP, ReplySrc: netip.AddrPortFrom(g.Key.Addr, g.Key.Port), CreatedBefore: g.GoneAt})
	}
	return filters
}

// pass runs every expiry that is due, as one batched call.
func (w *conntrackPolicy) pass(ctx context.Context) {
	now := w.cfg.Clock.Now()
	w.mu.Lock()
	if now.Before(w.nextRetry) {
		w.mu.Unlock()
		return
	}
	var filters []conntrack.Filter
	var udpKeys []bpf.EndpointKey
	for k, due := range w.udp {
		if !now.Before(due.at) {
			udpKeys = append(udpKeys, k)
			filters = append(filters, conntrack.Filter{Proto: conntrack.UDP, ReplySrc: netip.AddrPortFrom(k.Addr, k.Port)})
		}
	}
	var goneDue, goneLater []model.Departure
	nGone := len(w.gone)
	for _, g := range w.gone {
		if now.Sub(g.GoneAt) >= w.cfg.GoneGrace {
			goneDue = append(goneDue, g)
		} else {
			goneLater = append(goneLater, g)
		}
	}
	w.mu.Unlock()
	filters = w.goneFilters(filters, goneDue)
	if len(filters) == 0 {
		w.mu.Lock()
		w.gone = append(goneLater, w.gone[nGone:]...)
		w.mu.Unlock()
		return
	}
	start := time.Now()
	res, err := w.cfg.Conntrack.Expire(ctx, filters)
	w.cfg.Metrics.CTExpiryDuration.Observe(time.Since(start).Seconds())
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil && ctx.Err() != nil {
		return // stopping: not a failure
	}
	if err != nil {
		w.failures++
		backoff := expiryBackoff(w.failures)
		w.nextRetry = now.Add(backoff)
		w.cfg.Metrics.CTErrors.Inc()
		w.cfg.Log.Error("conntrack expiry failed, will retry", logKeyErr, err, "filters", len(filters), "retry_in", backoff)
		// Keep everything queued; due UDP keys stay due.
		return
	}
	w.failures = 0
	for i, n := range res.PerFilter {
		if i < len(udpKeys) {
			w.cfg.Metrics.CTExpired.WithLabelValues("udp").Add(float64(n))
		} else {
			w.cfg.Metrics.CTExpired.WithLabelValues("tcp").Add(float64(n))
		}
	}
	for _, k := range udpKeys {
		if due, ok := w.udp[k]; ok {
			due.passes++
			due.at = now.Add(w.cfg.UDPReexpire)
			if due.passes == 1 {
				due.at = now.Add(min(udpFollowUp, w.cfg.UDPReexpire))
			}
			w.udp[k] = due
		}
	}
	// Departures not yet due stay queued; those skipped for a reused IP
	// (their flows belong to the new pod now) or listed again are dropped.
	w.gone = append(goneLater, w.gone[nGone:]...)
}
