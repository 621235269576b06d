package model

import (
	"cmp"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/internal/backendset"
	"github.com/draind/draind/daemon/reconcile"
)

// What the kernel gets: the model's contributions merged into one drain
// entry per key, and the frontends and backends of active service-ports.

// desiredDrain merges the contributions of one key: the most cautious
// policy wins, the entry lives as long as its longest-lived contribution.
func (m *Model) desiredDrain(k bpf.EndpointKey, now time.Time) (bpf.Drain, bool) {
	d := bpf.Drain{Key: k, Policy: bpf.PolicyRewrite}
	found := false
	for _, c := range m.contributions[k] {
		if c.frontendOnly || m.suppressed(c, k.Addr) {
			continue
		}
		p, rewriteTo := m.effectivePolicy(c)
		if !m.steersPodIP(c, k.Addr) {
			p = bpf.PolicyOff // reachable at its IP: only its VIPs steer away
		}
		if rewriteTo != 0 && (d.Service == 0 || m.rewritesFirst(rewriteTo, d.Service)) {
			d.Service = rewriteTo // kept for accounting when another policy wins
		}
		if !found || p > d.Policy {
			d.Policy = p
		}
		if e := m.entryExpiry(k, c, now); e.After(d.Expires) {
			d.Expires = e
		}
		found = true
	}
	return d, found
}

// rewritesFirst reports whether service-port a comes before b in the order
// of their keys (Service, port name, protocol, family): of several
// service-ports a key's entry could rewrite to, it rewrites to the first,
// whatever order their ids were allocated in.
func (m *Model) rewritesFirst(a, b bpf.ServicePortID) bool {
	sa, sb := m.servicePorts[a], m.servicePorts[b]
	if sa == nil || sb == nil {
		return a < b
	}
	ka, kb := sa.key, sb.key
	return cmp.Or(strings.Compare(ka.Service, kb.Service), strings.Compare(ka.Port, kb.Port),
		cmp.Compare(ka.Proto, kb.Proto), cmp.Compare(ka.Family, kb.Family)) < 0
}

// steersPodIP reports whether a contribution may steer connections made
// straight to its pod's IP. While a pod exists and has not asked to go
// offline, a direct connection to its IP reaches it (the Kubernetes network
// model): only a pod drain that says so (an offline call, an opted-in
// workload, a pod that is gone) or a linger (the pod left every slice)
// steers its address. A Service's VIP steers away from any draining
// endpoint all the same.
//
// A linger (an endpoint that drained and left every slice of a Service)
// means the pod is gone, unless the cluster's records show the same pod
// still serving at the IP: it only left that Service, or the slice that
// listed it was withdrawn (a forged one the EndpointSlice controller
// removed). Such a linger passes, whatever its Service's policy.
func (m *Model) steersPodIP(c contribution, ip netip.Addr) bool {
	if c.kind == fromLinger {
		return !m.claims.StillServes(ip, c.uid)
	}
	d := m.podDrains[c.uid]
	return d != nil && d.SteerPodIP
}

// effectivePolicy is what one contribution asks for, given whether its
// service-port has somewhere to rewrite to, and the service-port it would
// rewrite to (0: none).
func (m *Model) effectivePolicy(c contribution) (bpf.Policy, bpf.ServicePortID) {
	p := c.policy
	if c.servicePort == 0 {
		if p == bpf.PolicyRewrite {
			return bpf.PolicyRefuse, 0 // nothing to rewrite to
		}
		return p, 0
	}
	if p == bpf.PolicyOff {
		return p, 0
	}
	sp := m.servicePorts[c.servicePort]
	hasAlternative := sp != nil && len(sp.selectable) > 0
	switch {
	case hasAlternative && p == bpf.PolicyRewrite:
		return p, c.servicePort
	case !hasAlternative && c.kind == fromLinger:
		// The pod is gone and nothing can take its place: failing fast
		// beats a connect into a dead address.
		return bpf.PolicyRefuse, 0
	case !hasAlternative:
		// Never take away the last serving endpoints.
		return bpf.PolicyOff, 0
	}
	return p, 0
}

// entryExpiry bounds the entry one contribution asks for: EntryTTL from now
// (refreshed while it lasts), the end of a linger, or a Lease's expiry.
func (m *Model) entryExpiry(k bpf.EndpointKey, c contribution, now time.Time) time.Time {
	e := now.Add(m.cfg.EntryTTL)
	if c.kind == fromLinger {
		if l := m.lingering[k]; l != nil && l.until.Before(e) {
			e = l.until
		}
	}
	if !c.expires.IsZero() && c.expires.Before(e) {
		e = c.expires
	}
	return e
}

// desiredServicePort returns the frontends and backends of an active
// service-port (nil backends: the service-port is not active). The backend
// addresses are left packed (be.Backends nil, the service-port's
// selectable set): the writer unpacks the few sets a pass writes.
func (m *Model) desiredServicePort(id bpf.ServicePortID, now time.Time) (fes []bpf.Frontend, be *bpf.Backends) {
	sp := m.servicePorts[id]
	if sp == nil || sp.refs == 0 {
		return nil, nil
	}
	exp := now.Add(m.cfg.EntryTTL)
	if len(sp.selectable) == 0 {
		return nil, &bpf.Backends{Service: id, Expires: exp}
	}
	for _, k := range sp.frontends {
		fes = append(fes, bpf.Frontend{Key: k, Service: id, NoSteer: sp.noSteer, Expires: exp})
	}
	return fes, &bpf.Backends{Service: id, Expires: exp}
}

// KeysOf returns the entry keys contributed for each of the given pods,
// found through their IPs (a drained pod's Lease or endpoints name them).
func (m *Model) KeysOf(uids []types.UID) map[types.UID][]bpf.EndpointKey {
	out := make(map[types.UID][]bpf.EndpointKey, len(uids))
	for _, uid := range uids {
		var keys []bpf.EndpointKey
		var ips []netip.Addr
		if d := m.podDrains[uid]; d != nil {
			ips = d.IPs
		}
		for _, ip := range ips {
			for _, k := range m.byIP[ip] {
				for _, c := range m.contributions[k] {
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

// PodStatus is one drained pod as the model knows it: the status view's
// part that no node's measurements make.
type PodStatus struct {
	Namespace, Name, UID string
	IPs                  []string
	Reason               string
	Since, Deadline      time.Time
	// Lingering: every entry of the pod lingers (it departed, or its
	// drain says it is gone); else it drains.
	Lingering bool
	Entries   []bpf.EndpointKey // sorted; the status view formats them
}

// PodStatuses groups the live contributions by pod into status rows
// (without this node's measurements), sorted by pod name.
func (m *Model) PodStatuses() []PodStatus {
	type row struct {
		PodStatus
		keys           []bpf.EndpointKey
		ips            []netip.Addr
		ports, lingers int // per-port contributions, and of those lingering
	}
	by := map[types.UID]*row{}
	for k, cs := range m.contributions {
		for _, c := range cs {
			if c.frontendOnly || m.suppressed(c, k.Addr) {
				continue
			}
			id := c.uid
			if id == "" {
				id = types.UID("ip:" + k.Addr.String())
			}
			r := by[id]
			if r == nil {
				r = &row{PodStatus: PodStatus{UID: string(c.uid), Reason: c.reason, Since: c.since}}
				r.Namespace, r.Name = splitPod(c.pod)
				by[id] = r
			}
			if c.since.Before(r.Since) {
				r.Since = c.since
			}
			if c.kind == fromServicePort && r.Reason == ReasonDeparted {
				r.Reason = c.reason
			}
			if k.Port != 0 {
				r.ports++
				if c.kind == fromLinger {
					r.lingers++
				}
			}
			if !slices.Contains(r.keys, k) {
				r.keys = append(r.keys, k)
			}
			if !slices.Contains(r.ips, k.Addr) {
				r.ips = append(r.ips, k.Addr)
			}
		}
	}
	out := make([]PodStatus, 0, len(by))
	for uid, r := range by {
		departed := r.Reason == ReasonDeparted || (r.ports > 0 && r.lingers == r.ports)
		if d := m.podDrains[uid]; d != nil {
			r.Reason, r.Deadline = d.Reason, d.Expires
			if d.Since.Before(r.Since) {
				r.Since = d.Since
			}
			departed = departed || d.State == StateGone
		}
		r.Lingering = departed
		slices.SortFunc(r.keys, bpf.EndpointKey.Compare)
		slices.SortFunc(r.ips, netip.Addr.Compare)
		for _, ip := range r.ips {
			r.IPs = append(r.IPs, ip.String())
		}
		r.Entries = r.keys
		out = append(out, r.PodStatus)
	}
	slices.SortFunc(out, func(a, b PodStatus) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out
}

// Desired returns the model as the reconciler reads it.
func (m *Model) Desired() reconcile.Desired { return desiredView{m} }

// desiredView is the model's view for the reconciler.
type desiredView struct{ m *Model }

func (v desiredView) ServicePort(id bpf.ServicePortID, now time.Time) ([]bpf.Frontend, *bpf.Backends, backendset.Set) {
	fes, be := v.m.desiredServicePort(id, now)
	if be == nil {
		return fes, nil, ""
	}
	return fes, be, v.m.servicePorts[id].selectable
}

func (v desiredView) Drain(k bpf.EndpointKey, now time.Time) (bpf.Drain, bool) {
	return v.m.desiredDrain(k, now)
}

func (v desiredView) ServicePorts() iter.Seq[bpf.ServicePortID] { return maps.Keys(v.m.servicePorts) }
func (v desiredView) HasServicePort(id bpf.ServicePortID) bool  { return v.m.servicePorts[id] != nil }
func (v desiredView) Keys() iter.Seq[bpf.EndpointKey]           { return maps.Keys(v.m.contributions) }

func (v desiredView) HasKey(k bpf.EndpointKey) bool {
	_, ok := v.m.contributions[k]
	return ok
}

func (v desiredView) Touched() (map[bpf.ServicePortID]struct{}, map[bpf.EndpointKey]struct{}) {
	return v.m.touchedServicePorts, v.m.touched
}

// splitPod splits a namespace/name.
func splitPod(s string) (string, string) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", s
	}
	return ns, name
}
