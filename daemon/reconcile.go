package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/draind/draind/bpf"
)

// What the kernel gets. The reconciler holds what was written to the
// datapath and writes the minimal difference to what the model wants, as a
// small driver over per-map operations. The order keeps every reference
// valid at every instant: backend sets first, then the entries that name
// them, then deletions of entries, then deletions of backend sets. A
// deletion never undoes a write of the same pass.
type reconciler struct {
	dp  Datapath
	ttl time.Duration

	// What the datapath holds, as last written. Invariant: it is what the
	// datapath holds (a write that fails leaves both as they were and puts
	// its key in retry); a pass writes only where the model's desired
	// entries for the keys it touched differ from it. Checked by
	// FuzzSequenceDifferential (failed writes included).
	frontends map[bpf.EndpointKey]bpf.Frontend
	byService map[bpf.ServicePortID][]bpf.EndpointKey // frontends written per service-port
	backends  map[bpf.ServicePortID]appliedBackends
	drains    map[bpf.EndpointKey]bpf.Drain

	// retry holds what failed to apply: it is evaluated again next pass.
	retryKeys         map[bpf.EndpointKey]struct{}
	retryServicePorts map[bpf.ServicePortID]struct{}

	// refresh holds what a refresh round has yet to evaluate; each pass
	// takes at most refreshBatch of it (see startRefresh).
	refreshServicePorts []bpf.ServicePortID
	refreshKeys         []bpf.EndpointKey
	// refreshAll: the previous round was not finished when this one began
	// (passes too rare for the batch size: --min-sync-interval), so the
	// next pass takes the whole round; no entry goes unrefreshed for more
	// than two rounds (half the entry TTL).
	refreshAll bool
	// lastBatch is when a pass last took a batch of the round.
	lastBatch time.Time

	onError func(what string, err error)
	// onDrain is told when a drain entry appears or goes.
	onDrain func(k bpf.EndpointKey, present bool)

	scratch passScratch
}

// passScratch is a pass's short-lived lists, kept for the next pass: a pass
// per slice update would otherwise allocate them every time. Lists longer
// than scratchKeep (a full pass's, a refresh round's) are let go.
type passScratch struct {
	ids   []bpf.ServicePortID
	keys  []bpf.EndpointKey
	plans []servicePortPlan
	addrs []netip.AddrPort // a backend set unpacked for SetBackends
}

const scratchKeep = 4096

// reuseList returns s emptied for the next pass (nil if it grew past
// scratchKeep). It clears what s held, so a kept list pins nothing.
func reuseList[T any](s []T) []T {
	if cap(s) > scratchKeep {
		return nil
	}
	clear(s)
	return s[:0]
}

func newReconciler(dp Datapath, ttl time.Duration) *reconciler {
	return &reconciler{
		dp: dp, ttl: ttl,
		frontends:         map[bpf.EndpointKey]bpf.Frontend{},
		byService:         map[bpf.ServicePortID][]bpf.EndpointKey{},
		backends:          map[bpf.ServicePortID]appliedBackends{},
		drains:            map[bpf.EndpointKey]bpf.Drain{},
		retryKeys:         map[bpf.EndpointKey]struct{}{},
		retryServicePorts: map[bpf.ServicePortID]struct{}{},
	}
}

// adopt seeds the applied state from the pinned maps of a previous draind,
// so the first full pass writes only differences and removes leftovers.
func (r *reconciler) adopt(d *bpf.Dump) {
	for _, f := range d.Frontends {
		r.frontends[f.Key] = f
		r.byService[f.Service] = append(r.byService[f.Service], f.Key)
	}
	for _, b := range d.Backends {
		r.backends[b.Service] = appliedBackends{packBackends(b.Backends), b.Expires}
	}
	for _, dr := range d.Drains {
		r.drains[dr.Key] = dr
		if r.onDrain != nil {
			r.onDrain(dr.Key, true)
		}
	}
}

// due reports whether an applied deadline must be rewritten: refresh when
// less than half the TTL is left; shorten when the desired one is earlier.
func (r *reconciler) due(applied, desired, now time.Time) bool {
	return applied.Sub(now) < r.ttl/2 || desired.Before(applied.Add(-time.Second))
}

// applyResult summarises one pass.
type applyResult struct {
	Ops    int
	Errors int
}

// servicePortPlan is what one service-port should hold.
type servicePortPlan struct {
	id        bpf.ServicePortID
	frontends []bpf.Frontend
	backends  *bpf.Backends // nil: the service-port is not active
	set       backendSet    // backends packed: the model's own string, kept as written
}

// staleFrontend is a frontend its service-port no longer wants.
type staleFrontend struct {
	key bpf.EndpointKey
	id  bpf.ServicePortID
}

// pass is the state of one apply.
type pass struct {
	r   *reconciler
	now time.Time
	res applyResult
}

// do counts one operation and records its failure.
func (p *pass) do(what func() string, err error) bool {
	p.res.Ops++
	if err == nil {
		return true
	}
	p.res.Errors++
	if p.r.onError != nil {
		p.r.onError(what(), err)
	}
	return false
}

// refreshBatch bounds the service-ports and entry keys of a refresh round
// that one pass evaluates. A round evaluates every entry (deadlines
// refreshed, anything that drifted repaired) each quarter of the entry
// TTL; done in one pass, it held the runner for 50-170 ms at 6,000 draining
// Services on a loaded 2-core machine, and every event arriving meanwhile
// waited.
const refreshBatch = 16

// refreshStep is how often a pass takes a batch while a round is under way
// (the runner comes back for it when no event brings it sooner): 16,000
// targets a second, whatever the rate of events or passes. Passes that events bring
// in between take none, so that at a thousand events a second the round
// does not ride on every one of them (with 64 per pass it did, and the
// rounds made half of BenchmarkClusterScale's slowest samples).
const refreshStep = time.Millisecond

// startRefresh begins a refresh round: every service-port and entry key
// that is applied or wanted is queued, and the next passes evaluate them a
// batch at a time. What changes meanwhile is evaluated by its own pass
// anyway; what is queued twice or is gone by its turn costs a lookup.
func (r *reconciler) startRefresh(m *model, now time.Time) {
	r.refreshAll = r.refreshing()
	r.lastBatch = now.Add(-refreshStep) // the first batch is due at once
	r.refreshServicePorts = r.refreshServicePorts[:0]
	for id := range m.servicePorts {
		r.refreshServicePorts = append(r.refreshServicePorts, id)
	}
	for id := range r.backends {
		if m.servicePorts[id] == nil {
			r.refreshServicePorts = append(r.refreshServicePorts, id)
		}
	}
	for id := range r.byService {
		if _, ok := r.backends[id]; !ok && m.servicePorts[id] == nil {
			r.refreshServicePorts = append(r.refreshServicePorts, id)
		}
	}
	r.refreshKeys = r.refreshKeys[:0]
	for k := range m.contributions {
		r.refreshKeys = append(r.refreshKeys, k)
	}
	for k := range r.drains {
		if _, ok := m.contributions[k]; !ok {
			r.refreshKeys = append(r.refreshKeys, k)
		}
	}
}

// refreshing reports whether a refresh round is under way.
func (r *reconciler) refreshing() bool {
	return len(r.refreshServicePorts)+len(r.refreshKeys) > 0
}

// nextBatch is when the next batch of a round is due (zero: no round).
func (r *reconciler) nextBatch() time.Time {
	if !r.refreshing() {
		return time.Time{}
	}
	return r.lastBatch.Add(refreshStep)
}

// takeRefresh moves the next batch of the refresh round into the pass's
// targets, if one is due.
func (r *reconciler) takeRefresh(now time.Time, spSet map[bpf.ServicePortID]struct{}, keySet map[bpf.EndpointKey]struct{}) {
	if !r.refreshing() || (!r.refreshAll && now.Before(r.nextBatch())) {
		return
	}
	// A batch per refreshStep since the last: passes rarer than that
	// (--min-sync-interval) take as many, so a round's pace never
	// depends on how often events come.
	batch := refreshBatch * max(1, int(now.Sub(r.lastBatch)/refreshStep))
	r.lastBatch = now
	if r.refreshAll {
		batch, r.refreshAll = len(r.refreshServicePorts)+len(r.refreshKeys), false
	}
	n := min(batch, len(r.refreshServicePorts))
	for _, id := range r.refreshServicePorts[len(r.refreshServicePorts)-n:] {
		spSet[id] = struct{}{}
	}
	r.refreshServicePorts = r.refreshServicePorts[:len(r.refreshServicePorts)-n]
	k := min(batch-n, len(r.refreshKeys))
	for _, key := range r.refreshKeys[len(r.refreshKeys)-k:] {
		keySet[key] = struct{}{}
	}
	r.refreshKeys = r.refreshKeys[:len(r.refreshKeys)-k]
	if !r.refreshing() {
		// Let go of a large round's memory.
		r.refreshServicePorts, r.refreshKeys = nil, nil
	}
}

// apply writes the difference for the touched keys and service-ports and
// the next batch of a refresh round (or for everything when full: the
// first pass, which also removes what a previous draind left).
func (r *reconciler) apply(m *model, now time.Time, full, refresh bool) applyResult {
	ids, keys := r.targets(m, now, full, refresh)
	plans := r.scratch.plans
	for _, id := range ids {
		fes, be := m.desiredServicePort(id, now)
		var set backendSet
		if be != nil {
			set = m.servicePorts[id].selectable
		}
		plans = append(plans, servicePortPlan{id, fes, be, set})
	}
	p := &pass{r: r, now: now}
	p.writeBackends(plans)
	stale := p.writeFrontends(plans)
	staleDrains := p.writeDrains(m, keys)
	p.deleteFrontends(stale)
	p.deleteDrains(staleDrains)
	p.deleteBackends(plans)
	clear(m.touched)
	clear(m.touchedServicePorts)
	r.scratch.ids, r.scratch.keys, r.scratch.plans = reuseList(ids), reuseList(keys), reuseList(plans)
	return p.res
}

// targets returns the service-ports and keys to evaluate, sorted: the
// touched ones and the retries (and, if refresh, a due batch of a refresh
// round), or everything applied and wanted.
func (r *reconciler) targets(m *model, now time.Time, full, refresh bool) ([]bpf.ServicePortID, []bpf.EndpointKey) {
	spSet, keySet := m.touchedServicePorts, m.touched
	for id := range r.retryServicePorts {
		spSet[id] = struct{}{}
	}
	for k := range r.retryKeys {
		keySet[k] = struct{}{}
	}
	clear(r.retryServicePorts)
	clear(r.retryKeys)
	if refresh {
		r.takeRefresh(now, spSet, keySet)
	}
	if full {
		for _, src := range []map[bpf.ServicePortID]bool{setOf(r.backends), setOf(r.byService), setOf(m.servicePorts)} {
			for id := range src {
				spSet[id] = struct{}{}
			}
		}
		for k := range r.drains {
			keySet[k] = struct{}{}
		}
		for k := range m.contributions {
			keySet[k] = struct{}{}
		}
	}
	ids, keys := r.scratch.ids, r.scratch.keys
	for id := range spSet {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for k := range keySet {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, bpf.EndpointKey.Compare)
	return ids, keys
}

func setOf[K comparable, V any](m map[K]V) map[K]bool {
	out := make(map[K]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// appliedBackends is a backend set as written, packed (backendSet).
type appliedBackends struct {
	set     backendSet
	expires time.Time
}

// writeBackends writes the backend sets that changed or are due.
func (p *pass) writeBackends(plans []servicePortPlan) {
	r := p.r
	for _, pl := range plans {
		if pl.backends == nil {
			continue
		}
		cur, ok := r.backends[pl.id]
		if ok && cur.set == pl.set && !r.due(cur.expires, pl.backends.Expires, p.now) {
			continue
		}
		be := *pl.backends
		be.Backends = pl.set.appendAddrPorts(r.scratch.addrs[:0])
		if cap(be.Backends) <= scratchKeep {
			r.scratch.addrs = be.Backends[:0]
		}
		if !p.do(func() string { return fmt.Sprintf("setting backends of service-port %d", pl.id) }, r.dp.SetBackends(be)) {
			r.retryServicePorts[pl.id] = struct{}{}
			continue
		}
		r.backends[pl.id] = appliedBackends{pl.set, pl.backends.Expires}
	}
}

// writeFrontends upserts wanted frontends and returns the ones their
// service-port no longer wants.
func (p *pass) writeFrontends(plans []servicePortPlan) (stale []staleFrontend) {
	r := p.r
	for _, pl := range plans {
		for _, fe := range pl.frontends {
			cur, ok := r.frontends[fe.Key]
			if ok && cur.Service == fe.Service && cur.NoSteer == fe.NoSteer && !r.due(cur.Expires, fe.Expires, p.now) {
				continue
			}
			if !p.do(func() string { return "upserting frontend " + fe.Key.String() }, r.dp.UpsertFrontend(fe)) {
				r.retryServicePorts[pl.id] = struct{}{}
				continue
			}
			if ok && cur.Service != fe.Service {
				r.dropFrontendRef(cur.Service, fe.Key)
			}
			r.frontends[fe.Key] = fe
			if !slices.Contains(r.byService[pl.id], fe.Key) {
				r.byService[pl.id] = append(r.byService[pl.id], fe.Key)
			}
		}
		for _, k := range r.byService[pl.id] {
			// A service-port has a frontend per VIP: one or two.
			if !slices.ContainsFunc(pl.frontends, func(fe bpf.Frontend) bool { return fe.Key == k }) {
				stale = append(stale, staleFrontend{k, pl.id})
			}
		}
	}
	return stale
}

// writeDrains upserts wanted drain entries and returns the applied ones
// nothing wants any more.
func (p *pass) writeDrains(m *model, keys []bpf.EndpointKey) (stale []bpf.EndpointKey) {
	r := p.r
	for _, k := range keys {
		want, ok := m.desiredDrain(k, p.now)
		cur, have := r.drains[k]
		if !ok {
			if have {
				stale = append(stale, k)
			}
			continue
		}
		if have && cur.Service == want.Service && cur.Policy == want.Policy && !r.due(cur.Expires, want.Expires, p.now) {
			continue
		}
		if !p.do(func() string { return "upserting drain " + k.String() }, r.dp.UpsertDrain(want)) {
			r.retryKeys[k] = struct{}{}
			continue
		}
		r.drains[k] = want
		if !have && r.onDrain != nil {
			r.onDrain(k, true)
		}
	}
	return stale
}

// deleteFrontends deletes stale frontends. One that another service-port
// took over in this pass (a restart under new ids, a VIP reassigned) is not
// stale any more: deleting it would undo the write.
func (p *pass) deleteFrontends(stale []staleFrontend) {
	r := p.r
	for _, st := range stale {
		k := st.key
		if cur, ok := r.frontends[k]; !ok || cur.Service != st.id {
			r.dropFrontendRef(st.id, k)
			continue
		}
		if !p.do(func() string { return "deleting frontend " + k.String() }, r.dp.DeleteFrontend(k)) {
			r.retryServicePorts[st.id] = struct{}{}
			continue
		}
		delete(r.frontends, k)
		r.dropFrontendRef(st.id, k)
	}
}

// deleteDrains deletes drain entries nothing wants.
func (p *pass) deleteDrains(stale []bpf.EndpointKey) {
	r := p.r
	for _, k := range stale {
		if !p.do(func() string { return "deleting drain " + k.String() }, r.dp.DeleteDrain(k)) {
			r.retryKeys[k] = struct{}{}
			continue
		}
		delete(r.drains, k)
		if r.onDrain != nil {
			r.onDrain(k, false)
		}
	}
}

// deleteBackends deletes backend sets no frontend or drain entry names.
func (p *pass) deleteBackends(plans []servicePortPlan) {
	r := p.r
	for _, pl := range plans {
		if pl.backends != nil || len(r.byService[pl.id]) > 0 {
			continue
		}
		if _, ok := r.backends[pl.id]; !ok || r.referenced(pl.id) {
			continue
		}
		if !p.do(func() string { return fmt.Sprintf("deleting backends of service-port %d", pl.id) }, r.dp.DeleteBackends(pl.id)) {
			r.retryServicePorts[pl.id] = struct{}{}
			continue
		}
		delete(r.backends, pl.id)
	}
}

// dropFrontendRef forgets that service-port id owns frontend k.
func (r *reconciler) dropFrontendRef(id bpf.ServicePortID, k bpf.EndpointKey) {
	r.byService[id] = slices.DeleteFunc(r.byService[id], func(x bpf.EndpointKey) bool { return x == k })
	if len(r.byService[id]) == 0 {
		delete(r.byService, id)
	}
}

// referenced reports whether an applied drain still names id (its deletion
// failed and is being retried): its backends stay until it is gone.
func (r *reconciler) referenced(id bpf.ServicePortID) bool {
	for _, d := range r.drains {
		if d.Service == id && d.Policy == bpf.PolicyRewrite {
			return true
		}
	}
	return false
}

// pending reports whether failed work waits for a retry.
func (r *reconciler) pending() bool { return len(r.retryKeys) > 0 || len(r.retryServicePorts) > 0 }

// isMapFull reports whether err is a full-map error.
func isMapFull(err error) bool { return errors.Is(err, bpf.ErrMapFull) }
