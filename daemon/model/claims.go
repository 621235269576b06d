package model

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// claims records which pods own an IP right now, from the cluster's own
// records only: the endpoints of trusted slices (the EndpointSlice
// controller's, for Services with a selector: see k8s.Slice.Trusted), and
// (on the node hosting them) the local pods. It answers two questions:
//
//   - is IP X claimed by a pod other than A? A drain entry of pod A on X is
//     void the moment X is claimed by another pod: pod IPs are reused,
//     identity is the pod UID;
//   - which node hosts the pod listed at X (HostOf)? It is a record that
//     package lease reads when it decides whether a Lease is believed
//     (lease.Judge); nothing here judges a Lease. A pod's host is
//     remembered for a while after its last listing of X ends (departed):
//     a pod deleted without grace leaves its slice before its node
//     publishes the Lease that says it is gone.
//
// The first question is the claim rule: which of the pods that believed
// claims (SetRemote), local pods and ready listings put at an IP owns it
// (ClaimedByOther). Whether a claim Lease is believed is not decided here.
//
// A hand-written slice (any tenant can write one, with any label) claims
// nothing. Informer handlers update it (under mu) as events arrive; the
// model reads it from the runner.
//
// It indexes every trusted endpoint of the cluster, so it is kept small: an
// IP maps to the slices that list it (a slice number, no copy of the
// endpoint), and the answers are read from those slices' endpoints.
type Claims struct {
	mu     sync.Mutex
	slices map[string]int32 // trusted slices as applied: namespace/name -> number
	table  []*k8s.Slice     // by number; nil: free
	free   []int32
	byIP   ipIndex
	local  map[netip.Addr]types.UID
	// remote is the believed claim Leases of the cluster (claimleases.go):
	// IP -> the pod its hosting node says has it now.
	remote map[netip.Addr]types.UID

	before, after []readyClaim // setSlice's scratch space
	// gen changes whenever what hostOf answers for a watched IP may
	// change, but for the passing of time (a departed host's end): a slice
	// lists other pods there, or the same ones elsewhere or on other
	// nodes. Invariant: an answer of hostOf for a watched IP read at gen
	// (leaseDrainsMemo) holds while gen stays and until its end. Checked
	// by FuzzSequenceDifferential and TestClaimsMatchReference.
	gen uint64
	// watched is the IPs gen follows (watch): those the drain Leases of
	// other nodes name. nil: every IP. A rollout moves pods on most slice
	// updates of the cluster; the Leases need not be read again for those.
	watched map[netip.Addr]struct{}

	clock    clock.PassiveClock
	keep     time.Duration // how long a departed host is remembered
	departed map[netip.Addr]departedClaim
	// departures lists the departed hosts in the order they were noted
	// (by time, as the clock gives it; its head is departures[head:]),
	// so that forgetting them walks only those that ended: a rollout
	// notes one per pod it replaces.
	departures []departedAt
	head       int
}

// departedAt is a departed host as noted: the IP and when.
type departedAt struct {
	ip netip.Addr
	at time.Time
}

// departedClaim is the last trusted listing of an IP that ended.
type departedClaim struct {
	uid  types.UID
	node string
	at   time.Time
}

// ipIndex maps an IP to the numbers of the trusted slices listing it with a
// pod. Almost every IP is listed by one slice: that one is kept in a
// pointer-free map (4-byte keys for IPv4), any others aside.
type ipIndex struct {
	v4    map[[4]byte]int32
	other map[netip.Addr]int32 // IPv6, and IPv4 with a zone
	more  map[netip.Addr][]int32
}

// NewClaims returns an empty index that remembers departed hosts for keep.
func NewClaims(c clock.PassiveClock, keep time.Duration) *Claims {
	return &Claims{slices: map[string]int32{}, local: map[netip.Addr]types.UID{},
		byIP:  ipIndex{v4: map[[4]byte]int32{}, other: map[netip.Addr]int32{}, more: map[netip.Addr][]int32{}},
		clock: c, keep: keep, departed: map[netip.Addr]departedClaim{}}
}

func compactV4(ip netip.Addr) bool { return ip.Is4() && ip.Zone() == "" }

// first returns the first slice listing ip.
func (x *ipIndex) first(ip netip.Addr) (int32, bool) {
	if compactV4(ip) {
		n, ok := x.v4[ip.As4()]
		return n, ok
	}
	n, ok := x.other[ip]
	return n, ok
}

func (x *ipIndex) setFirst(ip netip.Addr, n int32) {
	if compactV4(ip) {
		x.v4[ip.As4()] = n
	} else {
		x.other[ip] = n
	}
}

func (x *ipIndex) deleteFirst(ip netip.Addr) {
	if compactV4(ip) {
		delete(x.v4, ip.As4())
	} else {
		delete(x.other, ip)
	}
}

// add records that slice n lists ip (once, however often it lists it).
func (x *ipIndex) add(ip netip.Addr, n int32) {
	f, ok := x.first(ip)
	switch {
	case !ok:
		x.setFirst(ip, n)
	case f != n && !slices.Contains(x.more[ip], n):
		x.more[ip] = append(x.more[ip], n)
	}
}

// remove forgets that slice n lists ip.
func (x *ipIndex) remove(ip netip.Addr, n int32) {
	more := x.more[ip]
	if f, ok := x.first(ip); ok && f == n {
		if len(more) == 0 {
			x.deleteFirst(ip)
			return
		}
		x.setFirst(ip, more[0])
		more = more[1:]
	} else {
		more = slices.DeleteFunc(more, func(m int32) bool { return m == n })
	}
	if len(more) == 0 {
		delete(x.more, ip)
	} else {
		x.more[ip] = slices.Clip(more)
	}
}

// each calls fn with the numbers of the slices listing ip.
func (x *ipIndex) each(ip netip.Addr, fn func(int32)) {
	if f, ok := x.first(ip); ok {
		fn(f)
		for _, n := range x.more[ip] {
			fn(n)
		}
	}
}

// eachListing calls fn with every endpoint (slice s, index i) of a trusted
// slice that lists a pod at ip, until fn returns false. It builds no
// k8s.Endpoint: the callers, some on the pass's path, read the fields they
// need (a pod's UID as a k8s.PodKey). The caller holds mu.
func (c *Claims) eachListing(ip netip.Addr, fn func(s *k8s.Slice, i int) bool) {
	more := true
	c.byIP.each(ip, func(n int32) {
		s := c.table[n]
		for i := 0; more && i < s.Len(); i++ {
			if s.Addr(i) == ip && s.HasPod(i) {
				more = fn(s, i)
			}
		}
	})
}

// readyClaim is a pod listed ready at an IP.
type readyClaim struct {
	ip  netip.Addr
	pod k8s.PodKey
}

func compareReadyClaims(a, b readyClaim) int {
	if c := a.ip.Compare(b.ip); c != 0 {
		return c
	}
	return a.pod.Compare(b.pod)
}

// readyClaims appends to out[:0] the pods s lists ready, by IP, sorted,
// once each.
func readyClaims(out []readyClaim, s *k8s.Slice) []readyClaim {
	out = out[:0]
	if s == nil {
		return out
	}
	for i := range s.Len() {
		if s.HasPod(i) && s.Ready(i) {
			out = append(out, readyClaim{s.Addr(i), s.PodKey(i)})
		}
	}
	slices.SortFunc(out, compareReadyClaims)
	return slices.Compact(out)
}

// SetSlice records the current state of slice key: s if it is trusted, nil
// if it is not (or was deleted). It returns the IPs whose ready claims
// changed (the set of pods listed ready there). Setting the same state
// twice changes nothing, so a Service event re-applying its slices and the
// slices' own events never count a slice twice.
func (c *Claims) SetSlice(key string, s *k8s.Slice) []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, had := c.slices[key]
	var old *k8s.Slice
	if had {
		old = c.table[n]
	}
	if old == s {
		return nil
	}
	if old != nil && s != nil && samePods(old, s) {
		// The usual update: the same pods in the same places, new
		// conditions. The index stays, nobody departs, and only the
		// places whose readiness flipped can change a claim.
		c.table[n] = s
		c.pruneDeparted()
		return c.flippedIPs(old, s, n)
	}
	c.noteWatched(old, s)
	// Scratch space reused under mu: every slice event of the cluster
	// comes here.
	c.before = readyClaims(c.before, old)
	c.after = readyClaims(c.after, s)
	before, after := c.before, c.after
	switch {
	case old != nil && s != nil && sameIPs(old, s):
		// The usual update (conditions changed): the index stays.
		c.table[n] = s
		c.noteDepartures(old, s)
		return c.changedIPs(before, after, n)
	case old != nil:
		c.index(n, old, false)
		defer c.noteDepartures(old, s)
	}
	switch {
	case s == nil:
		delete(c.slices, key)
		c.table[n] = nil
		c.free = append(c.free, n)
	case !had:
		n = c.alloc(s)
		c.slices[key] = n
		c.index(n, s, true)
	default:
		c.table[n] = s
		c.index(n, s, true)
	}
	return c.changedIPs(before, after, n)
}

// noteDepartures remembers the host of every pod that old listed with a node
// and that no trusted slice lists at that IP any more (s, old's successor,
// already applied). c.mu held.
func (c *Claims) noteDepartures(old, s *k8s.Slice) {
	now := c.clock.Now()
	for i := range old.Len() {
		if !old.HasPod(i) || (s != nil && i < s.Len() && s.Addr(i) == old.Addr(i) && s.PodKey(i) == old.PodKey(i)) {
			continue // the usual update: the same pod in the same place
		}
		node, ip := old.Node(i), old.Addr(i)
		if node == "" {
			continue
		}
		still, pod := false, old.PodKey(i)
		c.eachListing(ip, func(l *k8s.Slice, j int) bool {
			still = l.PodKey(j) == pod
			return !still
		})
		if !still {
			// Copies: a slice's own text would keep all of it alive.
			uid := old.Endpoint(i).PodUID
			c.departed[ip] = departedClaim{uid: types.UID(strings.Clone(string(uid))), node: strings.Clone(node), at: now}
			c.departures = append(c.departures, departedAt{ip, now})
		}
	}
	c.pruneDeparted()
}

// samePods reports whether a and b list the same pods at the same IPs on
// the same nodes in the same places.
func samePods(a, b *k8s.Slice) bool {
	if a.Len() != b.Len() {
		return false
	}
	for i := range a.Len() {
		if a.HasPod(i) != b.HasPod(i) || a.Addr(i) != b.Addr(i) || a.PodKey(i) != b.PodKey(i) || a.Node(i) != b.Node(i) {
			return false
		}
	}
	return true
}

// flippedIPs is changedIPs for an update that kept every pod in its place
// (samePods): a pod's ready claim at an IP changed where its readiness
// flipped, unless another place in the slice, or another trusted slice,
// still lists it ready there.
func (c *Claims) flippedIPs(old, s *k8s.Slice, n int32) []netip.Addr {
	var changed []netip.Addr
	for i := range s.Len() {
		if !s.HasPod(i) || old.Ready(i) == s.Ready(i) {
			continue
		}
		r := readyClaim{s.Addr(i), s.PodKey(i)}
		if slices.Contains(changed, r.ip) || readyIn(old, r) == readyIn(s, r) || c.readyElsewhere(r, n) {
			continue
		}
		changed = append(changed, r.ip)
	}
	return changed
}

// readyIn reports whether s lists r's pod ready at r's IP.
func readyIn(s *k8s.Slice, r readyClaim) bool {
	for i := range s.Len() {
		if s.Ready(i) && s.HasPod(i) && s.Addr(i) == r.ip && s.PodKey(i) == r.pod {
			return true
		}
	}
	return false
}

// sameIPs reports whether a and b list pods at the same IPs, in the same
// order.
func sameIPs(a, b *k8s.Slice) bool {
	i, j := 0, 0
	for {
		for i < a.Len() && !a.HasPod(i) {
			i++
		}
		for j < b.Len() && !b.HasPod(j) {
			j++
		}
		if i == a.Len() || j == b.Len() {
			return i == a.Len() && j == b.Len()
		}
		if a.Addr(i) != b.Addr(j) {
			return false
		}
		i++
		j++
	}
}

func (c *Claims) alloc(s *k8s.Slice) int32 {
	if k := len(c.free); k > 0 {
		n := c.free[k-1]
		c.free = c.free[:k-1]
		c.table[n] = s
		return n
	}
	c.table = append(c.table, s)
	return int32(len(c.table) - 1)
}

// index adds (or removes) slice n's IPs to (from) the IP index.
func (c *Claims) index(n int32, s *k8s.Slice, add bool) {
	for i := range s.Len() {
		if !s.HasPod(i) {
			continue
		}
		if add {
			c.byIP.add(s.Addr(i), n)
		} else {
			c.byIP.remove(s.Addr(i), n)
		}
	}
}

// changedIPs compares slice n's ready claims before and after, IP by IP: a
// pod that became (or stopped being) ready at an IP changes its claims,
// unless another trusted slice lists it ready there too.
func (c *Claims) changedIPs(before, after []readyClaim, n int32) []netip.Addr {
	var changed []netip.Addr
	flip := func(r readyClaim) {
		if len(changed) > 0 && changed[len(changed)-1] == r.ip {
			return
		}
		if !c.readyElsewhere(r, n) {
			changed = append(changed, r.ip)
		}
	}
	i, j := 0, 0
	for i < len(before) || j < len(after) {
		switch {
		case j == len(after) || (i < len(before) && compareReadyClaims(before[i], after[j]) < 0):
			flip(before[i])
			i++
		case i == len(before) || compareReadyClaims(before[i], after[j]) > 0:
			flip(after[j])
			j++
		default:
			i++
			j++
		}
	}
	return changed
}

// readyElsewhere reports whether a slice other than n lists r's pod ready
// at r's IP.
func (c *Claims) readyElsewhere(r readyClaim, n int32) bool {
	found := false
	c.byIP.each(r.ip, func(m int32) {
		if m == n || found {
			return
		}
		s := c.table[m]
		for i := range s.Len() {
			if s.Addr(i) == r.ip && s.PodKey(i) == r.pod && s.Ready(i) {
				found = true
				return
			}
		}
	})
	return found
}

// SetLocalPods replaces the local pods' claims (pods that exist and are
// not being deleted) and returns the IPs that changed hands.
func (c *Claims) SetLocalPods(pods []*k8s.Pod) []netip.Addr {
	next := map[netip.Addr]types.UID{}
	for _, p := range pods {
		if p.HostNetwork || p.Deleting() || p.Finished() { // a finished pod released its IPs
			continue
		}
		for _, ip := range p.IPs {
			next[ip] = p.UID
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := changedIPs(c.local, next)
	c.local = next
	return changed
}

// changedIPs are the IPs whose owner differs between old and next.
func changedIPs(old, next map[netip.Addr]types.UID) []netip.Addr {
	var changed []netip.Addr
	for ip, uid := range old {
		if next[ip] != uid {
			changed = append(changed, ip)
		}
	}
	for ip := range next {
		if _, ok := old[ip]; !ok {
			changed = append(changed, ip)
		}
	}
	return changed
}

// ClaimedByOther reports whether ip is currently owned by a pod other than
// uid: a local pod, a believed claim Lease, or a ready listing.
func (c *Claims) ClaimedByOther(ip netip.Addr, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.local[ip]; ok && l != uid {
		return true
	}
	if r, ok := c.remote[ip]; ok && r != uid {
		return true
	}
	other, pod := false, k8s.PodKeyOf(uid)
	c.eachListing(ip, func(s *k8s.Slice, i int) bool {
		other = s.Ready(i) && s.PodKey(i) != pod
		return !other
	})
	return other
}

// SetRemote replaces the believed claims (IP -> pod), as lease.Judge
// believed them, and returns the IPs whose claim changed.
func (c *Claims) SetRemote(next map[netip.Addr]types.UID) []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	changed := changedIPs(c.remote, next)
	c.remote = next
	return changed
}

// StillServes reports whether the cluster's records show pod uid alive at
// ip right now: a trusted slice lists it there ready, or it is a local pod
// not being deleted. Such a pod is not gone, whatever a slice that dropped
// it says: a linger or a TCP expiry of its IP would cut a serving pod.
func (c *Claims) StillServes(ip netip.Addr, uid types.UID) bool {
	if uid == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.local[ip]; ok && l == uid {
		return true
	}
	serves, pod := false, k8s.PodKeyOf(uid)
	c.eachListing(ip, func(s *k8s.Slice, i int) bool {
		serves = s.Ready(i) && s.PodKey(i) == pod
		return !serves
	})
	return serves
}

// ListsPodAt reports whether a trusted slice of Service svc
// (namespace/name) lists pod uid at k: its address, with k's port.
func (c *Claims) ListsPodAt(svc string, k bpf.EndpointKey, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	pod := k8s.PodKeyOf(uid)
	listed := false
	c.byIP.each(k.Addr, func(n int32) {
		s := c.table[n]
		if listed || !sliceOf(s, svc) || !slices.ContainsFunc(s.Ports, func(p k8s.SlicePort) bool {
			return p.Port == k.Port && p.Protocol == k.Proto
		}) {
			return
		}
		for i := 0; !listed && i < s.Len(); i++ {
			listed = s.Addr(i) == k.Addr && s.HasPod(i) && s.PodKey(i) == pod
		}
	})
	return listed
}

// sliceOf reports whether s is a slice of Service svc (namespace/name).
func sliceOf(s *k8s.Slice, svc string) bool {
	ns, name, ok := strings.Cut(svc, "/")
	return ok && s.Namespace == ns && s.Service == name
}

// pruneDeparted forgets departed hosts older than keep, oldest first
// (c.mu held). A host noted again at the same IP keeps the later note; a
// clock set back leaves older notes behind a newer one for a while, which
// HostOf ignores once they are older than keep.
func (c *Claims) pruneDeparted() {
	now := c.clock.Now()
	for c.head < len(c.departures) {
		d := c.departures[c.head]
		if now.Sub(d.at) < c.keep {
			break
		}
		if dc, ok := c.departed[d.ip]; ok && dc.at.Equal(d.at) {
			delete(c.departed, d.ip)
		}
		c.departures[c.head] = departedAt{}
		c.head++
	}
	if c.head > 0 && c.head >= len(c.departures)/2 {
		// Reuse the array once half of it is spent.
		n := copy(c.departures, c.departures[c.head:])
		c.departures = c.departures[:n]
		c.head = 0
	}
}

// Watch makes gen follow the IPs of ips alone (none if empty). gen
// changes if an IP is new to it (every IP was watched while watched was
// nil): its listings may have changed unseen until now.
func (c *Claims) Watch(ips []netip.Addr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[netip.Addr]struct{}, len(ips))
	bumped := false
	for _, ip := range ips {
		if _, ok := c.watched[ip]; !ok && c.watched != nil && !bumped {
			c.gen++
			bumped = true
		}
		next[ip] = struct{}{}
	}
	c.watched = next
}

// noteWatched changes gen if old or s (a slice's state before and after a
// change of its pods) lists a pod at a watched IP (c.mu held).
func (c *Claims) noteWatched(old, s *k8s.Slice) {
	if c.watched != nil && len(c.watched) == 0 {
		return
	}
	for _, sl := range [2]*k8s.Slice{old, s} {
		for i := 0; sl != nil && i < sl.Len(); i++ {
			if !sl.HasPod(i) {
				continue
			}
			if _, ok := c.watched[sl.Addr(i)]; ok || c.watched == nil {
				c.gen++
				return
			}
		}
	}
}

// Generation returns gen: an answer of hostOf for a watched IP read after
// it holds as long as gen stays, or until the end hostOf gives.
func (c *Claims) Generation() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen
}

// HostOf returns the node that trusted slices say hosts pod uid at ip, or
// hosted it until its listing ended less than keep ago; until is when such
// a departed host's answer ends (zero: the listings' answer). It is the
// trusted slices' lease.Record: a fact, not a verdict on any Lease.
// Listings that place the pod at ip on different nodes contradict each
// other, whatever order the slices came in: the slices then answer nothing
// (not listed), and the pod's own object decides (lease.Judge).
func (c *Claims) HostOf(ip netip.Addr, uid types.UID) (node string, listed bool, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pod := k8s.PodKeyOf(uid)
	contradicted := false
	c.eachListing(ip, func(s *k8s.Slice, i int) bool {
		if s.PodKey(i) != pod {
			return true
		}
		listed = true
		switch n := s.Node(i); {
		case n == "":
		case node == "":
			node = n
		case n != node:
			contradicted = true
		}
		return !contradicted
	})
	if contradicted {
		return "", false, time.Time{}
	}
	if node != "" {
		return node, true, time.Time{}
	}
	if dc, ok := c.departed[ip]; ok && dc.uid == uid && c.clock.Since(dc.at) < c.keep {
		return dc.node, true, dc.at.Add(c.keep)
	}
	return "", listed, time.Time{}
}
