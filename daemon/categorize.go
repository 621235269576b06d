package daemon

import (
	"net/netip"
	"slices"
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
	listed map[bpf.EndpointKey]types.UID
	// drainedPods are the listed pods that have a pod drain.
	drainedPods map[types.UID]struct{}
}

// listing is one endpoint's listings merged: an endpoint may appear in
// several slices while they are rebalanced; it drains if any listing says
// so and is selectable only if every listing allows it.
type listing struct {
	uid        types.UID
	pod        string
	draining   bool
	identified bool // a trusted slice lists it
	selectable bool
	reason     string
	expires    time.Time
}

// categorize categorises the endpoints of svc's slices for every service
// port and family. node is this node (internalTrafficPolicy Local selects
// only its endpoints); drains are the pod drains by pod UID.
func categorize(svc *k8s.Service, sliceList []*k8s.Slice, drains map[types.UID]*podDrain, node string) categorized {
	out := categorized{listed: map[bpf.EndpointKey]types.UID{}, drainedPods: map[types.UID]struct{}{}}
	key := svc.Namespace + "/" + svc.Name
	for _, sp := range svc.Ports {
		for _, fam := range []k8s.Family{k8s.IPv4, k8s.IPv6} {
			eps := map[netip.AddrPort]*listing{}
			for _, sl := range sliceList {
				if port := targetPort(sl, fam, sp); port != 0 {
					listEndpoints(svc, sl, port, sp.Protocol, drains, node, eps, &out)
				}
			}
			if len(eps) == 0 {
				continue
			}
			c := servicePortEndpoints{key: servicePortKey{key, sp.Name, sp.Protocol, fam}}
			for ap, l := range eps {
				if l.selectable {
					c.selectable = append(c.selectable, ap)
				}
				if l.draining {
					c.draining = append(c.draining, drainingEndpoint{key: endpointKey(ap, sp.Protocol),
						uid: l.uid, pod: l.pod, reason: l.reason, expires: l.expires, identified: l.identified})
				}
			}
			slices.SortFunc(c.selectable, netip.AddrPort.Compare)
			slices.SortFunc(c.draining, func(a, b drainingEndpoint) int { return a.key.Compare(b.key) })
			for _, vip := range svc.ClusterIPs {
				if familyOf(vip) == fam {
					c.frontends = append(c.frontends, bpf.EndpointKey{Addr: vip, Port: sp.Port, Proto: sp.Protocol})
				}
			}
			out.servicePorts = append(out.servicePorts, c)
		}
	}
	return out
}

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

// listEndpoints merges the endpoints of one slice at port into eps.
//
// Only a trusted slice (the EndpointSlice controller's, for a Service with a
// selector) says whose an endpoint is: its endpoints with a Pod of the
// Service's namespace may drain (and so be steered by pod IP, expired,
// lingered). Any other slice (hand-written,
// mirrored) only adds selectable endpoints, as kube-proxy routes to them:
// what a tenant writes never changes where connections to a pod IP go.
func listEndpoints(svc *k8s.Service, sl *k8s.Slice, port uint16, proto bpf.Protocol, drains map[types.UID]*podDrain,
	node string, eps map[netip.AddrPort]*listing, out *categorized) {
	trusted := sl.Trusted(svc)
	for i := range sl.Len() {
		e := sl.Endpoint(i)
		ap := netip.AddrPortFrom(e.Addr, port)
		identified := trusted && e.PodUID != ""
		var pd *podDrain
		if identified {
			pd = drains[e.PodUID]
		}
		draining := !e.Ready() || pd != nil
		selectable := !draining && (!svc.InternalLocal || e.Node == node)
		l, ok := eps[ap]
		if !ok {
			l = &listing{selectable: selectable}
			eps[ap] = l
		}
		l.selectable = l.selectable && selectable
		if identified {
			if !l.identified {
				l.identified, l.uid, l.pod = true, e.PodUID, svc.Namespace+"/"+e.PodName
			}
			out.listed[endpointKey(ap, proto)] = e.PodUID
			if pd != nil {
				out.drainedPods[e.PodUID] = struct{}{}
			}
		}
		if !draining {
			continue
		}
		if !l.draining {
			l.draining, l.reason = true, drainReason(&e, pd)
			if e.Ready() && pd != nil {
				l.expires = pd.Expires
			}
		} else if !e.Ready() {
			l.expires = time.Time{}
		}
	}
}

// drainReason says why a listed endpoint drains.
func drainReason(e *k8s.Endpoint, pd *podDrain) string {
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

func familyOf(a netip.Addr) k8s.Family {
	if a.Is4() {
		return k8s.IPv4
	}
	return k8s.IPv6
}
