package daemon

import (
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// Endpoints that vanish without draining.
//
// A pod deleted without grace (a force delete) goes from ready straight to
// absent in its EndpointSlice: it never drains, so it never departs, and
// kube-proxy keeps its DNAT rule to the dead address until its next sync
// (0.1-1 s, seconds at scale). A client that reconnects through the
// ClusterIP in that window sends its SYN into a dead address, and its
// retransmissions follow the same conntrack entry: the connect hangs.
//
// An endpoint that left its slices while ready is a candidate; it vanished
// once its pod is gone, as the node hosting it says (a drain Lease with
// state gone, package gonepeers). A pod that only left its Service (a label
// change) or a slice that was rebalanced never vanishes: no gone Lease
// comes, and the candidate is dropped after vanishWait. A vanished endpoint
// drains for one pass (reason "vanished": the VIP is steered to the
// selectable endpoints, the pod IP gets the Service's policy) and departs
// from the next: it lingers like any departed endpoint, until --linger ends
// or another pod claims the IP. If the gone Lease comes first, the pod is
// still listed and drains, then departs, the usual way.
//
// Only pods vanish: endpoints with a Pod targetRef in trusted slices (see
// k8s.Slice.Trusted); the others are left alone.

// vanishedEndpoint is one endpoint a slice update dropped while it was
// ready.
type vanishedEndpoint struct {
	service  string // namespace/name
	key      bpf.EndpointKey
	portName string
	family   k8s.Family
	uid      types.UID
	pod      string // namespace/name
	at       time.Time
	// restored: a departure a restart brings back from the pinned maps
	// (restart.go); it departs once its pod has a drain, gone or not.
	restored bool
}

// vanishIntake collects vanished endpoints from slice events (informer
// goroutines) for the next pass.
type vanishIntake struct {
	mu      sync.Mutex
	pending []vanishedEndpoint
}

// observe records the endpoints that were ready in old and are not listed
// (in any condition) in cur.
func (v *vanishIntake) observe(old, cur *k8s.Slice, now time.Time) {
	if old == nil || old.Service == "" {
		return
	}
	// It runs on every slice event: no allocation unless one vanished. A
	// slice is small (at most 1,000 endpoints, usually tens) and an update
	// usually keeps its endpoints in place, so look there first.
	listed := func(i int) bool {
		if cur == nil {
			return false
		}
		addr, pod := old.Addr(i), old.PodKey(i)
		if i < cur.Len() && cur.Addr(i) == addr && cur.PodKey(i) == pod {
			return true
		}
		for j := range cur.Len() {
			if cur.Addr(j) == addr && cur.PodKey(j) == pod {
				return true
			}
		}
		return false
	}
	var out []vanishedEndpoint
	for i := range old.Len() {
		if !old.Ready(i) || !old.HasPod(i) || listed(i) {
			continue
		}
		e := old.Endpoint(i)
		for _, p := range old.Ports {
			out = append(out, vanishedEndpoint{service: old.Namespace + "/" + old.Service,
				key: bpf.EndpointKey{Addr: e.Addr, Port: p.Port, Proto: p.Protocol}, portName: p.Name,
				family: old.Family, uid: e.PodUID, pod: old.Namespace + "/" + e.PodName, at: now})
		}
	}
	if len(out) == 0 {
		return
	}
	v.mu.Lock()
	v.pending = append(v.pending, out...)
	v.mu.Unlock()
}

// add queues eps as if slice events had dropped them.
func (v *vanishIntake) add(eps []vanishedEndpoint) {
	if len(eps) == 0 {
		return
	}
	v.mu.Lock()
	v.pending = append(v.pending, eps...)
	v.mu.Unlock()
}

func (v *vanishIntake) take() []vanishedEndpoint {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.pending
	v.pending = nil
	return out
}

// vanishWait is how long a candidate waits for its pod's gone Lease.
const vanishWait = 10 * time.Second

// vanishState is the model's part (runner goroutine).
type vanishState struct {
	pending map[string][]vanishedEndpoint // by Service, until its next recompute
	// markedGen is the model's podDrainsGen at markVanished's last look at
	// pending, and pendingEnd the earliest end of a candidate's wait
	// (at+vanishWait) since (zero: none): a pass looks again only when a
	// pod drain changed (a candidate's pod may be gone now) or a wait
	// ended. A rebalance leaves thousands of candidates for vanishWait,
	// and a pass runs for every slice update. Invariant: while markedGen is
	// podDrainsGen and pendingEnd has not passed, marking pending again
	// finds nothing new. Checked by FuzzSequenceDifferential.
	markedGen  uint64
	pendingEnd time.Time
	revisit    map[string]struct{} // Services to recompute next pass
	// services remembers which Services listed a vanished pod (its
	// opt-out of ending sockets) until its linger would end; servicesEnd
	// is the earliest such end (zero: none), so that the Services
	// recomputed before then do not walk them.
	services    map[types.UID]vanishedServices
	servicesEnd time.Time
}

type vanishedServices struct {
	keys  []string
	until time.Time
}

func (v *vanishState) init() {
	v.pending = map[string][]vanishedEndpoint{}
	v.revisit = map[string]struct{}{}
	v.services = map[types.UID]vanishedServices{}
}

// addVanished queues candidates until their pod is known gone. Their
// Services are recomputed (their slices changed): those whose pod is gone
// already are steered there (withVanished).
func (m *model) addVanished(eps []vanishedEndpoint) {
	for _, e := range eps {
		m.vanish.queue(e)
	}
}

func (v *vanishState) queue(e vanishedEndpoint) {
	v.pending[e.service] = append(v.pending[e.service], e)
	v.notePendingEnd(e.at.Add(vanishWait))
}

func (v *vanishState) notePendingEnd(end time.Time) {
	if v.pendingEnd.IsZero() || end.Before(v.pendingEnd) {
		v.pendingEnd = end
	}
}

// goneDrain reports whether the pod has a pod drain that says it is gone.
func (m *model) goneDrain(uid types.UID) bool {
	pd := m.podDrains[uid]
	return pd != nil && pd.State == StateGone
}

// vanishes reports whether e may depart now: its pod is known gone (or,
// restored, drains).
func (m *model) vanishes(e vanishedEndpoint) bool {
	return m.goneDrain(e.uid) || (e.restored && m.podDrains[e.uid] != nil)
}

// markVanished adds to dirty the Services with a candidate whose pod is
// now known gone (its Lease may arrive after the slice update, and a pod
// drain of a pod no slice lists recomputes no Service), and drops
// candidates that waited too long. Both can change only when the pod
// drains did or the earliest wait ended: other passes do nothing here.
func (m *model) markVanished(dirty map[string]time.Time, at, now time.Time) {
	v := &m.vanish
	if len(v.pending) == 0 || (v.markedGen == m.podDrainsGen && now.Before(v.pendingEnd)) {
		return
	}
	v.markedGen, v.pendingEnd = m.podDrainsGen, time.Time{}
	for svc, pend := range v.pending {
		kept := pend[:0]
		for _, e := range pend {
			if end := e.at.Add(vanishWait); now.Before(end) {
				kept = append(kept, e)
				v.notePendingEnd(end)
			}
		}
		if len(kept) == 0 {
			delete(v.pending, svc)
			continue
		}
		v.pending[svc] = kept
		if slices.ContainsFunc(kept, m.vanishes) {
			if t, ok := dirty[svc]; !ok || at.Before(t) {
				dirty[svc] = at
			}
		}
	}
}

// pendingUID reports whether a vanished pod's Services are still on record.
func (v *vanishState) pendingUID(uid types.UID) bool {
	_, ok := v.services[uid]
	return ok
}

// withVanished adds the Service's vanished endpoints to its categorisation
// as draining (reason vanished), and asks for the Service to be recomputed
// in the next pass, where they depart. Candidates whose pod is not known
// gone yet wait.
func (m *model) withVanished(key string, svc *k8s.Service, cat categorized, now time.Time) categorized {
	pend := m.vanish.pending[key]
	delete(m.vanish.pending, key)
	if svc == nil || len(pend) == 0 || m.cfg.Linger <= 0 {
		return cat
	}
	old := m.results[key]
	for _, v := range pend {
		if _, listed := cat.listed.podOf(v.key); listed {
			continue // listed again: moved between slices, or back
		}
		if !m.vanishes(v) {
			m.vanish.queue(v) // not (yet) known gone
			continue
		}
		if old != nil {
			if c, ok := old.drainingAt(v.key); ok && c.uid == v.uid && c.kind != 0 {
				continue // it was draining: it departs the usual way
			}
		}
		if m.claims.claimedByOther(v.key.Addr, v.uid) {
			continue
		}
		spk := servicePortKey{Service: key, Port: v.portName, Proto: v.key.Proto, Family: v.family}
		i := slices.IndexFunc(cat.servicePorts, func(c servicePortEndpoints) bool { return c.key == spk })
		if i < 0 {
			c, ok := emptyServicePort(svc, spk)
			if !ok {
				continue // the Service has no such port any more
			}
			cat.servicePorts = append(cat.servicePorts, c)
			i = len(cat.servicePorts) - 1
		}
		c := &cat.servicePorts[i]
		if slices.ContainsFunc(c.draining, func(e drainingEndpoint) bool { return e.key == v.key }) {
			continue
		}
		reason := ReasonVanished
		if v.restored {
			reason = ReasonDeparted
		}
		c.draining = append(c.draining, drainingEndpoint{key: v.key, uid: v.uid, pod: v.pod, reason: reason, identified: true})
		// Listed for this pass: the pod drain's all-ports entries take the
		// Service's policy into account (a gone headless pod is not refused).
		cat.addDrainedPod(v.uid)
		slices.SortFunc(c.draining, func(a, b drainingEndpoint) int { return a.key.Compare(b.key) })
		m.vanish.revisit[key] = struct{}{}
		rec := m.vanish.services[v.uid]
		if !slices.Contains(rec.keys, key) {
			rec.keys = append(rec.keys, key)
		}
		rec.until = now.Add(m.cfg.Linger)
		m.vanish.services[v.uid] = rec
		if m.vanish.servicesEnd.IsZero() || rec.until.Before(m.vanish.servicesEnd) {
			m.vanish.servicesEnd = rec.until
		}
		m.notesGen++
	}
	return cat
}

// forgetVanishedServices forgets the Services of vanished pods whose
// linger ended, once the earliest did (each pass).
func (m *model) forgetVanishedServices(now time.Time) {
	v := &m.vanish
	if v.servicesEnd.IsZero() || now.Before(v.servicesEnd) {
		return
	}
	v.servicesEnd = time.Time{}
	for uid, s := range v.services {
		if !now.Before(s.until) {
			delete(v.services, uid)
			m.notesGen++
		} else if v.servicesEnd.IsZero() || s.until.Before(v.servicesEnd) {
			v.servicesEnd = s.until
		}
	}
}

// emptyServicePort is the categorisation of a service-port whose endpoints
// all vanished: its frontends, nothing selectable.
func emptyServicePort(svc *k8s.Service, spk servicePortKey) (servicePortEndpoints, bool) {
	for _, sp := range svc.Ports {
		if sp.Name != spk.Port || sp.Protocol != spk.Proto {
			continue
		}
		c := servicePortEndpoints{key: spk}
		for _, vip := range svc.ClusterIPs {
			if familyOf(vip) == spk.Family {
				c.frontends = append(c.frontends, bpf.EndpointKey{Addr: vip, Port: sp.Port, Proto: sp.Protocol})
			}
		}
		return c, true
	}
	return servicePortEndpoints{}, false
}

// takeRevisit returns the Services whose vanished endpoints must depart in
// the next pass.
func (m *model) takeRevisit() []string {
	out := make([]string, 0, len(m.vanish.revisit))
	for k := range m.vanish.revisit {
		out = append(out, k)
	}
	clear(m.vanish.revisit)
	slices.Sort(out)
	return out
}

// vanishedServicesOf returns the Services that listed a vanished pod.
func (m *model) vanishedServicesOf(uid types.UID) []string { return m.vanish.services[uid].keys }

// revisitVanished schedules the next pass for the Services whose vanished
// endpoints drained in this one (runner goroutine, model held).
func (d *Daemon) revisitVanished(now time.Time) {
	keys := d.model.takeRevisit()
	for _, k := range keys {
		d.tracker.markService(k, now)
	}
	if len(keys) > 0 {
		d.runner.Run()
	}
}
