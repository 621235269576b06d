package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
)

// FlowLister lists the flows of one endpoint. Netlink and
// conntracktest.Fake implement it; it is not part of Interface, so other
// implementations need not.
type FlowLister interface {
	// EndpointFlows returns the flows of protocol proto whose reply-direction
	// source is addr (the pod that serves them), from one kernel-filtered
	// dump: what a client socket connected to a Service VIP cannot tell,
	// which pod its flow was translated to.
	EndpointFlows(ctx context.Context, addr netip.Addr, proto Proto) ([]Flow, error)
}

var _ FlowLister = (*Netlink)(nil)

// EndpointFlows implements FlowLister.
func (n *Netlink) EndpointFlows(ctx context.Context, addr netip.Addr, proto Proto) ([]Flow, error) {
	if !addr.IsValid() {
		return nil, errors.New("listing flows: address is not set")
	}
	addr = addr.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	dump, _, err := n.sockets()
	if err != nil {
		return nil, fmt.Errorf("listing flows of %s: %w", addr, err)
	}
	kf := kernelFilter{replySrc: addr, proto: proto, zone: n.zone}
	if addr.Is6() {
		kf.noAddr = !n.ipv6AddrFilter(ctx)
		if dump, _, err = n.sockets(); err != nil {
			return nil, fmt.Errorf("listing flows of %s: %w", addr, err)
		}
	}
	var out []Flow
	err = n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
		if ent.Proto == proto && CountedFor(n.zone, addr, ent.Flow) {
			out = append(out, ent.Flow)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing flows of %s: %w", addr, err)
	}
	return out, nil
}
