package daemon

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/draind/draind/bpf"
)

// reconciler holds what was written to the datapath and writes the minimal
// difference to what the model wants. Order keeps every reference valid at
// every instant: backend sets first, then entries that name them, then
// deletions of entries, then deletions of backend sets.
type reconciler struct {
	dp  Datapath
	ttl time.Duration

	frontends map[bpf.EndpointKey]bpf.Frontend
	bySPF     map[bpf.ServicePortID][]bpf.EndpointKey
	backends  map[bpf.ServicePortID]bpf.Backends
	drains    map[bpf.EndpointKey]bpf.Drain

	// retry holds what failed to apply: it is evaluated again next step.
	retryKeys map[bpf.EndpointKey]struct{}
	retrySPF  map[bpf.ServicePortID]struct{}

	onError func(what string, err error)
	// onDrain is told when a drain entry appears or goes.
	onDrain func(k bpf.EndpointKey, present bool)
}

func newReconciler(dp Datapath, ttl time.Duration) *reconciler {
	return &reconciler{
		dp: dp, ttl: ttl,
		frontends: map[bpf.EndpointKey]bpf.Frontend{},
		bySPF:     map[bpf.ServicePortID][]bpf.EndpointKey{},
		backends:  map[bpf.ServicePortID]bpf.Backends{},
		drains:    map[bpf.EndpointKey]bpf.Drain{},
		retryKeys: map[bpf.EndpointKey]struct{}{},
		retrySPF:  map[bpf.ServicePortID]struct{}{},
	}
}

// adopt seeds the applied state from the pinned maps of a previous draind,
// so the first full pass writes only differences and removes leftovers.
func (r *reconciler) adopt(d *bpf.Dump) {
	for _, f := range d.Frontends {
		r.frontends[f.Key] = f
		r.bySPF[f.Service] = append(r.bySPF[f.Service], f.Key)
	}
	for _, b := range d.Backends {
		r.backends[b.Service] = b
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

// apply writes the difference for the touched keys and service-ports (or
// for everything when full).
func (r *reconciler) apply(m *model, now time.Time, full bool) applyResult {
	var res applyResult
	fail := func(what string, err error) {
		res.Errors++
		if r.onError != nil {
			r.onError(what, err)
		}
	}
	spfs := m.touchedSPF
	keys := m.touched
	for id := range r.retrySPF {
		spfs[id] = struct{}{}
	}
	for k := range r.retryKeys {
		keys[k] = struct{}{}
	}
	clear(r.retrySPF)
	clear(r.retryKeys)
	if full {
		for id := range r.backends {
			spfs[id] = struct{}{}
		}
		for id := range r.bySPF {
			spfs[id] = struct{}{}
		}
		for id := range m.spfs {
			spfs[id] = struct{}{}
		}
		for k := range r.drains {
			keys[k] = struct{}{}
		}
		for k := range m.contribs {
			keys[k] = struct{}{}
		}
	}
	ids := make([]bpf.ServicePortID, 0, len(spfs))
	for id := range spfs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	type spfPlan struct {
		id  bpf.ServicePortID
		fes []bpf.Frontend
		be  *bpf.Backends
	}
	plans := make([]spfPlan, 0, len(ids))
	for _, id := range ids {
		fes, be := m.desiredSPF(id, now)
		plans = append(plans, spfPlan{id, fes, be})
	}

	// 1. Backend sets.
	for _, p := range plans {
		if p.be == nil {
			continue
		}
		cur, ok := r.backends[p.id]
		if ok && slices.Equal(cur.Backends, p.be.Backends) && !r.due(cur.Expires, p.be.Expires, now) {
			continue
		}
		res.Ops++
		if err := r.dp.SetBackends(*p.be); err != nil {
			fail(fmt.Sprintf("setting backends of service-port %d", p.id), err)
			r.retrySPF[p.id] = struct{}{}
			continue
		}
		r.backends[p.id] = bpf.Backends{Service: p.id, Backends: slices.Clone(p.be.Backends), Expires: p.be.Expires}
	}
	// 2. Frontends (upserts), remembering which of an id's are stale.
	type staleFrontend struct {
		key bpf.EndpointKey
		id  bpf.ServicePortID
	}
	var staleFE []staleFrontend
	for _, p := range plans {
		want := map[bpf.EndpointKey]bool{}
		for _, fe := range p.fes {
			want[fe.Key] = true
			cur, ok := r.frontends[fe.Key]
			if ok && cur.Service == fe.Service && cur.NoSteer == fe.NoSteer && !r.due(cur.Expires, fe.Expires, now) {
				continue
			}
			res.Ops++
			if err := r.dp.UpsertFrontend(fe); err != nil {
				fail("upserting frontend "+fe.Key.String(), err)
				r.retrySPF[p.id] = struct{}{}
				continue
			}
			if ok && cur.Service != fe.Service {
				r.bySPF[cur.Service] = slices.DeleteFunc(r.bySPF[cur.Service], func(k bpf.EndpointKey) bool { return k == fe.Key })
			}
			r.frontends[fe.Key] = fe
			if !slices.Contains(r.bySPF[p.id], fe.Key) {
				r.bySPF[p.id] = append(r.bySPF[p.id], fe.Key)
			}
		}
		for _, k := range r.bySPF[p.id] {
			if !want[k] {
				staleFE = append(staleFE, staleFrontend{k, p.id})
			}
		}
	}
	// 3. Drains (upserts).
	var staleDrains []bpf.EndpointKey
	sortedKeys := make([]bpf.EndpointKey, 0, len(keys))
	for k := range keys {
		sortedKeys = append(sortedKeys, k)
	}
	slices.SortFunc(sortedKeys, bpf.EndpointKey.Compare)
	for _, k := range sortedKeys {
		want, ok := m.desiredDrain(k, now)
		cur, have := r.drains[k]
		if !ok {
			if have {
				staleDrains = append(staleDrains, k)
			}
			continue
		}
		if have && cur.Service == want.Service && cur.Policy == want.Policy && !r.due(cur.Expires, want.Expires, now) {
			continue
		}
		res.Ops++
		if err := r.dp.UpsertDrain(want); err != nil {
			fail("upserting drain "+k.String(), err)
			r.retryKeys[k] = struct{}{}
			continue
		}
		r.drains[k] = want
		if !have && r.onDrain != nil {
			r.onDrain(k, true)
		}
	}
	// 4. Deletions of entries. A frontend that another service-port took
	// over in this pass (a restart under new ids, a VIP reassigned) is not
	// stale any more: deleting it would undo the write.
	for _, st := range staleFE {
		k := st.key
		if cur, ok := r.frontends[k]; !ok || cur.Service != st.id {
			r.dropFrontendRef(st.id, k)
			continue
		}
		res.Ops++
		if err := r.dp.DeleteFrontend(k); err != nil {
			fail("deleting frontend "+k.String(), err)
			r.retrySPF[st.id] = struct{}{}
			continue
		}
		delete(r.frontends, k)
		r.dropFrontendRef(st.id, k)
	}
	for _, k := range staleDrains {
		res.Ops++
		if err := r.dp.DeleteDrain(k); err != nil {
			fail("deleting drain "+k.String(), err)
			r.retryKeys[k] = struct{}{}
			continue
		}
		delete(r.drains, k)
		if r.onDrain != nil {
			r.onDrain(k, false)
		}
	}
	// 5. Backend sets nobody needs any more.
	for _, p := range plans {
		if p.be != nil || len(r.bySPF[p.id]) > 0 {
			continue
		}
		if _, ok := r.backends[p.id]; !ok {
			continue
		}
		if r.referenced(p.id) {
			continue
		}
		res.Ops++
		if err := r.dp.DeleteBackends(p.id); err != nil {
			fail(fmt.Sprintf("deleting backends of service-port %d", p.id), err)
			r.retrySPF[p.id] = struct{}{}
			continue
		}
		delete(r.backends, p.id)
	}
	clear(m.touched)
	clear(m.touchedSPF)
	return res
}

// dropFrontendRef forgets that service-port id owns frontend k.
func (r *reconciler) dropFrontendRef(id bpf.ServicePortID, k bpf.EndpointKey) {
	r.bySPF[id] = slices.DeleteFunc(r.bySPF[id], func(x bpf.EndpointKey) bool { return x == k })
	if len(r.bySPF[id]) == 0 {
		delete(r.bySPF, id)
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
func (r *reconciler) pending() bool { return len(r.retryKeys) > 0 || len(r.retrySPF) > 0 }

// isMapFull reports whether err is a full-map error.
func isMapFull(err error) bool { return errors.Is(err, bpf.ErrMapFull) }
