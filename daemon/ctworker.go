package daemon

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
)

// ctWorker owns draind's conntrack policy, off the reconciler's goroutine
// (a full or busy table must never stall steering):
//
//   - UDP flows of a draining endpoint are expired when its drain starts and
//     again every UDPReexpire while it drains: the next datagram is balanced
//     afresh, and stale rules elsewhere cannot pin it back for long;
//   - TCP flows of an endpoint are expired only once it is gone (it left
//     every slice) and GoneGrace has passed, never while it drains; only
//     flows older than its departure, so a new pod that reused the IP keeps
//     its own (conntrack timestamps; without them, a reused IP is skipped).
//
// Failed passes are retried with backoff, logged and counted.
type ctWorker struct {
	d    *Daemon
	wake chan struct{}

	mu        sync.Mutex
	udp       map[bpf.EndpointKey]time.Time // draining UDP keys -> next expiry
	gone      []departure
	failures  int
	nextRetry time.Time
}

func newCTWorker(d *Daemon) *ctWorker {
	return &ctWorker{d: d, wake: make(chan struct{}, 1), udp: map[bpf.EndpointKey]time.Time{}}
}

func (w *ctWorker) kick() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// udpDrain is told when a drain entry appears or goes: UDP ones are
// expired at once, then periodically while they stay.
func (w *ctWorker) udpDrain(k bpf.EndpointKey, present bool, now time.Time) {
	if w.d.ct == nil || k.Proto != bpf.UDP {
		return
	}
	w.mu.Lock()
	if present {
		if _, ok := w.udp[k]; !ok {
			w.udp[k] = now // due at once: the drain just started
		}
	} else {
		delete(w.udp, k)
	}
	w.mu.Unlock()
	if present {
		w.kick()
	}
}

// departed queues the TCP expiry of an endpoint that left every slice.
func (w *ctWorker) departed(dep departure) {
	if w.d.ct == nil || dep.Key.Proto != bpf.TCP {
		return
	}
	w.mu.Lock()
	w.gone = append(w.gone, dep)
	w.mu.Unlock()
	w.kick()
}

func (w *ctWorker) loop(ctx context.Context) {
	if w.d.ct == nil {
		<-ctx.Done()
		return
	}
	t := w.d.clock.NewTicker(time.Second)
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

// pass runs every expiry that is due, as one batched call.
func (w *ctWorker) pass(ctx context.Context) {
	now := w.d.clock.Now()
	w.mu.Lock()
	if now.Before(w.nextRetry) {
		w.mu.Unlock()
		return
	}
	var filters []conntrack.Filter
	var udpDue []bpf.EndpointKey
	for k, due := range w.udp {
		if !now.Before(due) {
			udpDue = append(udpDue, k)
			filters = append(filters, conntrack.Filter{Proto: conntrack.UDP, ReplySrc: netip.AddrPortFrom(k.Addr, k.Port)})
		}
	}
	var goneDue, goneLater []departure
	nGone := len(w.gone)
	for _, g := range w.gone {
		if now.Sub(g.GoneAt) >= w.d.cfg.GoneGrace {
			goneDue = append(goneDue, g)
		} else {
			goneLater = append(goneLater, g)
		}
	}
	w.mu.Unlock()
	ts := w.d.ct.Timestamps()
	for _, g := range goneDue {
		// Without timestamps the age of a flow is unknown: if the IP
		// already belongs to a new pod, leave its flows alone.
		if !ts && w.d.claims.claimedByOther(g.Key.Addr, g.UID) {
			continue
		}
		filters = append(filters, conntrack.Filter{Proto: conntrack.TCP, ReplySrc: netip.AddrPortFrom(g.Key.Addr, g.Key.Port), CreatedBefore: g.GoneAt})
	}
	if len(filters) == 0 {
		w.mu.Lock()
		w.gone = append(goneLater, w.gone[nGone:]...)
		w.mu.Unlock()
		return
	}
	start := time.Now()
	res, err := w.d.ct.Expire(ctx, filters)
	w.d.Metrics.CTExpiryDuration.Observe(time.Since(start).Seconds())
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.failures++
		backoff := min(time.Duration(1<<min(w.failures, 6))*100*time.Millisecond, 30*time.Second)
		w.nextRetry = now.Add(backoff)
		w.d.Metrics.CTErrors.Inc()
		w.d.log.Error("conntrack expiry failed, will retry", logKeyErr, err, "filters", len(filters), "retry_in", backoff)
		// Keep everything queued; due UDP keys stay due.
		return
	}
	w.failures = 0
	for i, n := range res.PerFilter {
		if i < len(udpDue) {
			w.d.Metrics.CTExpired.WithLabelValues("udp").Add(float64(n))
		} else {
			w.d.Metrics.CTExpired.WithLabelValues("tcp").Add(float64(n))
		}
	}
	for _, k := range udpDue {
		if _, ok := w.udp[k]; ok {
			w.udp[k] = now.Add(w.d.cfg.UDPReexpire)
		}
	}
	// Departures not yet due stay queued; those skipped for a reused IP
	// are dropped (their flows belong to the new pod now).
	w.gone = append(goneLater, w.gone[nGone:]...)
}
