package daemon

import (
	"net/netip"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/k8s"
)

// claims records which pods own an IP right now: the ready endpoints of
// every slice, and (on the node hosting them) the local pods. A drain entry
// of pod A on IP X is void the moment X is claimed by another pod: pod IPs
// are reused, identity is the pod UID.
//
// Informer handlers update it (under mu) as events arrive; the model reads
// it from the runner.
type claims struct {
	mu    sync.Mutex
	ready map[netip.Addr]claim
	local map[netip.Addr]types.UID
}

// claim is the set of pods listing an IP as ready; almost always one.
type claim struct {
	uid   types.UID
	n     int32
	extra []uidCount
}

type uidCount struct {
	uid types.UID
	n   int32
}

func newClaims() *claims {
	return &claims{ready: map[netip.Addr]claim{}, local: map[netip.Addr]types.UID{}}
}

// add counts d more (or fewer) ready listings of uid and reports whether
// uid joined or left the set.
func (c *claim) add(uid types.UID, d int32) bool {
	if c.n > 0 && c.uid == uid {
		c.n += d
		if c.n > 0 {
			return false
		}
		c.n = 0
		if len(c.extra) > 0 {
			c.uid, c.n = c.extra[0].uid, c.extra[0].n
			c.extra = c.extra[1:]
		}
		return true
	}
	for i := range c.extra {
		if c.extra[i].uid == uid {
			c.extra[i].n += d
			if c.extra[i].n > 0 {
				return false
			}
			c.extra = append(c.extra[:i], c.extra[i+1:]...)
			return true
		}
	}
	if d <= 0 {
		return false // not listed: nothing to take away
	}
	if c.n == 0 {
		c.uid, c.n = uid, d
	} else {
		c.extra = append(c.extra, uidCount{uid, d})
	}
	return true
}

func (c *claim) empty() bool { return c.n == 0 && len(c.extra) == 0 }

// updateSlice applies a slice change (either side may be nil) and returns
// the IPs whose set of claiming pods changed.
func (c *claims) updateSlice(old, new *k8s.Slice) []netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	var changed []netip.Addr
	apply := func(s *k8s.Slice, d int32) {
		if s == nil {
			return
		}
		for i := range s.Endpoints {
			e := &s.Endpoints[i]
			if !e.Ready() {
				continue
			}
			cl := c.ready[e.Addr]
			if cl.add(e.PodUID, d) {
				changed = append(changed, e.Addr)
			}
			if cl.empty() {
				delete(c.ready, e.Addr)
			} else {
				c.ready[e.Addr] = cl
			}
		}
	}
	apply(old, -1)
	apply(new, +1)
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

// claimedByOther reports whether ip is currently owned by a pod other than uid.
func (c *claims) claimedByOther(ip netip.Addr, uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.local[ip]; ok && l != uid {
		return true
	}
	cl, ok := c.ready[ip]
	if !ok {
		return false
	}
	if cl.n > 0 && cl.uid != uid {
		return true
	}
	for _, e := range cl.extra {
		if e.uid != uid {
			return true
		}
	}
	return false
}

// localOwner returns the local pod holding ip, if any.
func (c *claims) localOwner(ip netip.Addr) (types.UID, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, ok := c.local[ip]
	return u, ok
}
