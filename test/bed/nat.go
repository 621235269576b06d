package bed

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// NATService is one Service VIP:port and the endpoints its new connections
// are spread over.
type NATService struct {
	VIP       netip.AddrPort
	Proto     string // "tcp" or "udp"
	Endpoints []netip.AddrPort
}

// NAT is a kube-proxy-like Service NAT table in a namespace, programmed over
// netlink (nftables): no iptables binary, no package to install.
//
// Its structure is kube-proxy's iptables mode written in nftables: the nat
// PREROUTING and OUTPUT hooks jump to a services chain that matches each
// VIP:port and jumps to that Service's chain, which DNATs a new connection to
// endpoint i with probability 1/(n-i) (numgen random, as kube-proxy's
// statistic rules) and to the last endpoint otherwise. Established
// connections keep their NAT binding in conntrack, as with kube-proxy.
type NAT struct {
	NS     *NetNS
	table  *nftables.Table
	family nftables.TableFamily
}

// NewNAT creates an empty NAT table named name (unique per namespace and
// family) for IPv4 (v6 false) or IPv6 Services.
func NewNAT(ns *NetNS, name string, v6 bool) (*NAT, error) {
	fam := nftables.TableFamilyIPv4
	if v6 {
		fam = nftables.TableFamilyIPv6
	}
	n := &NAT{NS: ns, family: fam, table: &nftables.Table{Name: name, Family: fam}}
	if err := n.Sync(nil); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *NAT) conn() (*nftables.Conn, func(), error) {
	h, err := n.NS.nsHandle()
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(h)))
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("opening nftables in netns %s: %w", n.NS.Name, err)
	}
	return c, func() { h.Close() }, nil
}

// Sync makes the table hold exactly svcs, in one netlink transaction (what
// kube-proxy's iptables-restore does): a new connection sees either the old
// rules or the new ones. A Service without endpoints gets no rule.
func (n *NAT) Sync(svcs []NATService) error {
	for _, s := range svcs {
		if s.VIP.Addr().Is6() != (n.family == nftables.TableFamilyIPv6) {
			return fmt.Errorf("programming NAT table %s: Service %s is of the other address family", n.table.Name, s.VIP)
		}
		if _, err := l4proto(s.Proto); err != nil {
			return fmt.Errorf("programming NAT table %s: Service %s: %w", n.table.Name, s.VIP, err)
		}
		for _, ep := range s.Endpoints {
			if ep.Addr().Is6() != s.VIP.Addr().Is6() {
				return fmt.Errorf("programming NAT table %s: endpoint %s of Service %s is of the other address family", n.table.Name, ep, s.VIP)
			}
		}
	}
	c, done, err := n.conn()
	if err != nil {
		return err
	}
	defer done()
	// "add; delete; add" replaces the table atomically whether or not it
	// existed before (the idiom of nft -f scripts).
	c.AddTable(n.table)
	c.DelTable(n.table)
	t := c.AddTable(n.table)
	services := c.AddChain(&nftables.Chain{Name: "services", Table: t})
	for _, hook := range []*nftables.ChainHook{nftables.ChainHookPrerouting, nftables.ChainHookOutput} {
		name := "prerouting"
		if hook == nftables.ChainHookOutput {
			name = "output"
		}
		base := c.AddChain(&nftables.Chain{Name: name, Table: t, Type: nftables.ChainTypeNAT,
			Hooknum: hook, Priority: nftables.ChainPriorityNATDest})
		c.AddRule(&nftables.Rule{Table: t, Chain: base, Exprs: []expr.Any{
			&expr.Verdict{Kind: expr.VerdictJump, Chain: services.Name},
		}})
	}
	for i, s := range svcs {
		if len(s.Endpoints) == 0 {
			continue // nothing to DNAT to (kube-proxy rejects in the filter table)
		}
		proto, _ := l4proto(s.Proto)
		svc := c.AddChain(&nftables.Chain{Name: fmt.Sprintf("svc-%d", i), Table: t})
		match := append(n.daddr(s.VIP.Addr()), l4Match(proto, s.VIP.Port())...)
		c.AddRule(&nftables.Rule{Table: t, Chain: services,
			Exprs: append(match, &expr.Verdict{Kind: expr.VerdictJump, Chain: svc.Name})})
		for j, ep := range s.Endpoints {
			var ex []expr.Any
			if left := len(s.Endpoints) - j; left > 1 {
				ex = append(ex,
					&expr.Numgen{Register: 1, Modulus: uint32(left), Type: unix.NFT_NG_RANDOM},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)})
			}
			ex = append(ex, n.dnat(ep)...)
			c.AddRule(&nftables.Rule{Table: t, Chain: svc, Exprs: ex})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("programming NAT table %s in netns %s: %w", n.table.Name, n.NS.Name, err)
	}
	return nil
}

// Close deletes the table (the namespace going away deletes it too).
func (n *NAT) Close() error {
	c, done, err := n.conn()
	if err != nil {
		return err
	}
	defer done()
	c.DelTable(n.table)
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("deleting NAT table %s in netns %s: %w", n.table.Name, n.NS.Name, err)
	}
	return nil
}

func (n *NAT) daddr(a netip.Addr) []expr.Any {
	off, l := uint32(16), uint32(4) // IPv4 header: destination address
	if a.Is6() {
		off, l = 24, 16
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: l},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a.AsSlice()},
	}
}

func (n *NAT) dnat(ep netip.AddrPort) []expr.Any {
	fam := uint32(unix.NFPROTO_IPV4)
	if ep.Addr().Is6() {
		fam = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: ep.Addr().AsSlice()},
		&expr.Immediate{Register: 2, Data: binaryutil.BigEndian.PutUint16(ep.Port())},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: fam, RegAddrMin: 1, RegProtoMin: 2},
	}
}

func l4proto(proto string) (byte, error) {
	switch proto {
	case "tcp", "":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp or udp", proto)
}

// l4Match matches the layer-4 protocol and destination port.
func l4Match(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

// SYNCounter counts the TCP SYNs (without ACK) that reach a namespace on one
// port, in the input hook, over netlink (nftables): what still arrives at a
// pod after its server stopped.
type SYNCounter struct {
	NS    *NetNS
	table *nftables.Table
	chain *nftables.Chain
}

// NewSYNCounter installs the counting rule in its own table (name unique per
// namespace). It counts and accepts nothing: other rules still apply.
func NewSYNCounter(ns *NetNS, name string, port uint16) (*SYNCounter, error) {
	s := &SYNCounter{NS: ns, table: &nftables.Table{Name: name, Family: nftables.TableFamilyINet}}
	n := &NAT{NS: ns, table: s.table}
	c, done, err := n.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	t := c.AddTable(s.table)
	policy := nftables.ChainPolicyAccept
	s.chain = c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &policy})
	ex := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1}, // TCP flags
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{0x12}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0x02}}, // SYN without ACK
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Counter{},
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: s.chain, Exprs: ex})
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("installing the SYN counter in netns %s: %w", ns.Name, err)
	}
	return s, nil
}

// Count returns the SYNs counted so far.
func (s *SYNCounter) Count() (uint64, error) {
	n := &NAT{NS: s.NS, table: s.table}
	c, done, err := n.conn()
	if err != nil {
		return 0, err
	}
	defer done()
	rules, err := c.GetRules(s.table, s.chain)
	if err != nil {
		return 0, fmt.Errorf("reading the SYN counter in netns %s: %w", s.NS.Name, err)
	}
	for _, r := range rules {
		if i := slices.IndexFunc(r.Exprs, func(e expr.Any) bool { _, ok := e.(*expr.Counter); return ok }); i >= 0 {
			return r.Exprs[i].(*expr.Counter).Packets, nil
		}
	}
	return 0, fmt.Errorf("reading the SYN counter in netns %s: no counting rule in table %s", s.NS.Name, s.table.Name)
}

// Close removes the counter (the namespace going away removes it too).
func (s *SYNCounter) Close() error {
	return (&NAT{NS: s.NS, table: s.table}).Close()
}
