package daemon

import (
	"time"

	"github.com/draind/draind/daemon/model"
)

// One reconciler pass, run by the runner: take what changed, update the
// model, write the difference, hand departures to the conntrack policy.

// sync is one pass. It returns the next instant the model changes by
// itself (a Lease or linger ending, a retry).
func (d *Daemon) sync() time.Time {
	d.modelMu.Lock()
	defer d.modelMu.Unlock()
	return d.syncLocked(true)
}

// passNow runs a pass in the caller's goroutine, the slice watch's, if no
// other is running (else the loop will: the caller signals it), and tells
// the loop when the next is due. It reports whether it ran one.
//
// Why: a burst of slice updates keeps both CPUs of a small node busy
// reading and decoding; the loop's goroutine then waits for a CPU until
// the burst is read, and every update of the burst with it. A pass run
// right after each update's handler, while its slice is in the cache,
// writes it at once (BenchmarkClusterScale at 150k: p50 0.32-0.45 -> 0.10
// ms). The watch reads on meanwhile; the updates behind it wait in its
// buffer, in order. Such a pass writes events only: refresh rounds are the
// loop's.
//
// Not in the middle of a relist (the cache is then neither the state before
// nor after it: the loop takes the list in), and not for a while after a
// pass that took long (a large Service changing fast): the loop then takes
// the updates in together, and the watch reads on.
func (d *Daemon) passNow() bool {
	if !d.inlinePasses.Load() || !d.firstDone.Load() || d.inf.Slices.Listing() ||
		d.clock.Now().UnixNano() < d.inlineAfter.Load() || !d.modelMu.TryLock() {
		return false
	}
	defer d.modelMu.Unlock()
	if !d.inlinePasses.Load() { // the loop is stopping
		return false
	}
	start := d.clock.Now()
	d.runner.Schedule(d.syncLocked(false))
	if end := d.clock.Now(); end.Sub(start) > slowInlinePass {
		d.inlineAfter.Store(end.Add(inlineBackoff).UnixNano())
	}
	return true
}

// A pass the slice watch runs that takes longer than slowInlinePass hands
// the updates of the next inlineBackoff to the loop.
const (
	slowInlinePass = time.Millisecond
	inlineBackoff  = 10 * time.Millisecond
)

// syncLocked is a pass under modelMu: the loop's (loop: it also starts and
// steps refresh rounds) or one passNow runs (events only, kept short).
func (d *Daemon) syncLocked(loop bool) time.Time {
	d.passes.Add(1)
	now := d.clock.Now()
	dirty := d.tracker.take()
	m := d.model

	local := d.localPodsNow()
	d.hosted.ObserveLocalPods(now)
	m.AddVanished(d.vanished.take())
	podAt := dirty.podEventAt(now)
	var changedDrains []*model.PodDrain
	if next, changed := d.podDrains(local, now); changed {
		changedDrains = m.SetPodDrains(next)
	}
	for _, ip := range d.readClaims(local, now) {
		dirty.ips[ip] = struct{}{}
	}
	podViaServices := false
	for _, pd := range changedDrains {
		for _, svc := range m.ServicesListing(pd.UID, pd.Namespace) {
			podViaServices = true
			if t, ok := dirty.services[svc]; !ok || podAt.Before(t) {
				dirty.services[svc] = podAt
			}
		}
	}
	m.MarkVanished(dirty.services, podAt, now)
	var changedAt []time.Time
	var programmed []programming
	for svc, at := range dirty.services {
		if m.RecomputeService(svc, now) {
			changedAt = append(changedAt, at)
			if trig, ok := dirty.triggers[svc]; ok {
				programmed = append(programmed, programming{trig, TriggerEndpointSlice})
			}
		}
	}
	d.revisitVanished(now)
	if len(changedDrains) > 0 && !podViaServices {
		changedAt = append(changedAt, podAt) // a registry-only pod: no Service carried it
	}
	if len(changedDrains) > 0 && !dirty.leaseTrigger.IsZero() {
		programmed = append(programmed, programming{dirty.leaseTrigger, TriggerLease})
	}
	for ip := range dirty.ips {
		m.ClaimsChanged(ip)
	}
	for _, uid := range dirty.leasesGone {
		m.EndLingersOf(uid)
	}
	m.ExpireLingering(now)
	m.ForgetVanishedServices(now)
	first := d.apply(now, changedAt, programmed, loop)
	d.gone.Pass(m.Gone(), now, dirty.ips, dirty.services)
	d.hosted.SetKeys(m.KeysOf)
	for _, dep := range m.TakeDepartures() {
		d.conntrackPolicy.departed(dep)
	}
	if first {
		// Ready, and passes in the slice watch's goroutine, once the whole
		// first pass is done: an update that came before then waits for
		// the rest of it (the gone peers' first look at every pod drain).
		d.firstDone.Store(true)
	}
	next := m.NextDeadline()
	if d.reconciler.Pending() {
		if retry := now.Add(time.Second); next.IsZero() || retry.Before(next) {
			next = retry
		}
	}
	if step := d.reconciler.NextBatch(); !step.IsZero() && (next.IsZero() || step.Before(next)) {
		next = step
	}
	return next
}

// apply writes the model's difference to the datapath and records how long
// the events in changedAt took to reach it. The first pass evaluates
// everything; after it, every quarter of the entry TTL a refresh round
// evaluates everything again (deadlines refreshed), a batch per pass of
// the loop's (loop). It reports whether it was the first.
func (d *Daemon) apply(now time.Time, changedAt []time.Time, programmed []programming, loop bool) (first bool) {
	first = !d.firstDone.Load()
	if first {
		d.lastFull = now
	} else if loop && now.Sub(d.lastFull) >= d.cfg.EntryTTL/4 {
		d.lastFull = now
		d.reconciler.StartRefresh(d.model.Desired(), now)
	}
	res := d.reconciler.Apply(d.model.Desired(), now, first, loop)
	done := d.clock.Now()
	d.Metrics.DatapathOps.Add(float64(res.Ops))
	if res.Ops > 0 {
		for _, at := range changedAt {
			lat := done.Sub(at)
			d.Metrics.SignalToDatapath.Observe(lat.Seconds())
			if d.onLatency != nil {
				d.onLatency(lat)
			}
		}
		d.Metrics.observeProgramming(done, programmed)
	}
	if loop {
		// The health check's "last pass": the loop's, which refresh the
		// entries (a stalled loop must show, whatever the watch writes).
		d.lastSync.Store(done.UnixNano())
	}
	if first {
		d.model.ForgetPinnedIDs() // adopted or replaced by now
		d.log.Info("first datapath pass done", logKeyOps, res.Ops)
	}
	return first
}

// podEventAt is the earliest Lease or local pod event of the pass, or now
// when none (a deadline passed).
func (s dirtySet) podEventAt(now time.Time) time.Time {
	at := s.leases
	if at.IsZero() || (!s.pods.IsZero() && s.pods.Before(at)) {
		at = s.pods
	}
	if at.IsZero() {
		return now
	}
	return at
}
