package bed

import (
	"fmt"
	"net/netip"
	"strings"
)

// ClusterIP is a kube-proxy-style (iptables mode) Service VIP in a node
// namespace: a KUBE-SVC-like chain jumped to from PREROUTING and OUTPUT,
// spreading new connections over KUBE-SEP-like DNAT rules with the
// statistic module, exactly as kube-proxy writes them.
type ClusterIP struct {
	NS    *NetNS
	VIP   netip.AddrPort
	Proto string // "tcp" or "udp"
	chain string
}

// NewClusterIP installs the VIP with the given backends.
func NewClusterIP(ns *NetNS, vip netip.AddrPort, proto string, backends []netip.AddrPort) (*ClusterIP, error) {
	c := &ClusterIP{NS: ns, VIP: vip, Proto: proto,
		chain: fmt.Sprintf("DB-SVC-%s", strings.ToUpper(RandSuffix(8)))}
	if _, err := c.ipt("-t", "nat", "-N", c.chain); err != nil {
		return nil, err
	}
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		if _, err := c.ipt("-t", "nat", "-A", hook, "-d", vip.Addr().String(), "-p", proto,
			"--dport", fmt.Sprint(vip.Port()), "-j", c.chain); err != nil {
			return nil, err
		}
	}
	if err := c.SetBackends(backends); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *ClusterIP) ipt(args ...string) (string, error) {
	bin := "iptables"
	if c.VIP.Addr().Is6() {
		bin = "ip6tables"
	}
	return c.NS.Run(bin, append([]string{"-w"}, args...)...)
}

// SetBackends rewrites the chain to spread over backends (what a kube-proxy
// sync does when the endpoints change).
func (c *ClusterIP) SetBackends(backends []netip.AddrPort) error {
	if _, err := c.ipt("-t", "nat", "-F", c.chain); err != nil {
		return err
	}
	for i, b := range backends {
		args := []string{"-t", "nat", "-A", c.chain, "-p", c.Proto}
		if left := len(backends) - i; left > 1 {
			args = append(args, "-m", "statistic", "--mode", "random", "--probability", fmt.Sprintf("%.10f", 1/float64(left)))
		}
		args = append(args, "-j", "DNAT", "--to-destination", b.String())
		if _, err := c.ipt(args...); err != nil {
			return err
		}
	}
	return nil
}

// Close removes the rules (the namespace going away removes them too).
func (c *ClusterIP) Close() error {
	for _, hook := range []string{"PREROUTING", "OUTPUT"} {
		c.ipt("-t", "nat", "-D", hook, "-d", c.VIP.Addr().String(), "-p", c.Proto,
			"--dport", fmt.Sprint(c.VIP.Port()), "-j", c.chain)
	}
	c.ipt("-t", "nat", "-F", c.chain)
	_, err := c.ipt("-t", "nat", "-X", c.chain)
	return err
}
