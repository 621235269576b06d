package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
)

// TestPrivilegedTFORunsConnectHooks answers whether TCP Fast Open
// (sendto(MSG_FASTOPEN) without connect()) passes the connect hooks: on
// Linux 6.18 it does (the kernel's Fast Open send path connects through the
// same pre-connect step as connect()), so such a "connection" is steered,
// refused or let through like any other.
func TestPrivilegedTFORunsConnectHooks(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort)
		tfo := func(to netip.AddrPort, n int) sockResp {
			return f.sock.call(t, sockReq{Op: "tfo", Family: fam.sock, Addr: fam.addr(to).String(), N: n})
		}
		const n = 20

		// The control: with client Fast Open off the same call fails, so
		// the sends below really take the Fast Open path.
		must(t, f.cli.NS.Sysctl("net/ipv4/tcp_fastopen", "0"))
		if r := tfo(pod, 1); r.OK != 0 || r.Fails["operation not supported"] != 1 {
			t.Fatalf("Fast Open off: want EOPNOTSUPP, got %v %v", r.By, r.Fails)
		}
		must(t, f.cli.NS.Sysctl("net/ipv4/tcp_fastopen", "1")) // client on (the kernel default)

		// Nothing drains: Fast Open reaches the pod it names.
		if r := tfo(pod, n); r.By["srv1"] != n {
			t.Fatalf("idle: want all %d Fast Open sends on srv1, got %v %v", n, r.By, r.Fails)
		}

		f.drainFirst(fam.v6, bpf.PolicyRewrite, time.Minute)
		if r := tfo(pod, n); r.OK != n || r.By["srv1"] != 0 {
			t.Errorf("rewrite: want all %d on srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		if r := tfo(f.vip[fam.v6], n); r.OK != n || r.By["srv1"] != 0 {
			t.Errorf("ClusterIP: want all %d on srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		if got := counter(t, f.dp, bpf.OutSteeredPodIP, fam.v6); got != n {
			t.Errorf("steered_podip = %d, want %d", got, n)
		}
		if got := counter(t, f.dp, bpf.OutSteeredClusterIP, fam.v6); got != n {
			t.Errorf("steered_clusterip = %d, want %d", got, n)
		}

		f.drainFirst(fam.v6, bpf.PolicyRefuse, time.Minute)
		if r := tfo(pod, n); r.OK != 0 || r.Fails[refusal(t)] != n {
			t.Errorf("refuse: want %d refusals from sendto(MSG_FASTOPEN), got %v %v", n, r.By, r.Fails)
		}
	})
}
