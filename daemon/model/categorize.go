package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// Categorisation: which endpoints of a Service are selectable, which are
// draining and why. Like kube-proxy's CategorizeEndpoints it is a pure
// function of the Service, its slices and the pod drains: no I/O, no model
// state, table-tested on its own (categorize_test.go). The model
// (model.go) only records and applies what it returns.

// servicePortKey names a service-port of one family: the unit that owns a
// selectable backend set.
type servicePortKey struct {
	Service string // namespace/name
	Port    string // the service port's name
	Proto   bpf.Protocol
	Family  k8s.Family
}

// drainingEndpoint is one endpoint of a service-port that must receive no
// new connections.
type drainingEndpoint struct {
	key    bpf.EndpointKey
	uid    types.UID // the pod, "" without a Pod targetRef
	pod    string    // namespace/name
	reason string
	// expires bounds a drain that only a pod drain with a deadline (a
	// Lease) causes: if nobody renews the Lease, steering ends with it.
	// Zero when the slice itself says the endpoint is not ready.
	expires time.Time
	// identified: a trusted slice says whose it is. An endpoint only a
	// hand-written (or mirrored) slice lists is steered away from on its
	// Service's VIP, as kube-proxy would, but its address is never acted
	// on (no pod-IP entry, no conntrack expiry, no linger).
	identified bool
}

// servicePortEndpoints is the categorisation of one service-port.
type servicePortEndpoints struct {
	key        servicePortKey
	frontends  []bpf.EndpointKey  // the ClusterIPs of the family, at the service port
	selectable []netip.AddrPort   // ready, not draining, allowed by the traffic policy; sorted
	draining   []drainingEndpoint // sorted by key
}

// categorized is the categorisation of one Service.
type categorized struct {
	servicePorts []servicePortEndpoints // those with at least one endpoint
	// listed is every endpoint the slices list, with its pod (an endpoint
	// that is listed again, ready, has not departed).
	listed listedEndpoints
	// drainedPods are the listed pods that have a pod drain (nil: none;
	// the model keeps it for every Service with a draining endpoint).
	drainedPods map[types.UID]struct{}
}

func (c *categorized) addDrainedPod(uid types.UID) {
	if c.drainedPods == nil {
		c.drainedPods = map[types.UID]struct{}{}
	}
	c.drainedPods[uid] = struct{}{}
}

// catScratch is categorize's space, reused from call to call.
type catScratch struct {
	listed     listedEndpoints
	selectable []netip.AddrPort
	hints      []uint8 // the selectable endpoints' k8s.Hint bits
}

// place is where categorize selects backends for: this node and its zone
// (its topology.kubernetes.io/zone label, "" if it has none).
type place struct {
	node, zone string
}

// listedEndpoint is an identified endpoint and its pod.
type listedEndpoint struct {
	key bpf.EndpointKey
	pod k8s.PodKey
}

// listedEndpoints are sorted by key, once each.
type listedEndpoints []listedEndpoint

// podOf returns the pod listed at k.
func (l listedEndpoints) podOf(k bpf.EndpointKey) (k8s.PodKey, bool) {
	i, ok := slices.BinarySearchFunc(l, k, func(e listedEndpoint, k bpf.EndpointKey) int { return e.key.Compare(k) })
	if !ok {
		return k8s.PodKey{}, false
	}
	return l[i].pod, true
}

// listing is one endpoint's listings merged: an endpoint may appear in
// several slices while they are rebalanced; it drains if any listing says
// so and is selectable only if every listing allows it.
type listing struct {
	ap       netip.AddrPort
	draining bool
	// named is the first listing of a trusted slice (nil: none): it
	// names the pod.
	named      *oneListing
	listedPod  k8s.PodKey // the pod named names
	selectable bool
	hints      uint8 // the first listing's k8s.Hint bits (topology.go)
	reason     string
	expires    time.Time
}

// oneListing is one slice's listing of an endpoint, before merging. It
// refers to the endpoint in its slice: the pod's UID and name are only
// read (as strings, which costs an allocation) for an endpoint that
// drains.
type oneListing struct {
	ap         netip.AddrPort
	sl         *k8s.Slice
	i          int
	identified bool
	pd         *PodDrain
}

// categorize categorises the endpoints of svc's slices for every service
// port and family. at is this node and its zone (internalTrafficPolicy
// Local selects only the node's endpoints, topology hints those kube-proxy
// would pick there: topology.go); drains are the pod drains by pod. The result's
// listing and selectable endpoints are in scratch's arrays (nil: new
// ones), valid until categorize is given scratch again.
//
// It runs for every slice update of the cluster (a thousand a second in a
// busy one), so it sorts and merges rather than building maps.
func categorize(svc *k8s.Service, sliceList []*k8s.Slice, drains map[k8s.PodKey]*PodDrain, at place, scratch *catScratch) categorized {
	n := 0
	for _, sl := range sliceList {
		n += sl.Len()
	}
	if scratch == nil {
		scratch = &catScratch{}
	}
	out := categorized{listed: slices.Grow(scratch.listed[:0], n)}
	selectable := slices.Grow(scratch.selectable[:0], n)
	hints := scratch.hints[:0]
	defer func() { scratch.listed, scratch.selectable, scratch.hints = out.listed, selectable, hints }()
	topo := usesHints(svc, sliceList)
	key := svc.Namespace + "/" + svc.Name
	// The listings are scratch space, reused from call to call.
	rp := rawListings.Get().(*[]oneListing)
	raw := slices.Grow((*rp)[:0], n)
	defer func() {
		clear(raw[:cap(raw)]) // no slices kept alive in the pool
		*rp = raw[:0]
		rawListings.Put(rp)
	}()
	for _, sp := range svc.Ports {
		for _, fam := range []k8s.Family{k8s.IPv4, k8s.IPv6} {
			raw = raw[:0]
			for _, sl := range sliceList {
				if port := targetPort(sl, fam, sp); port != 0 {
					raw = listEndpoints(svc, sl, port, drains, raw, &out)
				}
			}
			if len(raw) == 0 {
				continue
			}
			// In address order, the listings of one address in the order
			// the merge reads them (listingOrder).
			slices.SortFunc(raw, listingOrder)
			c := servicePortEndpoints{key: servicePortKey{key, sp.Name, sp.Protocol, fam}}
			first := len(selectable)
			hints = hints[:0]
			for i := 0; i < len(raw); {
				j := i + 1
				for j < len(raw) && raw[j].ap == raw[i].ap {
					j++
				}
				l := merge(svc, raw[i:j], at, topo)
				i = j
				if l.named != nil {
					out.listed = append(out.listed, listedEndpoint{endpointKey(l.ap, sp.Protocol), l.listedPod})
				}
				if l.selectable {
					selectable = append(selectable, l.ap)
					hints = append(hints, l.hints)
				}
				if l.draining {
					d := drainingEndpoint{key: endpointKey(l.ap, sp.Protocol), reason: l.reason, expires: l.expires}
					if l.named != nil {
						e := l.named.sl.Endpoint(l.named.i)
						d.uid, d.pod, d.identified = e.PodUID, svc.Namespace+"/"+e.PodName, true
					}
					c.draining = append(c.draining, d)
				}
			}
			if topo {
				selectable = selectable[:first+byTopology(selectable[first:], hints)]
			}
			c.selectable = selectable[first:len(selectable):len(selectable)]
			for _, vip := range svc.ClusterIPs {
				if k8s.FamilyOf(vip) == fam {
					c.frontends = append(c.frontends, bpf.EndpointKey{Addr: vip, Port: sp.Port, Proto: sp.Protocol})
				}
			}
			out.servicePorts = append(out.servicePorts, c)
		}
	}
	out.listed = latestListings(out.listed)
	return out
}

// latestListings sorts listed by key and keeps each key's last listing:
// two service-ports of one protocol may share a target port, and the later
// listing of a key wins. It reuses listed's array and clears what it drops
// (the scratch keeps no pod of another Service).
func latestListings(listed listedEndpoints) listedEndpoints {
	slices.SortStableFunc(listed, func(a, b listedEndpoint) int { return a.key.Compare(b.key) })
	last := listed[:0]
	for i, l := range listed {
		if i+1 < len(listed) && listed[i+1].key == l.key {
			continue
		}
		last = append(last, l)
	}
	clear(listed[len(last):])
	return last
}

var rawListings = sync.Pool{New: func() any { return new([]oneListing) }}

// targetPort is the port a slice of family fam resolves sp to (0: none).
func targetPort(sl *k8s.Slice, fam k8s.Family, sp k8s.ServicePort) uint16 {
	if sl.Family != fam {
		return 0
	}
	for _, p := range sl.Ports {
		if p.Name == sp.Name && p.Protocol == sp.Protocol {
			return p.Port
		}
	}
	return 0
}

// listEndpoints appends the listings of one slice at port to raw.
//
// Only a trusted slice (the EndpointSlice controller's, for a Service with a
// selector) says whose an endpoint is: its endpoints with a Pod of the
// Service's namespace may drain (and so be steered by pod IP, expired,
// lingered). Any other slice (hand-written,
// mirrored) only adds selectable endpoints, as kube-proxy routes to them:
// what a tenant writes never changes where connections to a pod IP go.
func listEndpoints(svc *k8s.Service, sl *k8s.Slice, port uint16, drains map[k8s.PodKey]*PodDrain,
	raw []oneListing, out *categorized) []oneListing {
	trusted := sl.Trusted(svc)
	for i := range sl.Len() {
		identified := trusted && sl.HasPod(i)
		var pd *PodDrain
		if identified && len(drains) > 0 {
			// A pod drain drains its pod's own IPs only: a listing of the
			// pod at another address is not the pod's (a Lease is honoured
			// for its pod's IPs alone).
			if pd = drains[sl.PodKey(i)]; pd != nil && !slices.Contains(pd.IPs, sl.Addr(i)) {
				pd = nil
			}
			if pd != nil {
				out.addDrainedPod(pd.UID)
			}
		}
		raw = append(raw, oneListing{ap: netip.AddrPortFrom(sl.Addr(i), port), sl: sl, i: i, identified: identified, pd: pd})
	}
	return raw
}

// draining reports whether the listing alone drains its endpoint.
func (o *oneListing) draining() bool {
	e := k8s.Endpoint{Conds: o.sl.Conds(o.i)} // the conditions alone
	return !e.Ready() || o.pd != nil
}

// listingOrder orders listings by address, and the listings of one
// address (an IP reused while the old pod's listing lingers in another
// slice, a pod moving between slices) by precedence: draining before not,
// identified before not, then by pod, slice name and position. The merge
// is then a function of the listings, not of the order the cache returns
// the slices in (kube-proxy's own merge keeps whichever listing its map
// yields first): the pod whose listing drains the endpoint is the one
// named, so a reused IP's drain is the old pod's, which the new pod's
// ready listing voids (claims.claimedByOther).
func listingOrder(a, b oneListing) int {
	if c := a.ap.Compare(b.ap); c != 0 {
		return c
	}
	if da, db := a.draining(), b.draining(); da != db {
		if da {
			return -1
		}
		return 1
	}
	if a.identified != b.identified {
		if a.identified {
			return -1
		}
		return 1
	}
	if c := a.sl.PodKey(a.i).Compare(b.sl.PodKey(b.i)); c != 0 {
		return c
	}
	if c := strings.Compare(a.sl.Name, b.sl.Name); c != 0 {
		return c
	}
	return cmp.Compare(a.i, b.i)
}

// merge merges the listings of one endpoint, in listingOrder: the first
// identified listing names the pod, the first draining one gives the
// reason, the first one the hints (when topo: the Service's slices have
// some).
func merge(svc *k8s.Service, ls []oneListing, at place, topo bool) listing {
	l := listing{ap: ls[0].ap, selectable: true}
	if topo {
		l.hints = ls[0].sl.HintsFor(ls[0].i, at.zone, at.node)
	}
	for i := range ls {
		o := &ls[i]
		e := k8s.Endpoint{Conds: o.sl.Conds(o.i)} // the conditions alone
		draining := o.draining()
		l.selectable = l.selectable && !draining && (!svc.InternalLocal || o.sl.Node(o.i) == at.node)
		if o.identified && l.named == nil {
			l.named, l.listedPod = o, o.sl.PodKey(o.i)
		}
		if !draining {
			continue
		}
		if !l.draining {
			l.draining, l.reason = true, drainReason(&e, o.pd)
			if e.Ready() && o.pd != nil {
				l.expires = o.pd.Expires
			}
		} else if !e.Ready() {
			l.expires = time.Time{}
		}
	}
	return l
}

// drainReason says why a listed endpoint drains.
func drainReason(e *k8s.Endpoint, pd *PodDrain) string {
	switch {
	case pd != nil:
		return pd.Reason
	case e.Terminating():
		return ReasonTerminating
	}
	return ReasonNotReady
}

func endpointKey(ap netip.AddrPort, proto bpf.Protocol) bpf.EndpointKey {
	return bpf.EndpointKey{Addr: ap.Addr(), Port: ap.Port(), Proto: proto}
}
