package model

import (
	"slices"
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
// comes, and the candidate is dropped after VanishWait. A vanished endpoint
// drains for one pass (reason "vanished": the VIP is steered to the
// selectable endpoints, the pod IP gets the Service's policy) and departs
// from the next: it lingers like any departed endpoint, until --linger ends
// or another pod claims the IP. If the gone Lease comes first, the pod is
// still listed and drains, then departs, the usual way.
//
// Only pods vanish: endpoints with a Pod targetRef in trusted slices (see
// k8s.Slice.Trusted); the others are left alone.

// VanishedEndpoint is one endpoint a slice update dropped while it was
// ready.
type VanishedEndpoint struct {
	Service  string // namespace/name
	Key      bpf.EndpointKey
	PortName string
	Family   k8s.Family
	UID      types.UID
	Pod      string // namespace/name
	At       time.Time
	// Restored: a departure a restart brings back from the pinned maps;
	// it departs once its pod has a drain, gone or not.
	Restored bool
}

// VanishWait is how long a candidate waits for its pod's gone Lease.
const VanishWait = 10 * time.Second

// vanishState is the model's part (runner goroutine).
type vanishState struct {
	pending map[string][]VanishedEndpoint // by Service, until its next recompute
	// markedGen is the model's podDrainsGen at markVanished's last look at
	// pending, and pendingEnd the earliest end of a candidate's wait
	// (at+VanishWait) since (zero: none): a pass looks again only when a
	// pod drain changed (a candidate's pod may be gone now) or a wait
	// ended. A rebalance leaves thousands of candidates for VanishWait,
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
	v.pending = map[string][]VanishedEndpoint{}
	v.revisit = map[string]struct{}{}
	v.services = map[types.UID]vanishedServices{}
}

// AddVanished queues candidates until their pod is known gone. Their
// Services are recomputed (their slices changed): those whose pod is gone
// already are steered there (withVanished).
func (m *Model) AddVanished(eps []VanishedEndpoint) {
	for _, e := range eps {
		m.vanish.queue(e)
	}
}

func (v *vanishState) queue(e VanishedEndpoint) {
	v.pending[e.Service] = append(v.pending[e.Service], e)
	v.notePendingEnd(e.At.Add(VanishWait))
}

func (v *vanishState) notePendingEnd(end time.Time) {
	if v.pendingEnd.IsZero() || end.Before(v.pendingEnd) {
		v.pendingEnd = end
	}
}

// goneDrain reports whether the pod has a pod drain that says it is gone.
func (m *Model) goneDrain(uid types.UID) bool {
	pd := m.podDrains[uid]
	return pd != nil && pd.State == StateGone
}

// vanishes reports whether e may depart now: its pod is known gone (or,
// restored, drains).
func (m *Model) vanishes(e VanishedEndpoint) bool {
	return m.goneDrain(e.UID) || (e.Restored && m.podDrains[e.UID] != nil)
}

// MarkVanished adds to dirty the Services with a candidate whose pod is
// now known gone (its Lease may arrive after the slice update, and a pod
// drain of a pod no slice lists recomputes no Service), and drops
// candidates that waited too long. Both can change only when the pod
// drains did or the earliest wait ended: other passes do nothing here.
func (m *Model) MarkVanished(dirty map[string]time.Time, at, now time.Time) {
	v := &m.vanish
	if len(v.pending) == 0 || (v.markedGen == m.podDrainsGen && now.Before(v.pendingEnd)) {
		return
	}
	v.markedGen, v.pendingEnd = m.podDrainsGen, time.Time{}
	for svc, pend := range v.pending {
		kept := pend[:0]
		for _, e := range pend {
			if end := e.At.Add(VanishWait); now.Before(end) {
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
func (m *Model) withVanished(key string, svc *k8s.Service, cat categorized, now time.Time) categorized {
	pend := m.vanish.pending[key]
	delete(m.vanish.pending, key)
	if svc == nil || len(pend) == 0 || m.cfg.Linger <= 0 {
		return cat
	}
	old := m.results[key]
	for _, v := range pend {
		if _, listed := cat.listed.podOf(v.Key); listed {
			continue // listed again: moved between slices, or back
		}
		if !m.vanishes(v) {
			m.vanish.queue(v) // not (yet) known gone
			continue
		}
		if old != nil {
			if c, ok := old.drainingAt(v.Key); ok && c.uid == v.UID && c.kind != 0 {
				continue // it was draining: it departs the usual way
			}
		}
		if m.claims.ClaimedByOther(v.Key.Addr, v.UID) {
			continue
		}
		spk := servicePortKey{Service: key, Port: v.PortName, Proto: v.Key.Proto, Family: v.Family}
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
		if slices.ContainsFunc(c.draining, func(e drainingEndpoint) bool { return e.key == v.Key }) {
			continue
		}
		reason := ReasonVanished
		if v.Restored {
			reason = ReasonDeparted
		}
		c.draining = append(c.draining, drainingEndpoint{key: v.Key, uid: v.UID, pod: v.Pod, reason: reason, identified: true})
		// Listed for this pass: the pod drain's all-ports entries take the
		// Service's policy into account (a gone headless pod is not refused).
		cat.addDrainedPod(v.UID)
		slices.SortFunc(c.draining, func(a, b drainingEndpoint) int { return a.key.Compare(b.key) })
		m.vanish.revisit[key] = struct{}{}
		rec := m.vanish.services[v.UID]
		if !slices.Contains(rec.keys, key) {
			rec.keys = append(rec.keys, key)
		}
		rec.until = now.Add(m.cfg.Linger)
		m.vanish.services[v.UID] = rec
		if m.vanish.servicesEnd.IsZero() || rec.until.Before(m.vanish.servicesEnd) {
			m.vanish.servicesEnd = rec.until
		}
		m.notesGen++
	}
	return cat
}

// ForgetVanishedServices forgets the Services of vanished pods whose
// linger ended, once the earliest did (each pass).
func (m *Model) ForgetVanishedServices(now time.Time) {
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
			if k8s.FamilyOf(vip) == spk.Family {
				c.frontends = append(c.frontends, bpf.EndpointKey{Addr: vip, Port: sp.Port, Proto: sp.Protocol})
			}
		}
		return c, true
	}
	return servicePortEndpoints{}, false
}

// TakeRevisit returns the Services whose vanished endpoints must depart in
// the next pass.
func (m *Model) TakeRevisit() []string {
	out := make([]string, 0, len(m.vanish.revisit))
	for k := range m.vanish.revisit {
		out = append(out, k)
	}
	clear(m.vanish.revisit)
	slices.Sort(out)
	return out
}

// vanishedServicesOf returns the Services that listed a vanished pod.
func (m *Model) vanishedServicesOf(uid types.UID) []string { return m.vanish.services[uid].keys }
