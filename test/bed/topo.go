package bed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Bed is a set of nodes and pods; Close removes all of it.
type Bed struct {
	ID     string // random, part of every name
	Cgroup *Cgroup

	mu      sync.Mutex
	nodes   []*Node
	closers []func() error
}

// New creates an empty bed with its own cgroup under the cgroup2 root.
func New() (*Bed, error) {
	id := RandSuffix(5)
	cg, err := NewCgroup("", "draind-bed-"+id)
	if err != nil {
		return nil, err
	}
	return &Bed{ID: id, Cgroup: cg}, nil
}

// OnClose registers fn to run (in reverse order) when the bed closes.
func (b *Bed) OnClose(fn func() error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closers = append(b.closers, fn)
}

// Close stops every process and removes namespaces and cgroups.
func (b *Bed) Close() error {
	b.mu.Lock()
	closers := b.closers
	b.closers = nil
	b.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		errs = append(errs, closers[i]())
	}
	errs = append(errs, b.Cgroup.Remove())
	return errors.Join(errs...)
}

// Node is a "node": a network namespace with the node IP on lo, routed
// veths to its pods, and a pods cgroup (the kubepods of a real node).
type Node struct {
	Bed   *Bed
	Index int
	Name  string
	NS    *NetNS
	// IP4 and IP6 are the node's addresses (on lo): pods reach the node's
	// draind here, as HOST_IP.
	IP4, IP6 netip.Addr
	// ServiceCIDR4/6 are routed into lo so that the node's own processes
	// can reach ClusterIPs (a real node uses its default route).
	// PodCIDR4/6 hold this node's pod addresses.
	PodCIDR4, PodCIDR6 netip.Prefix
	// Pods is the node's pods cgroup: draind attaches here.
	Pods *Cgroup

	mu    sync.Mutex
	npods int // veth names
	nips  int // address allocation
}

// The Service (ClusterIP) ranges of every bed.
var (
	ServiceCIDR4 = netip.MustParsePrefix("10.96.0.0/16")
	ServiceCIDR6 = netip.MustParsePrefix("fd00:96::/112")
)

// gatewayV4 is the on-link next hop every pod uses (proxy ARP answers it),
// as in routed CNIs; gatewayV6 is the node-side link-local address.
var (
	gatewayV4 = netip.MustParseAddr("169.254.1.1")
	gatewayV6 = netip.MustParseAddr("fe80::1")
)

// AddNode creates node number len(nodes): IPs 172.30.0.N+1 / fd00:30::N+1,
// pods 10.244.N.0/24 / fd00:244:N::/64.
func (b *Bed) AddNode(name string) (*Node, error) {
	b.mu.Lock()
	idx := len(b.nodes)
	b.mu.Unlock()
	ns, err := NewNetNS(fmt.Sprintf("db%s-%s", b.ID, name))
	if err != nil {
		return nil, err
	}
	b.OnClose(ns.Close)
	pods, err := b.Cgroup.Child(name + "-kubepods")
	if err != nil {
		return nil, err
	}
	n := &Node{
		Bed: b, Index: idx, Name: name, NS: ns, Pods: pods,
		IP4:      netip.AddrFrom4([4]byte{172, 30, 0, byte(idx + 1)}),
		IP6:      netip.MustParseAddr(fmt.Sprintf("fd00:30::%x", idx+1)),
		PodCIDR4: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(idx), 0}), 24),
		PodCIDR6: netip.MustParsePrefix(fmt.Sprintf("fd00:244:%x::/64", idx)),
	}
	h, err := ns.Handle()
	if err != nil {
		return nil, err
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return nil, err
	}
	for _, a := range []netip.Addr{n.IP4, n.IP6} {
		if err := h.AddrAdd(lo, addrOf(a)); err != nil {
			return nil, fmt.Errorf("adding node address %s: %w", a, err)
		}
	}
	for _, p := range []netip.Prefix{ServiceCIDR4, ServiceCIDR6} {
		if err := h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(p), Scope: netlink.SCOPE_LINK}); err != nil {
			return nil, fmt.Errorf("routing service range %s: %w", p, err)
		}
	}
	b.mu.Lock()
	prev := append([]*Node(nil), b.nodes...)
	b.nodes = append(b.nodes, n)
	b.mu.Unlock()
	for _, o := range prev {
		if err := connectNodes(o, n); err != nil {
			return nil, err
		}
	}
	return n, nil
}

// Nodes returns the nodes in creation order.
func (b *Bed) Nodes() []*Node {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*Node(nil), b.nodes...)
}

func addrOf(a netip.Addr) *netlink.Addr {
	return &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, a.BitLen())), Flags: unix.IFA_F_NODAD}
}

// linkLocal is node i's address on inter-node links.
func linkLocal(i int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fe80::%x", i+1)) }

func addrOf6LL(i int) *netlink.Addr {
	return &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(linkLocal(i), 64)), Flags: unix.IFA_F_NODAD}
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// connectNodes joins two nodes with a veth and routes each one's node IPs
// and pod CIDRs over it, as a flat routed cluster network would.
func connectNodes(a, b *Node) error {
	an, bn := fmt.Sprintf("n%d-%d", a.Index, b.Index), fmt.Sprintf("n%d-%d", b.Index, a.Index)
	if err := vethPair(a.NS, an, b.NS, bn); err != nil {
		return err
	}
	for _, side := range []struct {
		self, peer *Node
		dev        string
	}{{a, b, an}, {b, a, bn}} {
		h, err := side.self.NS.Handle()
		if err != nil {
			return err
		}
		l, err := h.LinkByName(side.dev)
		if err != nil {
			h.Close()
			return err
		}
		// IPv4: the peer's node address is on-link (Linux answers ARP for
		// any local address); IPv6: next hop is the peer's link-local
		// address on this veth, since NDP only answers for addresses on
		// the asking interface.
		if err := h.AddrAdd(l, addrOf6LL(side.self.Index)); err != nil {
			h.Close()
			return fmt.Errorf("adding link-local address on %s: %w", side.dev, err)
		}
		peerLL := linkLocal(side.peer.Index)
		for _, r := range []struct {
			dst netip.Prefix
			gw  netip.Addr
		}{
			{netip.PrefixFrom(side.peer.IP4, 32), netip.Addr{}},
			{side.peer.PodCIDR4, side.peer.IP4},
			{netip.PrefixFrom(side.peer.IP6, 128), peerLL},
			{side.peer.PodCIDR6, peerLL},
		} {
			route := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(r.dst)}
			if r.gw.IsValid() {
				route.Gw = r.gw.AsSlice()
				route.Flags = int(netlink.FLAG_ONLINK)
			} else {
				route.Scope = netlink.SCOPE_LINK
			}
			if err := h.RouteAdd(route); err != nil {
				h.Close()
				return fmt.Errorf("routing %s via %s on %s: %w", r.dst, side.dev, side.self.Name, err)
			}
		}
		h.Close()
	}
	return nil
}

// vethPair creates a veth with one end in each namespace, both up.
func vethPair(ans *NetNS, aname string, bns *NetNS, bname string) error {
	ha, err := ans.Handle()
	if err != nil {
		return err
	}
	defer ha.Close()
	hb, err := bns.Handle()
	if err != nil {
		return err
	}
	defer hb.Close()
	bh, err := bns.nsHandle()
	if err != nil {
		return err
	}
	defer bh.Close()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aname}, PeerName: bname, PeerNamespace: netlink.NsFd(int(bh))}
	if err := ha.LinkAdd(v); err != nil {
		return fmt.Errorf("creating veth %s/%s: %w", aname, bname, err)
	}
	for _, x := range []struct {
		h    *netlink.Handle
		name string
	}{{ha, aname}, {hb, bname}} {
		l, err := x.h.LinkByName(x.name)
		if err != nil {
			return err
		}
		if err := x.h.LinkSetUp(l); err != nil {
			return fmt.Errorf("bringing up %s: %w", x.name, err)
		}
	}
	return nil
}
