package model

import (
	"cmp"
	"slices"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// ServicePortStatus is an active service-port as the status view shows it:
// the id the datapath's maps name it by (what `draind bpf dump` prints),
// the Service port it is, what it steers to, and why it is active.
type ServicePortStatus struct {
	ID       bpf.ServicePortID
	Service  string // namespace/name
	Port     string // the Service port's name
	Protocol bpf.Protocol
	Family   k8s.Family
	// Frontends are its ClusterIP:port keys (written while it has
	// selectable endpoints); Selectable how many endpoints a steered
	// connection may be sent to.
	Frontends  []bpf.EndpointKey
	Selectable int
	// Draining are the keys of its draining endpoints, those no trusted
	// slice identifies included (they steer its frontends, with no entry
	// of their own); Lingering the keys of its departed endpoints still
	// steered. Either keeps it active, whether or not another pod's claim
	// of the address voids the entry. Sorted.
	Draining, Lingering []bpf.EndpointKey
}

// ServicePortStatuses returns the active service-ports, sorted by Service,
// port, protocol and family.
func (m *Model) ServicePortStatuses() []ServicePortStatus {
	byID := make(map[bpf.ServicePortID]*ServicePortStatus, len(m.servicePorts))
	out := make([]ServicePortStatus, 0, len(m.servicePorts))
	for id, sp := range m.servicePorts {
		out = append(out, ServicePortStatus{ID: id, Service: sp.key.Service, Port: sp.key.Port, Protocol: sp.key.Proto,
			Family: sp.key.Family, Frontends: slices.Clone(sp.frontends), Selectable: sp.selectable.Len()})
	}
	for i := range out {
		byID[out[i].ID] = &out[i]
	}
	for k, cs := range m.contributions {
		for _, c := range cs {
			st := byID[c.servicePort]
			switch {
			case st == nil:
			case c.kind == fromLinger:
				st.Lingering = append(st.Lingering, k)
			default:
				st.Draining = append(st.Draining, k)
			}
		}
	}
	for i := range out {
		slices.SortFunc(out[i].Draining, bpf.EndpointKey.Compare)
		slices.SortFunc(out[i].Lingering, bpf.EndpointKey.Compare)
	}
	slices.SortFunc(out, func(a, b ServicePortStatus) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Family, b.Family))
	})
	return out
}
