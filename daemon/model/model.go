package model

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/internal/backendset"
	"github.com/draind/draind/k8s"
)

// The model: what is draining. It turns the cached Kubernetes state into
// the desired drain entries and service-ports, incrementally: a pass
// recomputes only the Services and pods that changed (categorize.go decides
// per Service), records what each contributes (contributions.go), and the
// reconciler merges only the entry keys they touched (desired.go).

// State is the cached Kubernetes state the model reads (*k8s.Informers).
type State interface {
	Service(key string) *k8s.Service
	SlicesOf(key string) []*k8s.Slice
	SlicesInNamespace(ns string) []*k8s.Slice
	DrainLeases() []*k8s.DrainLease
	LocalPods() []*k8s.Pod
}

var _ State = (*k8s.Informers)(nil)

// Drain reasons of endpoints (pod-level reasons come from k8s.Reason*).
const (
	ReasonTerminating = "terminating"
	ReasonNotReady    = "not-ready"
	ReasonDeparted    = "departed" // gone from every slice, lingering
	// ReasonVanished: a pod that left its node without draining (force
	// deleted, or deleted while draind was not looking), or an endpoint
	// that left its slices so (vanish.go).
	ReasonVanished = "vanished"
)

// StateGone is the state a hosting node publishes (a drain Lease's, this
// node's own drain's) for a pod that was deleted: its IP is steered.
const StateGone = "gone"

// Config holds the model's tunables.
type Config struct {
	Node string
	// Zone is the node's topology.kubernetes.io/zone label ("": none):
	// steering picks from the backends kube-proxy would pick here.
	Zone string
	// EntryTTL bounds every steering entry's life: if draind stops, steering
	// stops by itself within it. Entries are refreshed at half of it.
	EntryTTL time.Duration
	// Linger keeps a departed endpoint's IP steered (stale registry caches).
	Linger time.Duration
	// RegistryOnlyPolicy applies to drained pods that no EndpointSlice
	// lists: there is no alternative to rewrite to.
	RegistryOnlyPolicy bpf.Policy
	// OnPolicyWarning is told once per Service and bad annotation value.
	OnPolicyWarning func(service, value string)
}

// servicePort is an active service-port: it has draining endpoints, or
// departed ones still lingering on its id.
type servicePort struct {
	key        servicePortKey
	id         bpf.ServicePortID
	frontends  []bpf.EndpointKey
	noSteer    bool
	selectable backendset.Set
	refs       int // contributions naming this id
}

// serviceResult is what one Service last contributed. One is kept per
// Service with a draining endpoint (thousands while a large cluster rolls
// out), so its parts are slices, not maps: a Go map costs a group of eight
// slots however few entries it holds.
type serviceResult struct {
	servicePorts []servicePortRef  // its active service-ports (a handful)
	keys         []bpf.EndpointKey // keys its service-ports contributed to
	// draining endpoints with their identity (for departure detection),
	// sorted by key, once each.
	draining []drainingContribution
	pods     map[types.UID]struct{} // drained pods listed by this Service
}

// servicePortRef is an active service-port of a Service and its id.
type servicePortRef struct {
	key servicePortKey
	id  bpf.ServicePortID
}

// drainingContribution is a draining endpoint's contribution.
type drainingContribution struct {
	key bpf.EndpointKey
	c   contribution
}

// servicePortID returns the id of the Service's service-port k.
func (r *serviceResult) servicePortID(k servicePortKey) (bpf.ServicePortID, bool) {
	for _, sp := range r.servicePorts {
		if sp.key == k {
			return sp.id, true
		}
	}
	return 0, false
}

// drainingAt returns the contribution of draining endpoint k.
func (r *serviceResult) drainingAt(k bpf.EndpointKey) (contribution, bool) {
	i, ok := slices.BinarySearchFunc(r.draining, k, func(d drainingContribution, k bpf.EndpointKey) int { return d.key.Compare(k) })
	if !ok {
		return contribution{}, false
	}
	return r.draining[i].c, true
}

// sortDraining sorts the draining endpoints by key; of an endpoint two
// service-ports contributed (two ports with one target port), the last
// contribution is kept.
func (r *serviceResult) sortDraining() {
	slices.SortStableFunc(r.draining, func(a, b drainingContribution) int { return a.key.Compare(b.key) })
	out := r.draining[:0]
	for i, d := range r.draining {
		if i+1 < len(r.draining) && r.draining[i+1].key == d.key {
			continue
		}
		out = append(out, d)
	}
	r.draining = slices.Clip(out)
}

// departure is an endpoint that left every slice of a Service while
// draining.
type Departure struct {
	Key     bpf.EndpointKey
	UID     types.UID
	Service string // namespace/name
	GoneAt  time.Time
}

// model holds what is draining; one goroutine (the runner's) owns it.
//
// It is an incremental cache of the State. Invariant: after a pass, its
// results, contributions, service-ports and pod drains are what computing
// every Service and pod drain afresh from the State gives, but for the
// lingering entries (what it saw depart, by definition history). A pass
// keeps it so by recomputing the Services the tracker marks and those
// listing a changed pod drain. Checked by FuzzSequenceDifferential.
type Model struct {
	cfg    Config
	state  State
	claims *Claims

	results        map[string]*serviceResult
	servicePortIDs map[servicePortKey]bpf.ServicePortID
	servicePorts   map[bpf.ServicePortID]*servicePort
	contributions  map[bpf.EndpointKey][]contribution
	// byIP lists the keys of each IP that have contributions: usually
	// one or two (a slice of them, not a map: a map costs a group of
	// eight slots however few it holds).
	byIP      map[netip.Addr][]bpf.EndpointKey
	lingering map[bpf.EndpointKey]*lingerRecord
	// lingerKeys: the lingering keys of each service-port; lingerByPod:
	// of each pod; lingerQueue: every lingering record by its end
	// (lingering.go).
	lingerKeys  map[bpf.ServicePortID][]bpf.EndpointKey
	lingerByPod map[types.UID][]bpf.EndpointKey
	lingerQueue lingerQueue
	podDrains   map[types.UID]*PodDrain
	// podDrainsGen changes whenever setPodDrains replaces podDrains;
	// notesGen whenever podDrains, listings or vanish.services change (what
	// the gone peers note of the pod drains, through goneView). Invariant:
	// a reader that keeps what it derived from those
	// (podDrainsState.modelGen, vanishState.markedGen,
	// gonepeers.Peers.noted) with the generation it read may reuse it while
	// the generation is the same. Checked by FuzzSequenceDifferential.
	podDrainsGen, notesGen uint64
	podDrainsEnd           time.Time // the earliest end of a pod drain (zero: none)
	// drainsByPod holds podDrains by the key slices compare pods by.
	drainsByPod map[k8s.PodKey]*PodDrain
	listings    map[types.UID]map[string]struct{} // drained pod -> Services listing it
	// listedPolicy is the most cautious policy of the Services that listed
	// a drained pod: its all-ports entries keep it after the pod left them
	// (a gone headless pod is not refused).
	listedPolicy map[types.UID]bpf.Policy
	// scratch is categorize's (recomputeService reads a categorisation
	// only while it runs).
	scratch catScratch
	ids     serviceIDs
	warned  map[string]string // Service -> the bad annotation value last warned about

	touched             map[bpf.EndpointKey]struct{}
	touchedServicePorts map[bpf.ServicePortID]struct{}
	departures          []Departure // since the last pass (conntrack, lease cleanup)
	vanish              vanishState // endpoints that left without draining (sockets_vanish.go)
}

func New(cfg Config, st State, cl *Claims) *Model {
	m := &Model{
		cfg: cfg, state: st, claims: cl,
		results:             map[string]*serviceResult{},
		servicePortIDs:      map[servicePortKey]bpf.ServicePortID{},
		servicePorts:        map[bpf.ServicePortID]*servicePort{},
		contributions:       map[bpf.EndpointKey][]contribution{},
		byIP:                map[netip.Addr][]bpf.EndpointKey{},
		lingering:           map[bpf.EndpointKey]*lingerRecord{},
		lingerKeys:          map[bpf.ServicePortID][]bpf.EndpointKey{},
		lingerByPod:         map[types.UID][]bpf.EndpointKey{},
		podDrains:           map[types.UID]*PodDrain{},
		listings:            map[types.UID]map[string]struct{}{},
		listedPolicy:        map[types.UID]bpf.Policy{},
		warned:              map[string]string{},
		touched:             map[bpf.EndpointKey]struct{}{},
		touchedServicePorts: map[bpf.ServicePortID]struct{}{},
	}
	m.vanish.init()
	return m
}

// policyOf resolves a Service's pod-IP policy, warning once per bad value.
func (m *Model) policyOf(svc *k8s.Service) bpf.Policy {
	def := bpf.PolicyRewrite
	if svc.Headless {
		def = bpf.PolicyOff
	}
	key := svc.Namespace + "/" + svc.Name
	if svc.PodIPSteering == "" {
		delete(m.warned, key)
		return def
	}
	p, err := bpf.ParsePolicy(svc.PodIPSteering)
	if err != nil {
		if m.warned[key] != svc.PodIPSteering {
			m.warned[key] = svc.PodIPSteering
			if m.cfg.OnPolicyWarning != nil {
				m.cfg.OnPolicyWarning(key, svc.PodIPSteering)
			}
		}
		return def
	}
	delete(m.warned, key)
	return p
}

// RecomputeService recomputes one Service and updates the contributions,
// active service-ports and lingering entries it owns. It reports whether
// anything it contributes changed.
func (m *Model) RecomputeService(key string, now time.Time) (changed bool) {
	old := m.results[key]
	svc := m.state.Service(key)
	var cat categorized
	policy := bpf.PolicyOff
	if svc != nil {
		cat = categorize(svc, m.state.SlicesOf(key), m.drainsByPod, place{m.cfg.Node, m.cfg.Zone}, &m.scratch)
		policy = m.policyOf(svc)
	} else {
		delete(m.warned, key)
	}
	cat = m.withVanished(key, svc, cat, now)
	m.withdrawService(old)
	next := &serviceResult{pods: cat.drainedPods}
	for _, c := range cat.servicePorts {
		if m.activate(next, c, svc.AffinityClientIP, policy, old, now) {
			changed = true
		}
	}
	next.sortDraining()
	m.updateListings(key, old, next, policy)
	if m.lingerDeparted(key, old, next, cat.listed, now) {
		changed = true
	}
	if m.keepLingering(old, next, cat, svc) {
		changed = true
	}
	if m.endLingersListedAgain(next, cat.listed) {
		changed = true
	}
	if old != nil {
		for _, k := range old.keys {
			m.forgetIfEmpty(k)
		}
		for _, sp := range old.servicePorts {
			if _, ok := next.servicePortID(sp.key); !ok {
				m.releaseIfUnused(sp.id)
			}
		}
		changed = changed || len(old.keys) > 0
	}
	changed = changed || len(next.keys) > 0
	clear(cat.listed) // the scratch keeps no pod (a textual UID keeps its slice's text)
	if len(next.servicePorts) == 0 {
		delete(m.results, key)
	} else {
		m.results[key] = next
	}
	return changed
}

// withdrawService removes what a Service contributed in its last result.
//
// The keys it empties stay (with their room and their place in byIP): the
// Service usually contributes to the same keys again at once.
// RecomputeService forgets those it did not (forgetIfEmpty).
func (m *Model) withdrawService(old *serviceResult) {
	if old == nil {
		return
	}
	for _, k := range old.keys {
		m.dropContributions(k, func(c contribution) bool {
			if c.kind != fromServicePort {
				return false
			}
			id, ok := old.servicePortID(m.keyOf(c.servicePort))
			return ok && id == c.servicePort
		})
	}
}

// activate makes a service-port with draining endpoints (or lingering ones
// on its id) active, and contributes its draining endpoints. It reports
// whether the service-port's frontends or backends changed.
func (m *Model) activate(next *serviceResult, c servicePortEndpoints, noSteer bool, policy bpf.Policy, old *serviceResult, now time.Time) (changed bool) {
	id, hasID := m.servicePortIDs[c.key]
	lingerRefs := hasID && m.servicePorts[id] != nil && m.servicePorts[id].refs > 0
	if len(c.draining) == 0 && !lingerRefs {
		return false
	}
	if !hasID {
		draining := make([]bpf.EndpointKey, len(c.draining))
		for i, e := range c.draining {
			draining[i] = e.key
		}
		id = m.ids.alloc(c.frontends, draining, c.selectable, m.servicePorts)
		m.servicePortIDs[c.key] = id
		m.servicePorts[id] = &servicePort{key: c.key, id: id}
	}
	changed = m.updateServicePort(m.servicePorts[id], c, noSteer)
	next.servicePorts = append(next.servicePorts, servicePortRef{c.key, id})
	for _, e := range c.draining {
		since := now
		if old != nil {
			if prev, ok := old.drainingAt(e.key); ok && prev.uid == e.uid {
				since = prev.since
			}
		}
		ct := contribution{kind: fromServicePort, uid: e.uid, pod: e.pod, servicePort: id,
			policy: policy, reason: e.reason, since: since, expires: e.expires, frontendOnly: !e.identified}
		m.addContribution(e.key, ct)
		next.draining = append(next.draining, drainingContribution{e.key, ct})
		next.keys = append(next.keys, e.key)
	}
	return changed
}

// updateServicePort sets an active service-port's frontends and selectable
// endpoints to c's, and reports whether they changed.
func (m *Model) updateServicePort(sp *servicePort, c servicePortEndpoints, noSteer bool) bool {
	selectable := backendset.Pack(c.selectable)
	if sp.selectable == selectable && slices.Equal(sp.frontends, c.frontends) && sp.noSteer == noSteer {
		return false
	}
	m.touchedServicePorts[sp.id] = struct{}{}
	// Policy downgrades of lingering entries depend on selectable.
	for _, k := range m.lingerKeys[sp.id] {
		m.touch(k)
	}
	sp.selectable, sp.frontends, sp.noSteer = selectable, c.frontends, noSteer
	return true
}

// keepLingering keeps in next the service-ports of old that activate did
// not take but lingering entries still refer to (their endpoints departed
// in this very update, or the Service lists none there any more), with
// what the Service selects there now: a linger rewrites to it. It reports
// whether any changed.
func (m *Model) keepLingering(old, next *serviceResult, cat categorized, svc *k8s.Service) (changed bool) {
	if old == nil {
		return false
	}
	noSteer := svc != nil && svc.AffinityClientIP
	for _, ref := range old.servicePorts {
		sp := m.servicePorts[ref.id]
		if _, taken := next.servicePortID(ref.key); taken || sp == nil || sp.key != ref.key || sp.refs == 0 {
			continue
		}
		c := servicePortEndpoints{key: ref.key} // none listed
		if i := slices.IndexFunc(cat.servicePorts, func(e servicePortEndpoints) bool { return e.key == ref.key }); i >= 0 {
			c = cat.servicePorts[i]
		}
		changed = m.updateServicePort(sp, c, noSteer) || changed
		next.servicePorts = append(next.servicePorts, ref)
	}
	return changed
}

// updateListings records which drained pods the Service lists now: their
// all-ports entries change with it.
func (m *Model) updateListings(key string, old, next *serviceResult, policy bpf.Policy) {
	for uid := range next.pods {
		if p, ok := m.listedPolicy[uid]; !ok || policy > p {
			m.listedPolicy[uid] = policy
		}
		m.setListing(uid, key, true)
	}
	if old == nil {
		return
	}
	for uid := range old.pods {
		if _, ok := next.pods[uid]; !ok {
			m.setListing(uid, key, false)
		}
	}
}

// lingerDeparted lets endpoints that drained and are now gone from every
// slice of the Service linger, so stale callers are still steered away,
// and records their departure. It reports whether any departed.
//
// A Service that is itself deleted departs nothing: its slices go with it
// (`kubectl delete -f` deletes a Service and its pods together), so its
// leaving says nothing of its pods, which may still be serving their
// connections through their grace period. Their addresses are not
// lingered, and their TCP flows are not expired.
func (m *Model) lingerDeparted(svc string, old, next *serviceResult, listed listedEndpoints, now time.Time) (departed bool) {
	if old == nil || m.state.Service(svc) == nil {
		return false
	}
	for _, d := range old.draining {
		k, prev := d.key, d.c
		if _, still := next.drainingAt(k); still || prev.frontendOnly {
			continue
		}
		if listedNotDraining(next, listed, k, prev.uid) {
			continue // listed again, ready: no longer draining
		}
		departed = true
		m.departures = append(m.departures, Departure{Key: k, UID: prev.uid, Service: svc, GoneAt: now})
		if prev.policy == bpf.PolicyOff || m.cfg.Linger <= 0 || m.suppressed(prev, k.Addr) {
			continue
		}
		lc := prev
		lc.kind, lc.reason = fromLinger, ReasonDeparted
		m.setLinger(k, &lingerRecord{c: lc, until: now.Add(m.cfg.Linger)})
	}
	return departed
}

// endLingersListedAgain ends the lingering entries of next's service-ports
// whose pod the Service lists again at that key, not draining: the
// EndpointSlice controller moved it between slices in two updates (a pass
// between them saw it leave every slice), and it is ready. It reports
// whether any ended.
func (m *Model) endLingersListedAgain(next *serviceResult, listed listedEndpoints) (ended bool) {
	for _, ref := range next.servicePorts {
		for _, k := range slices.Clone(m.lingerKeys[ref.id]) { // clearLinger edits it
			if listedNotDraining(next, listed, k, m.lingering[k].c.uid) {
				m.clearLinger(k)
				ended = true
			}
		}
	}
	return ended
}

// listedNotDraining reports whether next's Service lists pod uid at k (in
// listed, its listings) and does not drain it there.
func listedNotDraining(next *serviceResult, listed listedEndpoints, k bpf.EndpointKey, uid types.UID) bool {
	if _, draining := next.drainingAt(k); draining {
		return false
	}
	pod, ok := listed.podOf(k)
	return ok && pod == k8s.PodKeyOf(uid)
}

func (m *Model) keyOf(id bpf.ServicePortID) servicePortKey {
	if sp := m.servicePorts[id]; sp != nil {
		return sp.key
	}
	return servicePortKey{}
}

// releaseIfUnused deactivates a service-port nothing refers to any more.
func (m *Model) releaseIfUnused(id bpf.ServicePortID) {
	sp := m.servicePorts[id]
	if sp == nil || sp.refs > 0 {
		return
	}
	delete(m.servicePorts, id)
	delete(m.servicePortIDs, sp.key)
	m.touchedServicePorts[id] = struct{}{}
	m.ids.release(id)
}

// SetPodDrains replaces the pod drains and returns those that changed (old
// or new version): the Services listing their pods must be recomputed.
func (m *Model) SetPodDrains(next map[types.UID]*PodDrain) (changed []*PodDrain) {
	if maps.Equal(m.podDrains, next) { // the same objects
		return nil
	}
	m.podDrainsGen++
	m.notesGen++
	for uid, d := range m.podDrains {
		if n, ok := next[uid]; !ok || !n.same(d) {
			changed = append(changed, d)
		}
	}
	for uid, d := range next {
		if _, ok := m.podDrains[uid]; !ok {
			changed = append(changed, d)
		}
	}
	for _, d := range changed {
		// Withdraw all-ports entries under the old IPs before switching.
		m.withdrawPodEntries(d.UID)
	}
	m.podDrains = next
	m.podDrainsEnd = time.Time{}
	for _, d := range next {
		if !d.Expires.IsZero() && (m.podDrainsEnd.IsZero() || d.Expires.Before(m.podDrainsEnd)) {
			m.podDrainsEnd = d.Expires
		}
	}
	if len(next) > 0 || len(m.drainsByPod) > 0 {
		m.drainsByPod = make(map[k8s.PodKey]*PodDrain, len(next))
		for uid, d := range next {
			m.drainsByPod[k8s.PodKeyOf(uid)] = d
		}
	}
	for _, d := range changed {
		if next[d.UID] == nil {
			delete(m.listedPolicy, d.UID)
		}
		m.updatePodEntries(d.UID)
	}
	slices.SortFunc(changed, func(a, b *PodDrain) int { return cmp.Compare(a.UID, b.UID) })
	return changed
}

// ServicesListing returns the Services whose slices list a pod.
func (m *Model) ServicesListing(uid types.UID, namespace string) []string {
	set := map[string]struct{}{}
	pod := k8s.PodKeyOf(uid)
	for _, sl := range m.state.SlicesInNamespace(namespace) {
		if sl.Service == "" {
			continue
		}
		for i := range sl.Len() {
			if sl.PodKey(i) == pod {
				set[sl.Namespace+"/"+sl.Service] = struct{}{}
				break
			}
		}
	}
	for s := range m.listings[uid] {
		set[s] = struct{}{}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// ClaimsChanged voids lingering entries whose IP another pod now owns, and
// marks every entry of the IP for a re-merge.
func (m *Model) ClaimsChanged(ip netip.Addr) {
	for _, k := range slices.Clone(m.byIP[ip]) { // clearLinger may remove k
		m.touch(k)
		if l := m.lingering[k]; l != nil && m.suppressed(l.c, ip) {
			m.clearLinger(k)
		}
	}
}

// NextDeadline is the earliest instant the model changes by itself.
func (m *Model) NextDeadline() time.Time {
	t := m.firstLingerEnd()
	for _, e := range [2]time.Time{m.podDrainsEnd, m.vanish.servicesEnd} {
		if !e.IsZero() && (t.IsZero() || e.Before(t)) {
			t = e
		}
	}
	return t
}

// suppressed reports whether a contribution is void because its IP now
// belongs to another pod (identity is the pod UID, not the IP).
func (m *Model) suppressed(c contribution, ip netip.Addr) bool {
	return m.claims.ClaimedByOther(ip, c.uid)
}

// AdoptIDs records the service-port ids of a previous draind's pinned
// entries (serviceIDs.adopt), before the first pass.
func (m *Model) AdoptIDs(d *bpf.Dump) { m.ids.adopt(d) }

// ForgetPinnedIDs ends the adoption of pinned ids, after the first pass.
func (m *Model) ForgetPinnedIDs() { m.ids.forgetPinned() }

// SetZone makes zone the node's zone and reports whether it changed, with
// the Services to recompute then (every one that steers).
func (m *Model) SetZone(zone string) (changed bool, services []string) {
	if m.cfg.Zone == zone {
		return false, nil
	}
	m.cfg.Zone = zone
	return true, slices.Collect(maps.Keys(m.results))
}

// PodDrains returns the pod drains, read-only, and the generation they
// changed at (podDrainsGen).
func (m *Model) PodDrains() (map[types.UID]*PodDrain, uint64) { return m.podDrains, m.podDrainsGen }

// TakeDepartures returns the departures since the last call.
func (m *Model) TakeDepartures() []Departure {
	d := m.departures
	m.departures = nil
	return d
}
