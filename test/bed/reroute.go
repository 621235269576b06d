package bed

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
)

// RouteVia routes the IPv4 addresses addrs from n to peer (over the veth
// that joins them), ahead of any route of their prefix: a pod address
// that a VPC-native CNI (or an IPAM block lent to another node) gives to a
// pod of peer, whatever node's pod CIDR it came from.
func (n *Node) RouteVia(peer *Node, addrs ...netip.Addr) error {
	h, err := n.NS.Handle()
	if err != nil {
		return err
	}
	defer h.Close()
	dev := fmt.Sprintf("n%d-%d", n.Index, peer.Index)
	l, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("routing via %s on %s: %w", peer.Name, n.Name, err)
	}
	for _, a := range addrs {
		if !a.Is4() {
			return fmt.Errorf("routing %s via %s: IPv4 only", a, peer.Name)
		}
		r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(a, 32)),
			Gw: peer.IP4.AsSlice(), Flags: int(netlink.FLAG_ONLINK)}
		if err := h.RouteReplace(r); err != nil {
			return fmt.Errorf("routing %s via %s on %s: %w", a, dev, n.Name, err)
		}
	}
	return nil
}
