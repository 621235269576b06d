package daemon

import (
	"net/netip"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

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
//   - which node hosts the pod listed at X? A drain Lease is honoured only
//     when its holder is that node, and only for the pod's own IPs. A pod's
//     host is remembered for a while after its last listing of X ends
//     (departed): a pod deleted without grace leaves its slice before its
//     node publishes the Lease that says it is gone.
//
// A hand-written slice (any tenant can write one, with any label) claims
// nothing. Informer handlers update it (under mu) as events arrive; the
// model reads it from the runner.
type claims struct {
	mu     sync.Mutex
	byIP   map[netip.Addr]ipListings
	slices map[string]*k8s.Slice // trusted slices as applied, by namespace/name
	local  map[netip.Addr]types.UID

	clock     clock.PassiveClock
	keep      time.Duration // how long a departed host is remembered
	departed  map[netip.Addr]departedClaim
	lastPrune time.Time
}

// departedClaim is the last trusted listing of an IP that ended.
type departedClaim struct {
	uid  types.UID
	node string
	at   time.Time
}

// ipListing is one pod's listings of an IP in trusted slices.
type ipListing struct {
	uid   types.UID
	node  string // interned by k8s
	ready int32  // ready listings
	all   int32  // all listings
}

// ipListings are the pods listing an IP: almost always one, kept inline.
type ipListings struct {
	first ipListing
	extra []ipListing
}

// newClaims returns an empty index that remembers departed hosts for keep.
func newClaims(c clock.PassiveClock, keep time.Duration) *claims {
	return &claims{byIP: map[netip.Addr]ipListings{}, slices: map[string]*k8s.Slice{}, local: map[netip.Addr]types.UID{},
		clock: c, keep: keep, departed: map[netip.Addr]departedClaim{}}
}

// find returns the listing of uid, or nil.
func (l *ipListings) find(uid types.UID) *ipListing {
	if l.first.all > 0 && l.first.uid == uid {
		return &l.first
	}
	for i := range l.extra {
		if l.extra[i].uid == uid {
			return &l.extra[i]
		}
	}
	return nil
}

// add counts one listing more (d = +1) or less (d = -1) of e and reports
// whether the set of pods listing the IP as ready changed.
func (l *ipListings) add(e *k8s.Endpoint, d int32) (readyChanged bool) {
	x := l.find(e.PodUID)
	if x == nil {
		if d < 0 {
			return false // never applied
		}
		if l.first.all == 0 {
			l.first = ipListing{uid: e.PodUID}
			x = &l.first
		} else {
			l.extra = append(l.extra, ipListing{uid: e.PodUID})
			x = &l.extra[len(l.extra)-1]
		}
	}
	wasReady := x.ready > 0
	x.all += d
	if e.Ready() {
		x.ready += d
	}
	if x.node == "" {
		x.node = e.Node
	}
	readyChanged = wasReady != (x.ready > 0)
	if x.all <= 0 {
		l.remove(x)
	}
	return readyChanged
}

func (l *ipListings) remove(x *ipListing) {
	if x == &l.first {
		l.first = ipListing{}
		if len(l.extra) > 0 {
			l.first, l.extra = l.extra[0], l.extra[1:]
		}
		return
	}
	for i := range l.extra {
		if &l.extra[i] == x {
			l.extra = append(l.extra[:i], l.extra[i+1:]...)
			return
		}
	}
}

func (l *ipListings) empty() bool { return l.first.all == 0 && len(l.extra) == 0 }

// setSlice records the current state of slice key: s if it is trusted, nil
// if it is not (or was deleted). It returns the IPs whose ready claims
// changed. Setting the same state twice changes nothing, so a Service
// event re-applying its slices and the slices' own events never count a
// slice twice.
func (c *claims) setSlice(key string, s *k8s.Slice) []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.slices[key]
	if old == s {
		return nil
	}
	var changed []netip.Addr
	apply := func(s *k8s.Slice, d int32) {
		if s == nil {
			return
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if e.PodUID == "" {
				continue
			}
			l := c.byIP[e.Addr]
			var node string
			if x := l.find(e.PodUID); x != nil {
				node = x.node
			}
			if l.add(e, d) {
				changed = append(changed, e.Addr)
			}
			if d < 0 && node != "" && l.find(e.PodUID) == nil {
				c.departed[e.Addr] = departedClaim{uid: e.PodUID, node: node, at: c.clock.Now()}
			}
			if l.empty() {
				delete(c.byIP, e.Addr)
			} else {
				c.byIP[e.Addr] = l
			}
		}
	}
	apply(old, -1)
	apply(s, +1)
	c.pruneDeparted()
	if s == nil {
		delete(c.slices, key)
	} else {
		c.slices[key] = s
	}
	return changed
}

// setLocalPods replaces the local pods' claims (pods that exist and are
// not being deleted) and returns the IPs that changed hands.
func (c *claims) setLocalPods(pods []*k8s.Pod) []netip.Addr {
	next := map[netip.Addr]types.UID{}
	for _, p := range pods {
		if p.HostNetwork || p.Deleting() {
			continue
		}
		for _, ip := range p.IPs {
			next[ip] = p.UID
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var changed []netip.Addr
	for ip, uid := range c.local {
		if next[ip] != uid {
			changed = append(changed, ip)
		}
	}
	for ip := range next {
		if _, ok := c.local[ip]; !ok {
			changed = append(changed, ip)
		}
	}
	c.local = next
	return changed
}

// claimedByOther reports whether ip is currently owned by a pod other than
// uid: a local pod, or a ready listing.
func (c *claims) claimedByOther(ip netip.Addr, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.local[ip]; ok && l != uid {
		return true
	}
	l, ok := c.byIP[ip]
	if !ok {
		return false
	}
	if l.first.ready > 0 && l.first.uid != uid {
		return true
	}
	for _, x := range l.extra {
		if x.ready > 0 && x.uid != uid {
			return true
		}
	}
	return false
}

// pruneDeparted forgets departed hosts older than keep, at most every
// keep/4 (c.mu held).
func (c *claims) pruneDeparted() {
	now := c.clock.Now()
	if now.Sub(c.lastPrune) < c.keep/4 {
		return
	}
	c.lastPrune = now
	for ip, dc := range c.departed {
		if now.Sub(dc.at) >= c.keep {
			delete(c.departed, ip)
		}
	}
}

// hostOf returns the node that trusted slices say hosts pod uid at ip, or
// hosted it until its listing ended less than keep ago.
func (c *claims) hostOf(ip netip.Addr, uid types.UID) (node string, listed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byIP[ip]; ok {
		if x := l.find(uid); x != nil {
			return x.node, true
		}
	}
	if dc, ok := c.departed[ip]; ok && dc.uid == uid && c.clock.Since(dc.at) < c.keep {
		return dc.node, true
	}
	return "", false
}

// localOwner returns the local pod holding ip, if any.
func (c *claims) localOwner(ip netip.Addr) (types.UID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.local[ip]
	return u, ok
}
