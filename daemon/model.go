package daemon

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

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
)

// ModelConfig holds the model's tunables.
type ModelConfig struct {
	Node string
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

// spfKey names a service-port of one family: the unit that owns a
// selectable backend set.
type spfKey struct {
	Service string // namespace/name
	Port    string // the service port's name
	Proto   k8s.Protocol
	Family  k8s.Family
}

// podDrain is a pod-level drain: a drain Lease or a local pod deletion.
type podDrain struct {
	UID             types.UID
	Namespace, Name string
	IPs             []netip.Addr
	Reason          string
	Since           time.Time
	Expires         time.Time // zero: no deadline (local deletion)
	Holder          string
	Lease           bool
	State           string // as the hosting node published it
}

func (d *podDrain) same(o *podDrain) bool {
	return d.Reason == o.Reason && d.Expires.Equal(o.Expires) && slices.Equal(d.IPs, o.IPs) && d.Namespace == o.Namespace && d.Name == o.Name
}

// spfState is an active service-port: it has draining endpoints, or
// departed ones still lingering on its id.
type spfState struct {
	key        spfKey
	id         bpf.ServicePortID
	frontends  []bpf.EndpointKey
	noSteer    bool
	selectable []netip.AddrPort
	refs       int // contributions naming this id
}

// contribution is one reason for a drain entry. Several sources can name
// the same key (an endpoint of several Services, a drained pod's wildcard).
type contribution struct {
	src     string // "spf:<id>", "pod:<uid>" or "linger"
	uid     types.UID
	pod     string // namespace/name
	svc     bpf.ServicePortID
	policy  bpf.Policy
	reason  string
	since   time.Time
	expires time.Time // zero: refreshed by EntryTTL
	linger  bool
}

// serviceResult is what one Service last contributed.
type serviceResult struct {
	spfs     map[spfKey]bpf.ServicePortID
	contribs []bpf.EndpointKey // keys this service's spfs contributed to
	// draining endpoints with their identity (for departure detection).
	draining map[bpf.EndpointKey]contribution
	uids     map[types.UID]struct{} // drained pods listed by this service
}

// lingerRec is a departed endpoint still steered.
type lingerRec struct {
	c     contribution
	until time.Time
}

// model turns Kubernetes state into desired datapath entries, incrementally:
// a step recomputes only the Services and pods that changed, then merges
// only the entry keys they touched.
type model struct {
	cfg   ModelConfig
	state State

	results   map[string]*serviceResult
	spfIDs    map[spfKey]bpf.ServicePortID
	spfs      map[bpf.ServicePortID]*spfState
	contribs  map[bpf.EndpointKey][]contribution
	byIP      map[netip.Addr]map[bpf.EndpointKey]struct{}
	lingering map[bpf.EndpointKey]*lingerRec
	lingerMin time.Time // earliest linger end (zero: none), a lower bound
	podDrains map[types.UID]*podDrain
	presence  map[types.UID]map[string]struct{} // drained uid -> services listing it
	// listedPolicy is the most cautious policy of the Services that listed
	// a drained pod: its all-ports entries keep it after the pod left them
	// (a gone headless pod is not refused).
	listedPolicy map[types.UID]bpf.Policy
	claims       *claims
	ids          idAllocator
	// pinnedIDs are the service-port ids a previous draind left in the
	// pinned maps, by the frontends and drains that name them: a restart
	// keeps them, so it rewrites nothing that is still right.
	pinnedIDs map[bpf.EndpointKey]bpf.ServicePortID
	// pinnedSets are the pinned backend sets by content (service-ports with
	// neither a VIP nor a rewritten endpoint, e.g. headless).
	pinnedSets map[string]bpf.ServicePortID
	warned     map[string]bool

	touched    map[bpf.EndpointKey]struct{}
	touchedSPF map[bpf.ServicePortID]struct{}
	departed   []departure // since the last step (conntrack, lease cleanup)
}

// departure is an endpoint that left every slice while draining.
type departure struct {
	Key    bpf.EndpointKey
	UID    types.UID
	GoneAt time.Time
}

func newModel(cfg ModelConfig, st State, cl *claims) *model {
	return &model{
		cfg: cfg, state: st, claims: cl,
		results:      map[string]*serviceResult{},
		spfIDs:       map[spfKey]bpf.ServicePortID{},
		spfs:         map[bpf.ServicePortID]*spfState{},
		contribs:     map[bpf.EndpointKey][]contribution{},
		byIP:         map[netip.Addr]map[bpf.EndpointKey]struct{}{},
		lingering:    map[bpf.EndpointKey]*lingerRec{},
		podDrains:    map[types.UID]*podDrain{},
		presence:     map[types.UID]map[string]struct{}{},
		listedPolicy: map[types.UID]bpf.Policy{},
		warned:       map[string]bool{},
		touched:      map[bpf.EndpointKey]struct{}{},
		touchedSPF:   map[bpf.ServicePortID]struct{}{},
	}
}

// policyOf resolves a Service's pod-IP policy.
func (m *model) policyOf(svc *k8s.Service) bpf.Policy {
	def := bpf.PolicyRewrite
	if svc.Headless {
		def = bpf.PolicyOff
	}
	if svc.PodIPSteering == "" {
		return def
	}
	p, err := bpf.ParsePolicy(svc.PodIPSteering)
	if err != nil {
		key := svc.Namespace + "/" + svc.Name + "=" + svc.PodIPSteering
		if !m.warned[key] {
			m.warned[key] = true
			if m.cfg.OnPolicyWarning != nil {
				m.cfg.OnPolicyWarning(svc.Namespace+"/"+svc.Name, svc.PodIPSteering)
			}
		}
		return def
	}
	return p
}

func toBPF(p k8s.Protocol) bpf.Protocol { return bpf.Protocol(p) }

// epAgg merges the listings of one endpoint (it may appear in several
// slices while they are rebalanced): draining if any listing says so.
type epAgg struct {
	uid        types.UID
	pod        string
	draining   bool
	selectable bool
	reason     string
	// expires bounds a drain that only a Lease causes: if nobody renews
	// the Lease, steering ends with it.
	expires time.Time
}

// recomputeService recomputes one Service's service-ports and updates the
// contributions, active service-ports and lingering entries it owns.
func (m *model) recomputeService(key string, now time.Time) (changed bool) {
	old := m.results[key]
	svc := m.state.Service(key)
	var slicesOf []*k8s.Slice
	if svc != nil {
		slicesOf = m.state.SlicesOf(key)
	}
	nr := &serviceResult{spfs: map[spfKey]bpf.ServicePortID{}, draining: map[bpf.EndpointKey]contribution{}, uids: map[types.UID]struct{}{}}
	present := map[bpf.EndpointKey]types.UID{}
	type spfCalc struct {
		key        spfKey
		frontends  []bpf.EndpointKey
		selectable []netip.AddrPort
		draining   []bpf.EndpointKey
		eps        map[netip.AddrPort]*epAgg
	}
	var calcs []spfCalc
	policy := bpf.PolicyOff
	if svc != nil {
		policy = m.policyOf(svc)
		ns := svc.Namespace
		for _, sp := range svc.Ports {
			for _, fam := range []k8s.Family{k8s.IPv4, k8s.IPv6} {
				c := spfCalc{key: spfKey{key, sp.Name, sp.Protocol, fam}, eps: map[netip.AddrPort]*epAgg{}}
				for _, sl := range slicesOf {
					if sl.Family != fam {
						continue
					}
					port := uint16(0)
					for _, p := range sl.Ports {
						if p.Name == sp.Name && p.Protocol == sp.Protocol {
							port = p.Port
							break
						}
					}
					if port == 0 {
						continue
					}
					for i := range sl.Endpoints {
						e := &sl.Endpoints[i]
						ap := netip.AddrPortFrom(e.Addr, port)
						pd := m.podDrains[e.PodUID]
						if e.PodUID == "" {
							pd = nil
						}
						draining := !e.Ready() || pd != nil
						reason := ""
						switch {
						case pd != nil:
							reason = pd.Reason
							nr.uids[e.PodUID] = struct{}{}
						case e.Terminating():
							reason = ReasonTerminating
						case !e.Ready():
							reason = ReasonNotReady
						}
						sel := !draining && (!svc.InternalLocal || e.Node == m.cfg.Node)
						a, ok := c.eps[ap]
						if !ok {
							a = &epAgg{uid: e.PodUID, pod: ns + "/" + e.PodName, selectable: sel}
							c.eps[ap] = a
						}
						if draining && !a.draining {
							a.draining, a.reason = true, reason
							if e.Ready() && pd != nil {
								a.expires = pd.Expires
							}
						} else if draining && !e.Ready() {
							a.expires = time.Time{}
						}
						a.selectable = a.selectable && sel
						present[bpf.EndpointKey{Addr: e.Addr, Port: port, Proto: toBPF(sp.Protocol)}] = e.PodUID
					}
				}
				if len(c.eps) == 0 {
					continue
				}
				for ap, a := range c.eps {
					if a.selectable {
						c.selectable = append(c.selectable, ap)
					}
					if a.draining {
						c.draining = append(c.draining, bpf.EndpointKey{Addr: ap.Addr(), Port: ap.Port(), Proto: toBPF(sp.Protocol)})
					}
				}
				slices.SortFunc(c.selectable, netip.AddrPort.Compare)
				slices.SortFunc(c.draining, bpf.EndpointKey.Compare)
				for _, vip := range svc.ClusterIPs {
					if (vip.Is4() && fam == k8s.IPv4) || (vip.Is6() && fam == k8s.IPv6) {
						c.frontends = append(c.frontends, bpf.EndpointKey{Addr: vip, Port: sp.Port, Proto: toBPF(sp.Protocol)})
					}
				}
				calcs = append(calcs, c)
			}
		}
	}

	// Withdraw what the service contributed before.
	var oldContrib []bpf.EndpointKey
	if old != nil {
		oldContrib = old.contribs
		for _, k := range old.contribs {
			m.removeContrib(k, func(c contribution) bool {
				return strings.HasPrefix(c.src, "spf:") && old.spfs[m.spfKeyOf(c.svc)] == c.svc
			})
		}
	}

	// Activate the service-ports that drain; keep those with lingering refs.
	for _, c := range calcs {
		id, hasID := m.spfIDs[c.key]
		lingerRefs := hasID && m.spfs[id] != nil && m.spfs[id].refs > 0
		if len(c.draining) == 0 && !lingerRefs {
			continue
		}
		if !hasID {
			id = m.allocID(c.frontends, c.draining, c.selectable)
			m.spfIDs[c.key] = id
			m.spfs[id] = &spfState{key: c.key, id: id}
		}
		st := m.spfs[id]
		if !slices.Equal(st.selectable, c.selectable) || !slices.Equal(st.frontends, c.frontends) || st.noSteer != svc.AffinityClientIP {
			changed = true
			m.touchedSPF[id] = struct{}{}
			// Policy downgrades of lingering entries depend on selectable.
			for k, l := range m.lingering {
				if l.c.svc == id {
					m.touch(k)
				}
			}
		}
		st.selectable, st.frontends, st.noSteer = c.selectable, c.frontends, svc.AffinityClientIP
		nr.spfs[c.key] = id
		for _, k := range c.draining {
			ap := netip.AddrPortFrom(k.Addr, k.Port)
			a := c.eps[ap]
			since := now
			if old != nil {
				if prev, ok := old.draining[k]; ok && prev.uid == a.uid {
					since = prev.since
				}
			}
			ct := contribution{src: "spf:" + strconv.FormatUint(uint64(id), 10), uid: a.uid, pod: a.pod, svc: id,
				policy: policy, reason: a.reason, since: since, expires: a.expires}
			m.addContrib(k, ct)
			nr.draining[k] = ct
			nr.contribs = append(nr.contribs, k)
		}
	}
	// Drained pods may now be listed, or no longer: their wildcards change.
	for uid := range nr.uids {
		if p, ok := m.listedPolicy[uid]; !ok || policy > p {
			m.listedPolicy[uid] = policy
		}
		m.setPresence(uid, key, true)
	}
	if old != nil {
		for uid := range old.uids {
			if _, ok := nr.uids[uid]; !ok {
				m.setPresence(uid, key, false)
			}
		}
	}

	// Endpoints that drained and are now gone from every slice of this
	// service linger, so stale callers are still steered away.
	if old != nil {
		for k, prev := range old.draining {
			if _, still := nr.draining[k]; still {
				continue
			}
			if uid, listed := present[k]; listed && uid == prev.uid {
				continue // listed again, ready: no longer draining
			}
			changed = true
			m.departed = append(m.departed, departure{Key: k, UID: prev.uid, GoneAt: now})
			if prev.policy == bpf.PolicyOff || m.cfg.Linger <= 0 || m.suppressed(prev, k.Addr) {
				continue
			}
			lc := prev
			lc.src, lc.linger, lc.reason = "linger", true, ReasonDeparted
			m.setLinger(k, &lingerRec{c: lc, until: now.Add(m.cfg.Linger)})
		}
	}

	// Service-ports that are no longer needed release their id.
	if old != nil {
		for sk, id := range old.spfs {
			if _, ok := nr.spfs[sk]; !ok {
				m.releaseIfUnused(id)
			}
		}
	}
	if len(oldContrib) > 0 || len(nr.contribs) > 0 {
		changed = true
	}
	if len(nr.spfs) == 0 {
		delete(m.results, key)
	} else {
		m.results[key] = nr
	}
	return changed
}

// adoptIDs records the ids of a previous draind's pinned entries; fresh
// ids are allocated above all of them.
func (m *model) adoptIDs(d *bpf.Dump) {
	m.pinnedIDs = map[bpf.EndpointKey]bpf.ServicePortID{}
	m.pinnedSets = map[string]bpf.ServicePortID{}
	seen := func(id bpf.ServicePortID) { m.ids.next = max(m.ids.next, uint32(id)) }
	for _, b := range d.Backends {
		seen(b.Service)
		m.pinnedSets[backendSetKey(b.Backends)] = b.Service
	}
	for _, f := range d.Frontends {
		seen(f.Service)
		m.pinnedIDs[f.Key] = f.Service
	}
	for _, dr := range d.Drains {
		seen(dr.Service)
		if dr.Service != 0 && dr.Policy == bpf.PolicyRewrite {
			m.pinnedIDs[dr.Key] = dr.Service
		}
	}
}

// forgetPinnedIDs ends the adoption of pinned ids (after the first pass).
func (m *model) forgetPinnedIDs() { m.pinnedIDs, m.pinnedSets = nil, nil }

// allocID returns the id for a newly active service-port: the one its
// pinned frontends, rewritten endpoints or backend set carry if no other
// service-port holds it, else a fresh one.
func (m *model) allocID(frontends, draining []bpf.EndpointKey, selectable []netip.AddrPort) bpf.ServicePortID {
	for _, keys := range [][]bpf.EndpointKey{frontends, draining} {
		for _, k := range keys {
			if id, ok := m.pinnedIDs[k]; ok && m.spfs[id] == nil {
				delete(m.pinnedIDs, k)
				return id
			}
		}
	}
	if len(selectable) > 0 {
		sk := backendSetKey(selectable)
		if id, ok := m.pinnedSets[sk]; ok && m.spfs[id] == nil {
			delete(m.pinnedSets, sk)
			return id
		}
	}
	return m.ids.alloc()
}

func backendSetKey(b []netip.AddrPort) string {
	var sb strings.Builder
	for _, ap := range b {
		sb.WriteString(ap.String())
		sb.WriteByte(',')
	}
	return sb.String()
}

func (m *model) spfKeyOf(id bpf.ServicePortID) spfKey {
	if st := m.spfs[id]; st != nil {
		return st.key
	}
	return spfKey{}
}

func (m *model) releaseIfUnused(id bpf.ServicePortID) {
	st := m.spfs[id]
	if st == nil || st.refs > 0 {
		return
	}
	delete(m.spfs, id)
	delete(m.spfIDs, st.key)
	m.touchedSPF[id] = struct{}{}
	m.ids.release(id)
}

func (m *model) touch(k bpf.EndpointKey) { m.touched[k] = struct{}{} }

func (m *model) addContrib(k bpf.EndpointKey, c contribution) {
	m.contribs[k] = append(m.contribs[k], c)
	if c.svc != 0 {
		if st := m.spfs[c.svc]; st != nil {
			st.refs++
		}
	}
	ips := m.byIP[k.Addr]
	if ips == nil {
		ips = map[bpf.EndpointKey]struct{}{}
		m.byIP[k.Addr] = ips
	}
	ips[k] = struct{}{}
	m.touch(k)
}

// removeContrib drops the contributions of k that match.
func (m *model) removeContrib(k bpf.EndpointKey, match func(contribution) bool) {
	cs := m.contribs[k]
	out := cs[:0]
	for _, c := range cs {
		if match(c) {
			if c.svc != 0 {
				if st := m.spfs[c.svc]; st != nil {
					st.refs--
				}
			}
			m.touch(k)
			continue
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		delete(m.contribs, k)
		if ips := m.byIP[k.Addr]; ips != nil {
			delete(ips, k)
			if len(ips) == 0 {
				delete(m.byIP, k.Addr)
			}
		}
		return
	}
	m.contribs[k] = out
}

func (m *model) setLinger(k bpf.EndpointKey, l *lingerRec) {
	m.clearLinger(k)
	m.lingering[k] = l
	if m.lingerMin.IsZero() || l.until.Before(m.lingerMin) {
		m.lingerMin = l.until
	}
	m.addContrib(k, l.c)
}

func (m *model) clearLinger(k bpf.EndpointKey) {
	l := m.lingering[k]
	if l == nil {
		return
	}
	delete(m.lingering, k)
	m.removeContrib(k, func(c contribution) bool { return c.linger })
	if l.c.svc != 0 {
		m.releaseIfUnused(l.c.svc)
	}
}

func (m *model) setPresence(uid types.UID, svc string, on bool) {
	set := m.presence[uid]
	_, was := set[svc]
	if on == was {
		return
	}
	if on {
		if set == nil {
			set = map[string]struct{}{}
			m.presence[uid] = set
		}
		set[svc] = struct{}{}
	} else {
		delete(set, svc)
		if len(set) == 0 {
			delete(m.presence, uid)
		}
	}
	m.updateWildcards(uid)
}

// updateWildcards sets the all-ports entries of a drained pod: they refuse
// (or pass) connections to a pod no Service lists (a registry-only
// workload), and on the pod's own node let the observer count every SYN.
func (m *model) updateWildcards(uid types.UID) {
	src := "pod:" + string(uid)
	// Withdraw the old ones.
	for k := range m.wildcardKeysOf(uid) {
		m.removeContrib(k, func(c contribution) bool { return c.src == src })
	}
	d := m.podDrains[uid]
	if d == nil {
		return
	}
	policy := bpf.PolicyOff
	if lp, listed := m.listedPolicy[uid]; len(m.presence[uid]) == 0 && (!listed || lp != bpf.PolicyOff) {
		// No Service lists it (any more): nothing to rewrite to. A pod
		// that a Service with policy off listed stays off.
		policy = m.cfg.RegistryOnlyPolicy
	}
	for _, ip := range d.IPs {
		for _, proto := range []bpf.Protocol{bpf.TCP, bpf.UDP} {
			k := bpf.EndpointKey{Addr: ip, Port: 0, Proto: proto}
			m.addContrib(k, contribution{src: src, uid: uid, pod: d.Namespace + "/" + d.Name, policy: policy,
				reason: d.Reason, since: d.Since, expires: d.Expires})
		}
	}
}

func (m *model) wildcardKeysOf(uid types.UID) map[bpf.EndpointKey]struct{} {
	out := map[bpf.EndpointKey]struct{}{}
	src := "pod:" + string(uid)
	// A drained pod has few IPs; look them up through the previous drain.
	if d := m.podDrains[uid]; d != nil {
		for _, ip := range d.IPs {
			for k := range m.byIP[ip] {
				for _, c := range m.contribs[k] {
					if c.src == src {
						out[k] = struct{}{}
					}
				}
			}
		}
	}
	return out
}

// setPodDrains replaces the pod-level drains and returns the drains that
// changed (old or new version): their pods' Services must be recomputed.
func (m *model) setPodDrains(next map[types.UID]*podDrain) (changed []*podDrain) {
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
		// Withdraw wildcards under the old IPs before switching.
		src := "pod:" + string(d.UID)
		for k := range m.wildcardKeysOf(d.UID) {
			m.removeContrib(k, func(c contribution) bool { return c.src == src })
		}
	}
	m.podDrains = next
	for _, d := range changed {
		if next[d.UID] == nil {
			delete(m.listedPolicy, d.UID)
		}
		m.updateWildcards(d.UID)
	}
	slices.SortFunc(changed, func(a, b *podDrain) int { return cmp.Compare(a.UID, b.UID) })
	return changed
}

// servicesListing returns the Services whose slices list a pod.
func (m *model) servicesListing(uid types.UID, namespace string) []string {
	set := map[string]struct{}{}
	for _, sl := range m.state.SlicesInNamespace(namespace) {
		if sl.Service == "" {
			continue
		}
		for i := range sl.Endpoints {
			if sl.Endpoints[i].PodUID == uid {
				set[sl.Namespace+"/"+sl.Service] = struct{}{}
				break
			}
		}
	}
	for s := range m.presence[uid] {
		set[s] = struct{}{}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// claimsChanged voids lingering entries whose IP another pod now owns, and
// marks every entry of the IP for a re-merge.
func (m *model) claimsChanged(ip netip.Addr) {
	for k := range m.byIP[ip] {
		m.touch(k)
		if l := m.lingering[k]; l != nil && m.suppressed(l.c, ip) {
			m.clearLinger(k)
		}
	}
}

// endLingersOf ends the lingering entries of a pod: its drain Lease was
// deleted, which the node hosting it does when the pod's IP is reused (or
// its own linger ended). Remote nodes learn of a new owner no other way
// when the new pod is in no Service.
func (m *model) endLingersOf(uid types.UID) {
	if uid == "" {
		return
	}
	for k, l := range m.lingering {
		if l.c.uid == uid {
			m.clearLinger(k)
		}
	}
}

// expireLingering ends lingers that ran out. It walks them only when the
// earliest one is due.
func (m *model) expireLingering(now time.Time) {
	if m.lingerMin.IsZero() || now.Before(m.lingerMin) {
		return
	}
	m.lingerMin = time.Time{}
	for k, l := range m.lingering {
		if !now.Before(l.until) {
			m.clearLinger(k)
		} else if m.lingerMin.IsZero() || l.until.Before(m.lingerMin) {
			m.lingerMin = l.until
		}
	}
}

// nextDeadline is the earliest instant the model changes by itself.
func (m *model) nextDeadline() time.Time {
	t := m.lingerMin
	for _, d := range m.podDrains {
		if !d.Expires.IsZero() && (t.IsZero() || d.Expires.Before(t)) {
			t = d.Expires
		}
	}
	return t
}

// suppressed reports whether a contribution is void because its IP now
// belongs to another pod (identity is the pod UID, not the IP).
func (m *model) suppressed(c contribution, ip netip.Addr) bool {
	return m.claims.claimedByOther(ip, c.uid)
}

// desiredDrain merges the contributions of one key.
func (m *model) desiredDrain(k bpf.EndpointKey, now time.Time) (bpf.Drain, bool) {
	var live []contribution
	for _, c := range m.contribs[k] {
		if !m.suppressed(c, k.Addr) {
			live = append(live, c)
		}
	}
	if len(live) == 0 {
		return bpf.Drain{}, false
	}
	d := bpf.Drain{Key: k, Policy: bpf.PolicyRewrite}
	var exp time.Time
	best := bpf.ServicePortID(0)
	for i, c := range live {
		p := c.policy
		if c.svc != 0 && p != bpf.PolicyOff {
			st := m.spfs[c.svc]
			hasAlt := st != nil && len(st.selectable) > 0
			switch {
			case hasAlt && p == bpf.PolicyRewrite && (best == 0 || c.svc < best):
				best = c.svc
			case !hasAlt && c.linger:
				// The pod is gone and nothing can take its place: failing
				// fast beats a connect into a dead address.
				p = bpf.PolicyRefuse
			case !hasAlt:
				// Never take away the last serving endpoints.
				p = bpf.PolicyOff
			}
		}
		if c.svc == 0 && p == bpf.PolicyRewrite {
			p = bpf.PolicyRefuse // nothing to rewrite to
		}
		if i == 0 || p > d.Policy {
			d.Policy = p
		}
		e := now.Add(m.cfg.EntryTTL)
		if c.linger {
			if l := m.lingering[k]; l != nil && l.until.Before(e) {
				e = l.until
			}
		}
		if !c.expires.IsZero() && c.expires.Before(e) {
			e = c.expires
		}
		if e.After(exp) {
			exp = e
		}
	}
	if d.Policy == bpf.PolicyRewrite {
		d.Service = best
	} else if d.Policy == bpf.PolicyRefuse || d.Policy == bpf.PolicyOff {
		d.Service = best // kept for accounting; the programs ignore it
	}
	d.Expires = exp
	return d, true
}

// desiredSPF returns the frontends and backends of an active service-port.
func (m *model) desiredSPF(id bpf.ServicePortID, now time.Time) (fes []bpf.Frontend, be *bpf.Backends) {
	st := m.spfs[id]
	if st == nil || st.refs == 0 || len(st.selectable) == 0 {
		if st != nil && st.refs > 0 {
			return nil, &bpf.Backends{Service: id, Expires: now.Add(m.cfg.EntryTTL)}
		}
		return nil, nil
	}
	exp := now.Add(m.cfg.EntryTTL)
	for _, k := range st.frontends {
		fes = append(fes, bpf.Frontend{Key: k, Service: id, NoSteer: st.noSteer, Expires: exp})
	}
	return fes, &bpf.Backends{Service: id, Backends: st.selectable, Expires: exp}
}

// keysOf returns the entry keys contributed for each of the given pods,
// found through their IPs (a drained pod's Lease or endpoints name them).
func (m *model) keysOf(uids []types.UID) map[types.UID][]bpf.EndpointKey {
	out := make(map[types.UID][]bpf.EndpointKey, len(uids))
	for _, uid := range uids {
		var keys []bpf.EndpointKey
		var ips []netip.Addr
		if d := m.podDrains[uid]; d != nil {
			ips = d.IPs
		}
		for _, ip := range ips {
			for k := range m.byIP[ip] {
				for _, c := range m.contribs[k] {
					if c.uid == uid && !slices.Contains(keys, k) {
						keys = append(keys, k)
					}
				}
			}
		}
		slices.SortFunc(keys, bpf.EndpointKey.Compare)
		out[uid] = keys
	}
	return out
}

// drainedPod is the status view of one drained pod (or endpoint owner).
type drainedPod struct {
	UID     types.UID
	Pod     string
	Reason  string
	Since   time.Time
	Expires time.Time
	Keys    []bpf.EndpointKey
	IPs     []netip.Addr
	// Departed: the pod left every slice (only lingering entries remain),
	// or its hosting node published that it is gone.
	Departed bool
	ports    int // per-port contributions
	lingers  int // of which lingering
}

// drainedPods groups the live contributions by pod, sorted by pod name.
func (m *model) drainedPods() []drainedPod {
	by := map[types.UID]*drainedPod{}
	for k, cs := range m.contribs {
		for _, c := range cs {
			if m.suppressed(c, k.Addr) {
				continue
			}
			id := c.uid
			if id == "" {
				id = types.UID("ip:" + k.Addr.String())
			}
			p := by[id]
			if p == nil {
				p = &drainedPod{UID: c.uid, Pod: c.pod, Reason: c.reason, Since: c.since}
				by[id] = p
			}
			if c.since.Before(p.Since) {
				p.Since = c.since
			}
			if !c.linger && !strings.HasPrefix(c.src, "pod:") && p.Reason == ReasonDeparted {
				p.Reason = c.reason
			}
			if k.Port != 0 {
				p.ports++
				if c.linger {
					p.lingers++
				}
			}
			if !slices.Contains(p.Keys, k) {
				p.Keys = append(p.Keys, k)
			}
			if !slices.Contains(p.IPs, k.Addr) {
				p.IPs = append(p.IPs, k.Addr)
			}
		}
	}
	for uid, d := range m.podDrains {
		if p := by[uid]; p != nil {
			p.Reason, p.Expires = d.Reason, d.Expires
			p.Departed = d.State == StateGone
			if d.Since.Before(p.Since) {
				p.Since = d.Since
			}
		}
	}
	out := make([]drainedPod, 0, len(by))
	for _, p := range by {
		if p.ports > 0 && p.lingers == p.ports {
			p.Departed = true
		}
		slices.SortFunc(p.Keys, bpf.EndpointKey.Compare)
		slices.SortFunc(p.IPs, netip.Addr.Compare)
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b drainedPod) int {
		return cmp.Or(cmp.Compare(a.Pod, b.Pod), cmp.Compare(a.UID, b.UID))
	})
	return out
}

// idAllocator hands out service-port ids, reusing released ones oldest
// first (so an id is not reused while a just-deleted entry may linger).
type idAllocator struct {
	next uint32
	free []bpf.ServicePortID
}

func (a *idAllocator) alloc() bpf.ServicePortID {
	if len(a.free) > 64 {
		id := a.free[0]
		a.free = a.free[1:]
		return id
	}
	a.next++
	return bpf.ServicePortID(a.next)
}

func (a *idAllocator) release(id bpf.ServicePortID) { a.free = append(a.free, id) }
