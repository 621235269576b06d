package kube

import (
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The testdata files are iptables-save dumps of a node of this bed with real
// kube-proxy v1.37.2 serving a dual-stack Service web (3 pods, port 80 →
// 8080).
func readDump(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// stripComments removes rule comments, as kube-proxy does above ~1,000
// endpoints: the parser must not depend on them.
func stripComments(s string) string {
	return regexp.MustCompile(` -m comment --comment ("([^"\\]|\\.)*"|\S+)`).ReplaceAllString(s, "")
}

func TestParseRules(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		file string
		sp   ServicePort
		want []netip.AddrPort
	}{
		{"nat4.iptables-save", ServicePort{netip.MustParseAddr("10.96.245.94"), 80, corev1.ProtocolTCP},
			[]netip.AddrPort{ap("10.244.0.10:8080"), ap("10.244.0.11:8080"), ap("10.244.0.12:8080")}},
		{"nat6.iptables-save", ServicePort{netip.MustParseAddr("fd00:96::cd0b"), 80, corev1.ProtocolTCP},
			[]netip.AddrPort{ap("[fd00:244::a]:8080"), ap("[fd00:244::b]:8080"), ap("[fd00:244::c]:8080")}},
	} {
		dump := readDump(t, tc.file)
		for _, variant := range []struct {
			name, text string
		}{{"as dumped", dump}, {"without comments", stripComments(dump)}} {
			t.Run(tc.file+"/"+variant.name, func(t *testing.T) {
				if variant.name != "as dumped" && strings.Contains(variant.text, "--comment") {
					t.Fatal("stripComments left comments")
				}
				r, err := ParseRules(variant.text)
				if err != nil {
					t.Fatal(err)
				}
				if got := r.Endpoints(tc.sp); !slices.Equal(got, tc.want) {
					t.Errorf("Endpoints(%s) = %v, want %v", tc.sp, got, tc.want)
				}
				if sps := r.ServicePorts(); len(sps) != 1 || sps[0] != tc.sp {
					t.Errorf("ServicePorts() = %v, want only %s (no endpoints, no rule for default/kubernetes)", sps, tc.sp)
				}
				for _, ep := range tc.want {
					if !r.HasDNAT(ep) {
						t.Errorf("HasDNAT(%s) = false", ep)
					}
				}
				other := tc.sp
				other.Port = 81
				if got := r.Endpoints(other); got != nil {
					t.Errorf("Endpoints(%s) = %v, want none", other, got)
				}
			})
		}
	}
}

// TestParseRulesEndpointDropped removes one endpoint's jump from the service
// chain, as kube-proxy does for a terminating endpoint: the service no longer
// balances to it even while its KUBE-SEP chain still has the DNAT rule.
func TestParseRulesEndpointDropped(t *testing.T) {
	var kept []string
	for line := range strings.Lines(readDump(t, "nat4.iptables-save")) {
		if strings.HasPrefix(line, "-A KUBE-SVC-") && strings.Contains(line, "-j KUBE-SEP-3MRQQDVYO2GBIBDV") {
			continue
		}
		kept = append(kept, line)
	}
	r, err := ParseRules(strings.Join(kept, ""))
	if err != nil {
		t.Fatal(err)
	}
	sp := ServicePort{netip.MustParseAddr("10.96.245.94"), 80, corev1.ProtocolTCP}
	gone := netip.MustParseAddrPort("10.244.0.10:8080")
	if slices.Contains(r.Endpoints(sp), gone) || len(r.Endpoints(sp)) != 2 {
		t.Errorf("Endpoints = %v, want the two others", r.Endpoints(sp))
	}
	if !r.HasDNAT(gone) {
		t.Errorf("HasDNAT(%s) = false, but its KUBE-SEP chain is still there", gone)
	}
}

func TestParseRulesErrors(t *testing.T) {
	for _, bad := range []string{
		`-A KUBE-SEP-X -p tcp -j DNAT`,
		`-A KUBE-SEP-X -p tcp -m comment --comment "unterminated -j DNAT --to-destination 10.0.0.1:80`,
		`-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp --dport http -j KUBE-SVC-X`,
	} {
		if _, err := ParseRules(bad + "\n"); err == nil {
			t.Errorf("ParseRules(%q) succeeded", bad)
		}
	}
}

func TestSplitRule(t *testing.T) {
	got, err := splitRule(`-A X -m comment --comment "a \"b\" c" -j Y`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"-A", "X", "-m", "comment", "--comment", `a "b" c`, "-j", "Y"}
	if !slices.Equal(got, want) {
		t.Errorf("splitRule = %q, want %q", got, want)
	}
}

func TestParseMetrics(t *testing.T) {
	m := parseMetrics(`# HELP kubeproxy_sync_proxy_rules_last_timestamp_seconds x
# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"} 1.8e+09
rest_client_requests_total{code="200",host="127.0.0.1:1",method="GET"} 12
garbage
`)
	if len(m) != 3 || m[`kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv6"}`] != 1.8e9 {
		t.Errorf("parseMetrics = %v", m)
	}
	if metricName(`a_b{c="d"}`) != "a_b" {
		t.Error("metricName")
	}
}
