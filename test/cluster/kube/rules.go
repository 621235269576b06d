package kube

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ServicePort identifies a ClusterIP service port as kube-proxy matches it.
type ServicePort struct {
	IP       netip.Addr
	Port     uint16
	Protocol corev1.Protocol
}

func (sp ServicePort) String() string {
	return fmt.Sprintf("%s/%s", netip.AddrPortFrom(sp.IP, sp.Port), sp.Protocol)
}

// Rules is what kube-proxy's iptables rules in a node's nat table send
// traffic to: for every ClusterIP service port, the endpoints its service
// chain DNATs to. It is read from iptables-save by chain structure (the
// KUBE-SERVICES → KUBE-SVC/KUBE-SVL → KUBE-SEP → DNAT path), never from rule
// comments, which kube-proxy drops above ~1,000 endpoints.
type Rules struct {
	services map[ServicePort][]netip.AddrPort
	dnat     map[netip.AddrPort]bool
}

// Endpoints returns the endpoints kube-proxy currently balances sp over, in
// rule order; nil if sp has no service rule (or no endpoints).
func (r *Rules) Endpoints(sp ServicePort) []netip.AddrPort { return r.services[sp] }

// HasDNAT reports whether any endpoint chain still DNATs to ep — the rule
// whose removal ends new Service connections to a deleted pod.
func (r *Rules) HasDNAT(ep netip.AddrPort) bool { return r.dnat[ep] }

// ServicePorts returns every ClusterIP service port with rules.
func (r *Rules) ServicePorts() []ServicePort {
	out := make([]ServicePort, 0, len(r.services))
	for sp := range r.services {
		out = append(out, sp)
	}
	return out
}

// ParseRules parses `iptables-save -t nat` (or ip6tables-save) output.
func ParseRules(save string) (*Rules, error) {
	type svcRule struct {
		sp    ServicePort
		chain string
	}
	var svcRules []svcRule
	jumps := map[string][]string{}         // service chain -> endpoint chains, in order
	sepDest := map[string]netip.AddrPort{} // endpoint chain -> DNAT destination
	for line := range strings.Lines(save) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "-A ") {
			continue
		}
		r, err := parseRule(line)
		if err != nil {
			return nil, err
		}
		switch {
		case r.chain == "KUBE-SERVICES" && r.dst.IsValid() && r.dport != 0 &&
			(strings.HasPrefix(r.jump, "KUBE-SVC-") || strings.HasPrefix(r.jump, "KUBE-SVL-")):
			if !r.dst.IsSingleIP() {
				continue
			}
			svcRules = append(svcRules, svcRule{ServicePort{r.dst.Addr(), r.dport, r.proto}, r.jump})
		case (strings.HasPrefix(r.chain, "KUBE-SVC-") || strings.HasPrefix(r.chain, "KUBE-SVL-")) && strings.HasPrefix(r.jump, "KUBE-SEP-"):
			jumps[r.chain] = append(jumps[r.chain], r.jump)
		case strings.HasPrefix(r.chain, "KUBE-SEP-") && r.jump == "DNAT":
			if !r.toDest.IsValid() {
				return nil, fmt.Errorf("parsing iptables rule %q: DNAT without --to-destination", line)
			}
			sepDest[r.chain] = r.toDest
		}
	}
	rules := &Rules{services: map[ServicePort][]netip.AddrPort{}, dnat: map[netip.AddrPort]bool{}}
	for _, d := range sepDest {
		rules.dnat[d] = true
	}
	for _, s := range svcRules {
		var eps []netip.AddrPort
		for _, sep := range jumps[s.chain] {
			if d, ok := sepDest[sep]; ok {
				eps = append(eps, d)
			}
		}
		rules.services[s.sp] = eps
	}
	return rules, nil
}

type rule struct {
	chain  string
	dst    netip.Prefix
	proto  corev1.Protocol
	dport  uint16
	jump   string
	toDest netip.AddrPort
}

func parseRule(line string) (rule, error) {
	var r rule
	toks, err := splitRule(line)
	if err != nil {
		return r, fmt.Errorf("parsing iptables rule %q: %w", line, err)
	}
	negate := false
	for i := 0; i < len(toks); i++ {
		t := toks[i]
		next := func() string {
			if i+1 < len(toks) {
				i++
				return toks[i]
			}
			return ""
		}
		switch t {
		case "!":
			negate = true
			continue
		case "-A":
			r.chain = next()
		case "-d":
			v := next()
			if negate {
				break
			}
			if !strings.Contains(v, "/") {
				v += "/32"
				if strings.Contains(v, ":") {
					v = strings.TrimSuffix(v, "/32") + "/128"
				}
			}
			if r.dst, err = netip.ParsePrefix(v); err != nil {
				return r, fmt.Errorf("parsing iptables rule %q: destination: %w", line, err)
			}
		case "-p":
			if v := next(); !negate {
				r.proto = corev1.Protocol(strings.ToUpper(v))
			}
		case "--dport":
			v := next()
			if negate {
				break
			}
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return r, fmt.Errorf("parsing iptables rule %q: port: %w", line, err)
			}
			r.dport = uint16(p)
		case "-j", "-g":
			r.jump = next()
		case "--to-destination":
			if r.toDest, err = netip.ParseAddrPort(next()); err != nil {
				return r, fmt.Errorf("parsing iptables rule %q: DNAT destination: %w", line, err)
			}
		}
		negate = false
	}
	return r, nil
}

// splitRule splits an iptables-save line into words, honouring the double
// quotes (with backslash escapes) iptables-save puts around comments.
func splitRule(line string) ([]string, error) {
	var toks []string
	var cur strings.Builder
	inWord, quoted := false, false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case quoted && ch == '\\' && i+1 < len(line):
			i++
			cur.WriteByte(line[i])
		case ch == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (ch == ' ' || ch == '\t'):
			if inWord {
				toks = append(toks, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(ch)
			inWord = true
		}
	}
	if quoted {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		toks = append(toks, cur.String())
	}
	return toks, nil
}

// RulesPollInterval bounds how late WaitRules notices a change: a dump of a
// small nat table takes a few milliseconds.
const RulesPollInterval = 5 * time.Millisecond

// Rules reads kube-proxy's nat rules for family in the node's namespace.
func (n *Node) Rules(ctx context.Context, family corev1.IPFamily) (*Rules, error) {
	bin := "iptables-save"
	if family == corev1.IPv6Protocol {
		bin = "ip6tables-save"
	}
	out, err := runCmd(ctx, n.NetnsPath, bin, "-t", "nat")
	if err != nil {
		return nil, fmt.Errorf("reading nat rules on node %s: %w", n.Name, err)
	}
	return ParseRules(string(out))
}

// WaitRules polls the node's nat rules for family until cond holds and
// returns when the dump that satisfied it completed — an upper bound on
// when the data path changed, late by at most one poll (RulesPollInterval
// plus a dump).
func (n *Node) WaitRules(ctx context.Context, family corev1.IPFamily, cond func(*Rules) bool) (time.Time, error) {
	var at time.Time
	var lastErr error
	err := Poll(ctx, RulesPollInterval, func() (bool, error) {
		if err := n.c.Healthy(); err != nil {
			return false, err
		}
		r, err := n.Rules(ctx, family)
		if err != nil {
			// A dump can fail while kube-proxy is replacing the table; the
			// next poll will tell. The last failure is reported on timeout.
			lastErr = err
			return false, nil
		}
		at = time.Now()
		return cond(r), nil
	})
	if err != nil {
		if lastErr != nil {
			err = fmt.Errorf("%w (last dump error: %v)", err, lastErr)
		}
		return time.Time{}, fmt.Errorf("waiting for kube-proxy rules on node %s: %w", n.Name, err)
	}
	return at, nil
}
