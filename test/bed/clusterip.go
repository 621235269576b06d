package bed

import (
	"net/netip"
	"strings"
)

// ClusterIP is a kube-proxy-style Service VIP in a node namespace: new
// connections to VIP are spread over the backends by DNAT rules with
// kube-proxy's iptables-mode structure (see NAT), in a table of its own.
type ClusterIP struct {
	NS    *NetNS
	VIP   netip.AddrPort
	Proto string // "tcp" or "udp"
	nat   *NAT
}

// NewClusterIP installs the VIP with the given backends.
func NewClusterIP(ns *NetNS, vip netip.AddrPort, proto string, backends []netip.AddrPort) (*ClusterIP, error) {
	nat, err := NewNAT(ns, "bed_svc_"+strings.ToLower(RandSuffix(8)), vip.Addr().Is6())
	if err != nil {
		return nil, err
	}
	c := &ClusterIP{NS: ns, VIP: vip, Proto: proto, nat: nat}
	if err := c.SetBackends(backends); err != nil {
		nat.Close()
		return nil, err
	}
	return c, nil
}

// SetBackends rewrites the rules to spread over backends (what a kube-proxy
// sync does when the endpoints change).
func (c *ClusterIP) SetBackends(backends []netip.AddrPort) error {
	return c.nat.Sync([]NATService{{VIP: c.VIP, Proto: c.Proto, Endpoints: backends}})
}

// Close removes the rules (the namespace going away removes them too).
func (c *ClusterIP) Close() error { return c.nat.Close() }
