package model

import (
	"fmt"
	"iter"
	"maps"
	"net/netip"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/internal/backendset"
)

// Audit: read-only views of the model's incremental state that only the
// daemon's sequence differential test reads (FuzzSequenceDifferential, in
// package daemon): the service-ports behind their allocation-order ids,
// the service-port each contribution names, the lingering keys, and what
// lingering keeps selectable. No view the daemon reads (Desired, Gone,
// PodStatuses) shows them, and a test of another package can read the
// model's state only through exported methods. Like every read of the
// model, on the goroutine that owns it.

// ServicePort is an allocated service-port as the audit sees it.
type ServicePort struct {
	// Name is the service-port's key (Service, port, protocol, family),
	// which, unlike its id, does not depend on allocation order.
	Name    string
	Service string // namespace/name
}

// ServicePorts returns the active service-ports by id.
func (m *Model) ServicePorts() map[bpf.ServicePortID]ServicePort {
	out := make(map[bpf.ServicePortID]ServicePort, len(m.servicePorts))
	for id, sp := range m.servicePorts {
		out[id] = ServicePort{Name: fmt.Sprintf("%v", sp.key), Service: sp.key.Service}
	}
	return out
}

// ContributionRefs yields each key with a contribution and the
// service-port that contribution names (0: a pod drain's all-ports entry).
func (m *Model) ContributionRefs() iter.Seq2[bpf.EndpointKey, bpf.ServicePortID] {
	return func(yield func(bpf.EndpointKey, bpf.ServicePortID) bool) {
		for k, cs := range m.contributions {
			for _, c := range cs {
				if !yield(k, c.servicePort) {
					return
				}
			}
		}
	}
}

// LingeringKeys yields the keys of departed endpoints still steered.
func (m *Model) LingeringKeys() iter.Seq[bpf.EndpointKey] { return maps.Keys(m.lingering) }

// CheckSelectable checks what a comparison with a fresh model cannot see
// of the service-ports only lingering entries keep active: every active
// service-port selects the endpoints its Service lists as selectable now
// (none if it lists none), as a linger rewrites to them.
func (m *Model) CheckSelectable() error {
	for id, sp := range m.servicePorts {
		var want []netip.AddrPort
		if svc := m.state.Service(sp.key.Service); svc != nil {
			cat := categorize(svc, m.state.SlicesOf(sp.key.Service), m.drainsByPod, place{m.cfg.Node, m.cfg.Zone}, nil)
			for _, c := range cat.servicePorts {
				if c.key == sp.key {
					want = c.selectable
				}
			}
		}
		if sp.selectable != backendset.Pack(want) {
			return fmt.Errorf("service-port %d %v selects %v, its Service lists %v selectable",
				id, sp.key, sp.selectable.AppendAddrPorts(nil), want)
		}
	}
	return nil
}
