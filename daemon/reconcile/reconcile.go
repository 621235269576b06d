// Package reconcile writes what the model wants into the datapath. A
// Reconciler holds what was written and writes the minimal difference to
// what a Desired view wants, as a small driver over per-map operations.
// It reads the model only through Desired and the datapath only through
// Datapath.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package reconcile

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/internal/backendset"
)

// Datapath is the part of the datapath a Reconciler writes. SetBackends
// must not keep b.Backends past the call: the reconciler reuses the array.
type Datapath interface {
	UpsertFrontend(bpf.Frontend) error
	DeleteFrontend(bpf.EndpointKey) error
	SetBackends(bpf.Backends) error
	DeleteBackends(bpf.ServicePortID) error
	UpsertDrain(bpf.Drain) error
	DeleteDrain(bpf.EndpointKey) error
}

// Desired is what the model wants, as a pass reads it.
type Desired interface {
	// ServicePort returns the frontends and backends service-port id
	// should hold (backends nil: the service-port is not active), and its
	// backends packed, with deadlines from now.
	ServicePort(id bpf.ServicePortID, now time.Time) ([]bpf.Frontend, *bpf.Backends, backendset.Set)
	// Drain returns the drain entry k should hold, if any.
	Drain(k bpf.EndpointKey, now time.Time) (bpf.Drain, bool)
	// ServicePorts lists every service-port the model knows;
	// HasServicePort reports whether it knows id.
	ServicePorts() iter.Seq[bpf.ServicePortID]
	HasServicePort(id bpf.ServicePortID) bool
	// Keys lists every endpoint key that may want a drain entry; HasKey
	// reports whether k is one.
	Keys() iter.Seq[bpf.EndpointKey]
	HasKey(k bpf.EndpointKey) bool
	// Touched returns the service-ports and keys that changed since the
	// last pass. Apply adds its own targets to these sets and clears them.
	Touched() (map[bpf.ServicePortID]struct{}, map[bpf.EndpointKey]struct{})
}

// Reconciler is what the kernel gets. The order of a pass keeps every reference
// valid at every instant: backend sets first, then the entries that name
// them, then deletions of entries, then deletions of backend sets. A
// deletion never undoes a write of the same pass.
type Reconciler struct {
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
	// takes at most RefreshBatch of it (see StartRefresh).
	refreshServicePorts []bpf.ServicePortID
	refreshKeys         []bpf.EndpointKey
	// refreshAll: the previous round was not finished when this one began
	// (passes too rare for the batch size: --min-sync-interval), so the
	// next pass takes the whole round; no entry goes unrefreshed for more
	// than two rounds (half the entry TTL).
	refreshAll bool
	// lastBatch is when a pass last took a batch of the round.
	lastBatch time.Time

	hooks Hooks

	scratch passScratch
}

// passScratch is a pass's short-lived lists, kept for the next pass: a pass
// per slice update would otherwise allocate them every time. Lists longer
// than ScratchKeep (a full pass's, a refresh round's) are let go.
type passScratch struct {
	ids   []bpf.ServicePortID
	keys  []bpf.EndpointKey
	plans []servicePortPlan
	addrs []netip.AddrPort // a backend set unpacked for SetBackends
}

// ScratchKeep is the longest scratch list a pass keeps for the next one,
// here and in the model's passes.
const ScratchKeep = 4096

// reuseList returns s emptied for the next pass (nil if it grew past
// ScratchKeep). It clears what s held, so a kept list pins nothing.
func reuseList[T any](s []T) []T {
	if cap(s) > ScratchKeep {
		return nil
	}
	clear(s)
	return s[:0]
}

// Hooks are told what a pass did; either may be nil.
type Hooks struct {
	// OnError is told of each write that failed (it is retried next pass).
	OnError func(what string, err error)
	// OnDrain is told when a drain entry appears or goes.
	OnDrain func(k bpf.EndpointKey, present bool)
}

// New returns a Reconciler over dp that rewrites an entry when less than
// half of ttl is left of it.
func New(dp Datapath, ttl time.Duration, hooks Hooks) *Reconciler {
	return &Reconciler{
		dp: dp, ttl: ttl, hooks: hooks,
		frontends:         map[bpf.EndpointKey]bpf.Frontend{},
		byService:         map[bpf.ServicePortID][]bpf.EndpointKey{},
		backends:          map[bpf.ServicePortID]appliedBackends{},
		drains:            map[bpf.EndpointKey]bpf.Drain{},
		retryKeys:         map[bpf.EndpointKey]struct{}{},
		retryServicePorts: map[bpf.ServicePortID]struct{}{},
	}
}

// Adopt seeds the applied state from the pinned maps of a previous draind,
// so the first full pass writes only differences and removes leftovers.
func (r *Reconciler) Adopt(d *bpf.Dump) {
	for _, f := range d.Frontends {
		r.frontends[f.Key] = f
		r.byService[f.Service] = append(r.byService[f.Service], f.Key)
	}
	for _, b := range d.Backends {
		r.backends[b.Service] = appliedBackends{backendset.Pack(b.Backends), b.Expires}
	}
	for _, dr := range d.Drains {
		r.drains[dr.Key] = dr
		if r.hooks.OnDrain != nil {
			r.hooks.OnDrain(dr.Key, true)
		}
	}
}

// due reports whether an applied deadline must be rewritten: refresh when
// less than half the TTL is left; shorten when the desired one is earlier.
func (r *Reconciler) due(applied, desired, now time.Time) bool {
	return applied.Sub(now) < r.ttl/2 || desired.Before(applied.Add(-time.Second))
}

// Result summarises one pass.
type Result struct {
	Ops    int
	Errors int
}

// servicePortPlan is what one service-port should hold.
type servicePortPlan struct {
	id        bpf.ServicePortID
	frontends []bpf.Frontend
	backends  *bpf.Backends  // nil: the service-port is not active
	set       backendset.Set // backends packed: the model's own string, kept as written
}

// staleFrontend is a frontend its service-port no longer wants.
type staleFrontend struct {
	key bpf.EndpointKey
	id  bpf.ServicePortID
}

// pass is the state of one apply.
type pass struct {
	r   *Reconciler
	now time.Time
	res Result
}

// do counts one operation and records its failure.
func (p *pass) do(what func() string, err error) bool {
	p.res.Ops++
	if err == nil {
		return true
	}
	p.res.Errors++
	if p.r.hooks.OnError != nil {
		p.r.hooks.OnError(what(), err)
	}
	return false
}

// RefreshBatch bounds the service-ports and entry keys of a refresh round
// that one pass evaluates. A round evaluates every entry (deadlines
// refreshed, anything that drifted repaired) each quarter of the entry
// TTL; done in one pass, it held the runner for 50-170 ms at 6,000 draining
// Services on a loaded 2-core machine, and every event arriving meanwhile
// waited.
const RefreshBatch = 16

// RefreshStep is how often a pass takes a batch while a round is under way
// (the runner comes back for it when no event brings it sooner): 16,000
// targets a second, whatever the rate of events or passes. Passes that events bring
// in between take none, so that at a thousand events a second the round
// does not ride on every one of them (with 64 per pass it did, and the
// rounds made half of BenchmarkClusterScale's slowest samples).
const RefreshStep = time.Millisecond

// StartRefresh begins a refresh round: every service-port and entry key
// that is applied or wanted is queued, and the next passes evaluate them a
// batch at a time. What changes meanwhile is evaluated by its own pass
// anyway; what is queued twice or is gone by its turn costs a lookup.
func (r *Reconciler) StartRefresh(m Desired, now time.Time) {
	r.refreshAll = r.Refreshing()
	r.lastBatch = now.Add(-RefreshStep) // the first batch is due at once
	r.refreshServicePorts = slices.AppendSeq(r.refreshServicePorts[:0], m.ServicePorts())
	for id := range r.backends {
		if !m.HasServicePort(id) {
			r.refreshServicePorts = append(r.refreshServicePorts, id)
		}
	}
	for id := range r.byService {
		if _, ok := r.backends[id]; !ok && !m.HasServicePort(id) {
			r.refreshServicePorts = append(r.refreshServicePorts, id)
		}
	}
	r.refreshKeys = slices.AppendSeq(r.refreshKeys[:0], m.Keys())
	for k := range r.drains {
		if !m.HasKey(k) {
			r.refreshKeys = append(r.refreshKeys, k)
		}
	}
}

// Refreshing reports whether a refresh round is under way.
func (r *Reconciler) Refreshing() bool {
	return len(r.refreshServicePorts)+len(r.refreshKeys) > 0
}

// NextBatch is when the next batch of a round is due (zero: no round).
func (r *Reconciler) NextBatch() time.Time {
	if !r.Refreshing() {
		return time.Time{}
	}
	return r.lastBatch.Add(RefreshStep)
}

// takeRefresh moves the next batch of the refresh round into the pass's
// targets, if one is due.
func (r *Reconciler) takeRefresh(now time.Time, spSet map[bpf.ServicePortID]struct{}, keySet map[bpf.EndpointKey]struct{}) {
	if !r.Refreshing() || (!r.refreshAll && now.Before(r.NextBatch())) {
		return
	}
	// A batch per RefreshStep since the last: passes rarer than that
	// (--min-sync-interval) take as many, so a round's pace never
	// depends on how often events come.
	batch := RefreshBatch * max(1, int(now.Sub(r.lastBatch)/RefreshStep))
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
	if !r.Refreshing() {
		// Let go of a large round's memory.
		r.refreshServicePorts, r.refreshKeys = nil, nil
	}
}

// Apply writes the difference for the touched keys and service-ports and
// the next batch of a refresh round (or for everything when full: the
// first pass, which also removes what a previous draind left).
func (r *Reconciler) Apply(m Desired, now time.Time, full, refresh bool) Result {
	spSet, keySet := m.Touched()
	ids, keys := r.targets(m, spSet, keySet, now, full, refresh)
	plans := r.scratch.plans
	for _, id := range ids {
		fes, be, set := m.ServicePort(id, now)
		plans = append(plans, servicePortPlan{id, fes, be, set})
	}
	p := &pass{r: r, now: now}
	p.writeBackends(plans)
	stale := p.writeFrontends(plans)
	staleDrains := p.writeDrains(m, keys)
	p.deleteFrontends(stale)
	p.deleteDrains(staleDrains)
	p.deleteBackends(plans)
	clear(spSet)
	clear(keySet)
	r.scratch.ids, r.scratch.keys, r.scratch.plans = reuseList(ids), reuseList(keys), reuseList(plans)
	return p.res
}

// targets returns the service-ports and keys to evaluate, sorted: the
// touched ones (spSet, keySet) and the retries (and, if refresh, a due
// batch of a refresh round), or everything applied and wanted.
func (r *Reconciler) targets(m Desired, spSet map[bpf.ServicePortID]struct{}, keySet map[bpf.EndpointKey]struct{}, now time.Time, full, refresh bool) ([]bpf.ServicePortID, []bpf.EndpointKey) {
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
		for _, src := range []iter.Seq[bpf.ServicePortID]{maps.Keys(r.backends), maps.Keys(r.byService), m.ServicePorts()} {
			for id := range src {
				spSet[id] = struct{}{}
			}
		}
		for _, src := range []iter.Seq[bpf.EndpointKey]{maps.Keys(r.drains), m.Keys()} {
			for k := range src {
				keySet[k] = struct{}{}
			}
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

// appliedBackends is a backend set as written, packed.
type appliedBackends struct {
	set     backendset.Set
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
		be.Backends = pl.set.AppendAddrPorts(r.scratch.addrs[:0])
		if cap(be.Backends) <= ScratchKeep {
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
func (p *pass) writeDrains(m Desired, keys []bpf.EndpointKey) (stale []bpf.EndpointKey) {
	r := p.r
	for _, k := range keys {
		want, ok := m.Drain(k, p.now)
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
		if !have && r.hooks.OnDrain != nil {
			r.hooks.OnDrain(k, true)
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
		if r.hooks.OnDrain != nil {
			r.hooks.OnDrain(k, false)
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
func (r *Reconciler) dropFrontendRef(id bpf.ServicePortID, k bpf.EndpointKey) {
	r.byService[id] = slices.DeleteFunc(r.byService[id], func(x bpf.EndpointKey) bool { return x == k })
	if len(r.byService[id]) == 0 {
		delete(r.byService, id)
	}
}

// referenced reports whether an applied drain still names id (its deletion
// failed and is being retried): its backends stay until it is gone.
func (r *Reconciler) referenced(id bpf.ServicePortID) bool {
	for _, d := range r.drains {
		if d.Service == id && d.Policy == bpf.PolicyRewrite {
			return true
		}
	}
	return false
}

// Pending reports whether failed work waits for a retry.
func (r *Reconciler) Pending() bool { return len(r.retryKeys) > 0 || len(r.retryServicePorts) > 0 }
