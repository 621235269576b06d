package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

// udpFamily is a socket family the datagram tests run over: an IPv4 socket,
// an IPv6-only socket, or a dual-stack IPv6 socket sending to v4-mapped
// addresses (steered by the IPv4 entries).
type udpFamily struct {
	name   string
	sock   string // sockReq.Family
	v6     bool   // which entries and pods: IPv6 or IPv4
	mapped bool   // addresses as ::ffff:a.b.c.d
}

var udpFamilies = []udpFamily{
	{"ipv4", "4", false, false},
	{"ipv6", "6", true, false},
	{"dual_v4mapped", "dual", false, true},
}

// udpFixture is the fixture plus kube-proxy UDP rules for the VIPs and a
// socket helper in the client pod.
type udpFixture struct {
	*fixture
	sock *sockProc
}

func newUDPFixture(t *testing.T) *udpFixture { return newUDPFixtureWith(t, false) }

func newUDPFixtureWith(t *testing.T, sockets bool) *udpFixture {
	f := newFixtureWith(t, sockets)
	for _, v6 := range []bool{false, true} {
		c, err := bed.NewClusterIP(f.node.NS, f.vip[v6], "udp", f.backends(v6, 0, 1, 2))
		must(t, err)
		t.Cleanup(func() { c.Close() })
	}
	return &udpFixture{fixture: f, sock: startSockHelper(t, f.cli.NS, f.cli.Cgroup)}
}

func udpFamiliesRun(t *testing.T, fn func(t *testing.T, fam udpFamily)) {
	for _, fam := range udpFamilies {
		t.Run(fam.name, func(t *testing.T) { fn(t, fam) })
	}
}

// addr is how a socket of fam names ap.
func (fam udpFamily) addr(ap netip.AddrPort) netip.AddrPort {
	if fam.mapped {
		return netip.AddrPortFrom(netip.AddrFrom16(ap.Addr().As16()), ap.Port())
	}
	return ap
}

func (f *udpFixture) udpKey(k bpf.EndpointKey) bpf.EndpointKey {
	k.Proto = bpf.UDP
	return k
}

// udpService is the service-port id of the UDP port of the family.
func udpService(v6 bool) bpf.ServicePortID {
	if v6 {
		return 4
	}
	return 3
}

// drainFirstUDP makes srv1's UDP port draining, srv2 and srv3 selectable and
// the VIP's UDP port a steered frontend.
func (f *udpFixture) drainFirstUDP(v6 bool, policy bpf.Policy, ttl time.Duration) {
	f.t.Helper()
	exp := time.Now().Add(ttl)
	svc := udpService(v6)
	must(f.t, f.dp.SetBackends(bpf.Backends{Service: svc, Backends: f.backends(v6, 1, 2), Expires: exp}))
	must(f.t, f.dp.UpsertFrontend(bpf.Frontend{Key: f.udpKey(f.vipKey(v6)), Service: svc, Expires: exp}))
	must(f.t, f.dp.UpsertDrain(bpf.Drain{Key: f.udpKey(f.podKey(0, v6)), Service: svc, Policy: policy, Expires: exp}))
}

func (f *udpFixture) sendto(t *testing.T, fam udpFamily, to netip.AddrPort, n int, fresh bool) sockResp {
	t.Helper()
	return f.sock.call(t, sockReq{Op: "sendto", Family: fam.sock, Addr: fam.addr(to).String(), N: n, Fresh: fresh})
}

func dgramCounter(t *testing.T, dp *bpf.Datapath, o bpf.Outcome, v6 bool) uint64 {
	t.Helper()
	c, err := dp.DatagramCounters()
	must(t, err)
	fam := bpf.IPv4
	if v6 {
		fam = bpf.IPv6
	}
	return c.Get(o, fam)
}

func dgramTotal(t *testing.T, dp *bpf.Datapath) uint64 {
	t.Helper()
	c, err := dp.DatagramCounters()
	must(t, err)
	var n uint64
	for o := range c {
		n += c[o][0] + c[o][1]
	}
	return n
}

// onlySource checks that every answer reported want as its source.
func onlySource(t *testing.T, what string, r sockResp, want netip.AddrPort) {
	t.Helper()
	if r.OK == 0 || r.Sources[want.String()] != r.OK {
		t.Errorf("%s: want every answer from %s, got sources %v (by %v, fails %v)", what, want, r.Sources, r.By, r.Fails)
	}
}

func TestPrivilegedUDPSendtoClusterIP(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		vip := fam.addr(f.vip[fam.v6])
		const n = 60

		// Nothing draining: kube-proxy's DNAT spreads new flows, its
		// conntrack entry makes the answers come from the VIP.
		r := f.sendto(t, fam, f.vip[fam.v6], n, true)
		if r.OK != n || r.By["srv1"] == 0 {
			t.Fatalf("without a drain: want all %d answered incl. srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "without a drain", r, vip)

		f.drainFirstUDP(fam.v6, bpf.PolicyRewrite, time.Minute)
		// One socket: every datagram steered, all to one backend (the
		// flow stays put while the selectable set does), every answer
		// from the VIP.
		r = f.sendto(t, fam, f.vip[fam.v6], n, false)
		if r.OK != n || r.By["srv1"] != 0 || len(r.By) != 1 {
			t.Errorf("one socket while draining: want all %d on one of srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "one socket while draining", r, vip)
		// A new socket per datagram: spread over the selectable backends.
		r = f.sendto(t, fam, f.vip[fam.v6], n, true)
		if r.OK != n || r.By["srv1"] != 0 || r.By["srv2"] < n/5 || r.By["srv3"] < n/5 {
			t.Errorf("fresh sockets while draining: want all %d spread over srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "fresh sockets while draining", r, vip)
		if got := dgramCounter(t, f.dp, bpf.OutSteeredClusterIP, fam.v6); got != 2*n {
			t.Errorf("datagram steered_clusterip = %d, want %d", got, 2*n)
		}
		if got := counter(t, f.dp, bpf.OutSteeredClusterIP, fam.v6); got != 0 {
			t.Errorf("datagrams counted as connections: steered_clusterip = %d", got)
		}

		// The drain ends: kube-proxy again, srv1 included.
		must(t, f.dp.DeleteFrontend(f.udpKey(f.vipKey(fam.v6))))
		must(t, f.dp.DeleteDrain(f.udpKey(f.podKey(0, fam.v6))))
		r = f.sendto(t, fam, f.vip[fam.v6], n, true)
		if r.OK != n || r.By["srv1"] == 0 {
			t.Errorf("after the drain: want all %d answered incl. srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "after the drain", r, vip)
	})
}

func TestPrivilegedUDPPodIPPolicies(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort)
		const n = 30

		f.drainFirstUDP(fam.v6, bpf.PolicyRewrite, time.Minute)
		r := f.sendto(t, fam, pod, n, true)
		if r.OK != n || r.By["srv1"] != 0 {
			t.Errorf("rewrite: want all %d on srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "rewrite", r, fam.addr(pod))
		st, err := f.dp.DrainStats(f.udpKey(f.podKey(0, fam.v6)))
		must(t, err)
		if st.Steered != n {
			t.Errorf("rewrite: stats.Steered = %d, want %d", st.Steered, n)
		}

		f.drainFirstUDP(fam.v6, bpf.PolicyRefuse, time.Minute)
		r = f.sendto(t, fam, pod, n, false)
		if r.OK != 0 || r.Fails[refusal(t)] != n {
			t.Errorf("refuse: want %d refusals from sendto, got ok=%d %v", n, r.OK, r.Fails)
		}
		if got := dgramCounter(t, f.dp, bpf.OutRefused, fam.v6); got != n {
			t.Errorf("datagram refused counter = %d, want %d", got, n)
		}

		f.drainFirstUDP(fam.v6, bpf.PolicyOff, time.Minute)
		r = f.sendto(t, fam, pod, n, false)
		if r.By["srv1"] != n {
			t.Errorf("off: want all %d on srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "off", r, fam.addr(pod))
		if got := dgramCounter(t, f.dp, bpf.OutPassOff, fam.v6); got != n {
			t.Errorf("datagram pass_off counter = %d, want %d", got, n)
		}
	})
}

// TestPrivilegedUDPNotDrainingUntouched: a datagram to anything not draining
// is never changed, while something drains and while nothing does.
func TestPrivilegedUDPNotDrainingUntouched(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		srv2 := netip.AddrPortFrom(f.pods[1].Addr(fam.v6), podPort)
		srv1 := netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort)
		const n = 20

		// Nothing drains.
		r := f.sendto(t, fam, srv1, n, false)
		if r.By["srv1"] != n {
			t.Errorf("idle: want all %d on srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "idle", r, fam.addr(srv1))

		// srv1 drains its TCP port only: its UDP port is not draining.
		f.drainFirst(fam.v6, bpf.PolicyRefuse, time.Minute)
		r = f.sendto(t, fam, srv1, n, false)
		if r.By["srv1"] != n {
			t.Errorf("TCP-only drain: want all %d UDP datagrams on srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "TCP-only drain", r, fam.addr(srv1))

		// srv1's UDP port drains: srv2 is untouched.
		f.drainFirstUDP(fam.v6, bpf.PolicyRewrite, time.Minute)
		r = f.sendto(t, fam, srv2, n, false)
		if r.By["srv2"] != n {
			t.Errorf("while draining: want all %d on srv2, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "while draining", r, fam.addr(srv2))
		if got := dgramTotal(t, f.dp); got != 0 {
			t.Errorf("untouched datagrams were counted: %d", got)
		}
		st, err := f.dp.MapStats()
		must(t, err)
		for _, s := range st {
			if s.Name == bpf.MapUDPReverse && s.Entries != 0 {
				t.Errorf("untouched datagrams left %d reverse translations", s.Entries)
			}
		}
	})
}

func TestPrivilegedUDPExpired(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort)
		const n = 40
		f.drainFirstUDP(fam.v6, bpf.PolicyRefuse, -time.Second)
		r := f.sendto(t, fam, pod, n, false)
		if r.By["srv1"] != n {
			t.Errorf("expired drain: want all %d on srv1, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "expired drain", r, fam.addr(pod))
		r = f.sendto(t, fam, f.vip[fam.v6], n, true)
		if r.OK != n || r.By["srv1"] == 0 {
			t.Errorf("expired frontend: want kube-proxy spreading incl. srv1, got %v %v", r.By, r.Fails)
		}
		onlySource(t, "expired frontend", r, fam.addr(f.vip[fam.v6]))
		if got := dgramCounter(t, f.dp, bpf.OutExpired, fam.v6); got != 2*n {
			t.Errorf("datagram expired counter = %d, want %d", got, 2*n)
		}
	})
}

// TestPrivilegedUDPConnectedReplySource: a UDP socket that connects through
// steering (glibc's resolver connects, then checks recvfrom's source) sees
// its answers come from the address it connected to, for as long as the
// socket lives: after the drain ends and across a draind restart too.
func TestPrivilegedUDPConnectedReplySource(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixture(t)
		vip := fam.addr(f.vip[fam.v6])
		const n = 10
		f.drainFirstUDP(fam.v6, bpf.PolicyRewrite, time.Minute)
		if r := f.sock.call(t, sockReq{Op: "connect", Family: fam.sock, Addr: vip.String()}); r.OK != 1 {
			t.Fatalf("connect: %v", r.Fails)
		}
		r := f.sock.call(t, sockReq{Op: "exchange", N: n})
		if r.OK != n || r.By["srv1"] != 0 || len(r.By) != 1 {
			t.Fatalf("connected while draining: want all %d on one of srv2/srv3, got %v %v", n, r.By, r.Fails)
		}
		onlySource(t, "connected while draining", r, vip)
		backend := r.By

		// The drain ends (the flag goes idle) and draind restarts: the
		// socket still talks to its backend, still under the VIP's name.
		must(t, f.dp.DeleteFrontend(f.udpKey(f.vipKey(fam.v6))))
		must(t, f.dp.DeleteDrain(f.udpKey(f.podKey(0, fam.v6))))
		if draining(t, f.dp) {
			t.Fatal("flag still up after the last entry went")
		}
		must(t, f.dp.Close())
		f.load()
		r = f.sock.call(t, sockReq{Op: "exchange", N: n})
		if r.OK != n || len(r.By) != 1 || r.By[firstKey(backend)] != n {
			t.Errorf("after the drain and a restart: want all %d on %v, got %v %v", n, backend, r.By, r.Fails)
		}
		onlySource(t, "after the drain and a restart", r, vip)
	})
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}
