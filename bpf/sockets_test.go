package bpf_test

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

// famSock is the socket family the helper uses for a fixture family.
func famSock(v6 bool) string {
	if v6 {
		return "6"
	}
	return "4"
}

func sockFamily(v6 bool) bpf.Family {
	if v6 {
		return bpf.IPv6
	}
	return bpf.IPv4
}

func sockCounter(t *testing.T, dp *bpf.Datapath, e bpf.SocketEvent, v6 bool) uint64 {
	t.Helper()
	c, err := dp.SocketCounters()
	must(t, err)
	return c.Get(e, sockFamily(v6))
}

// waitLive waits until the datapath counts want live connections on addr.
func waitLive(t *testing.T, dp *bpf.Datapath, addr netip.Addr, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := dp.Connections(addr)
		must(t, err)
		if c.Live() == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("live connections of %s: %d (%+v), want %d", addr, c.Live(), c, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// vanish makes pod i a dead peer, as when its node dies or its network is
// torn down before its sockets can say anything: its link goes down, the
// node black-holes its addresses (packets to it vanish silently, as into
// an address nobody answers), then its server is killed. Nothing reaches
// its clients: no FIN, no RST, no ICMP error.
func (f *fixture) vanish(i int) {
	f.t.Helper()
	p := f.pods[i]
	_, err := p.NS.Run("ip", "link", "set", "eth0", "down")
	must(f.t, err)
	_, err = f.node.NS.Run("ip", "route", "replace", "blackhole", p.IP4.String()+"/32")
	must(f.t, err)
	_, err = f.node.NS.Run("ip", "-6", "route", "replace", "blackhole", p.IP6.String()+"/128")
	must(f.t, err)
	f.srv[i].Kill()
}

func (f *fixture) gonePeer(i int, v6 bool, at time.Time) {
	f.t.Helper()
	must(f.t, f.dp.UpsertGonePeer(bpf.GonePeer{Addr: f.pods[i].Addr(v6), GoneAt: at, Expires: time.Now().Add(time.Minute)}))
}

// reloadWithSockets restarts the datapath with the socket hooks and returns
// the instant counting started, checked to be about now.
func (f *fixture) reloadWithSockets() time.Time {
	f.t.Helper()
	must(f.t, f.dp.Close())
	before := time.Now()
	f.sockets = true
	f.load()
	since, err := f.dp.CountingSince()
	must(f.t, err)
	if since.Before(before.Add(-time.Second)) || since.After(time.Now().Add(time.Second)) {
		f.t.Errorf("counting since %v, want about %v", since, before)
	}
	return since
}

// TestPrivilegedSocketCountsConnections: the sock_ops program counts a
// pod's passively established connections under its address, and their
// ends, whichever side closes; other pods' counts are untouched. IPv4 runs
// on the servers' dual-stack sockets (v4-mapped), IPv6 on the same sockets.
func TestPrivilegedSocketCountsConnections(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixtureWith(t, true)
		sock := startSockHelper(t, f.cli.NS, f.cli.Cgroup)
		srv1 := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		const n = 6
		for i := 0; i < n; i++ {
			r := sock.call(t, sockReq{Op: "tcp_open", Family: famSock(v6), Addr: srv1.String(), ID: fmt.Sprint("c", i)})
			if r.By["srv1"] != 1 {
				t.Fatalf("opening connection %d: %+v", i, r)
			}
		}
		waitLive(t, f.dp, f.pods[0].Addr(v6), n)
		// The client closes two: the server sees EOF and closes too.
		sock.call(t, sockReq{Op: "close", ID: "c0"})
		sock.call(t, sockReq{Op: "close", ID: "c1"})
		waitLive(t, f.dp, f.pods[0].Addr(v6), n-2)
		// An in-flight request does not change the count.
		if r := sock.call(t, sockReq{Op: "tcp_req", ID: "c2"}); r.By["srv1"] != 1 {
			t.Fatalf("request on c2: %+v", r)
		}
		waitLive(t, f.dp, f.pods[0].Addr(v6), n-2)
		// The server closes the rest first.
		_, err := f.srv[0].Call(bed.Request{Op: "close_all"})
		must(t, err)
		waitLive(t, f.dp, f.pods[0].Addr(v6), 0)
		for i := 2; i < n; i++ {
			sock.call(t, sockReq{Op: "close", ID: fmt.Sprint("c", i)})
		}
		c, err := f.dp.Connections(f.pods[0].Addr(v6))
		must(t, err)
		if c.Opened != n || c.Closed != n {
			t.Errorf("srv1 counts %+v, want %d opened and closed", c, n)
		}
		for i := 1; i < 3; i++ {
			if c, err := f.dp.Connections(f.pods[i].Addr(v6)); err != nil || c != (bpf.ConnCount{}) {
				t.Errorf("srv%d (no connection) has counts %+v %v", i+1, c, err)
			}
		}
		if got := sockCounter(t, f.dp, bpf.SockCounted, v6); got != n {
			t.Errorf("conn_counted = %d, want %d", got, n)
		}
		if got := sockCounter(t, f.dp, bpf.SockUncounted, v6); got != n {
			t.Errorf("conn_closed = %d, want %d", got, n)
		}
	})
}

// TestPrivilegedSocketCountingStartsAtAttach: connections established before
// the socket hooks were attached are not counted, and their ends are not
// either (a close is only counted for a socket that was counted); the
// counts and the instant counting started survive a restart.
func TestPrivilegedSocketCountingStartsAtAttach(t *testing.T) {
	f := newFixtureWith(t, false)
	sock := startSockHelper(t, f.cli.NS, f.cli.Cgroup)
	srv1 := netip.AddrPortFrom(f.pods[0].IP4, podPort)
	for _, id := range []string{"old0", "old1"} {
		if r := sock.call(t, sockReq{Op: "tcp_open", Family: "4", Addr: srv1.String(), ID: id}); r.OK != 1 {
			t.Fatalf("opening %s: %+v", id, r)
		}
	}
	since := f.reloadWithSockets()
	for _, id := range []string{"new0", "new1", "new2"} {
		if r := sock.call(t, sockReq{Op: "tcp_open", Family: "4", Addr: srv1.String(), ID: id}); r.OK != 1 {
			t.Fatalf("opening %s: %+v", id, r)
		}
	}
	waitLive(t, f.dp, f.pods[0].IP4, 3)
	sock.call(t, sockReq{Op: "close", ID: "old0"})
	sock.call(t, sockReq{Op: "close", ID: "old1"})
	sock.call(t, sockReq{Op: "close", ID: "new0"})
	waitLive(t, f.dp, f.pods[0].IP4, 2)
	// The old connections' ends went by uncounted: closing them all leaves
	// exactly the two new ones (a decrement for them would read 0).
	time.Sleep(100 * time.Millisecond) // let any (wrong) decrement land
	waitLive(t, f.dp, f.pods[0].IP4, 2)

	must(t, f.dp.Close())
	f.load()
	again, err := f.dp.CountingSince()
	must(t, err)
	if !again.Equal(since) && again.Sub(since).Abs() > time.Millisecond {
		t.Errorf("counting since moved across a restart: %v -> %v", since, again)
	}
	waitLive(t, f.dp, f.pods[0].IP4, 2)
	sock.call(t, sockReq{Op: "close", ID: "new1"})
	waitLive(t, f.dp, f.pods[0].IP4, 1)
}

// TestPrivilegedSocketCountsResetWhenHooksOff: a draind without the socket
// hooks (--socket-hooks=false) after one with them resets the counts and
// when counting started. Closes in the hook-less gap go uncounted, so kept
// counts would hold those connections as live for ever (the pod never
// drained); the next draind with the hooks counts afresh and ignores the
// close of a socket counted before the gap.
func TestPrivilegedSocketCountsResetWhenHooksOff(t *testing.T) {
	f := newFixtureWith(t, true)
	sock := startSockHelper(t, f.cli.NS, f.cli.Cgroup)
	srv1 := netip.AddrPortFrom(f.pods[0].IP4, podPort)
	open := func(id string) {
		t.Helper()
		if r := sock.call(t, sockReq{Op: "tcp_open", Family: "4", Addr: srv1.String(), ID: id}); r.OK != 1 {
			t.Fatalf("opening %s: %+v", id, r)
		}
	}
	open("old0")
	open("old1")
	waitLive(t, f.dp, f.pods[0].IP4, 2)

	must(t, f.dp.Close())
	f.sockets = false
	f.load()
	if c, err := f.dp.Connections(f.pods[0].IP4); err != nil || c != (bpf.ConnCount{}) {
		t.Errorf("with the socket hooks off the counts are %+v (%v), want none", c, err)
	}
	if since, err := f.dp.CountingSince(); err != nil || !since.IsZero() {
		t.Errorf("with the socket hooks off counting started at %v (%v), want never", since, err)
	}
	sock.call(t, sockReq{Op: "close", ID: "old0"}) // in the gap: not seen

	f.reloadWithSockets()
	open("new0")
	waitLive(t, f.dp, f.pods[0].IP4, 1)
	// old1 was counted before the gap: its close must not take new0's place.
	sock.call(t, sockReq{Op: "close", ID: "old1"})
	time.Sleep(100 * time.Millisecond) // let any (wrong) decrement land
	waitLive(t, f.dp, f.pods[0].IP4, 1)
	if c, err := f.dp.Connections(f.pods[0].IP4); err != nil || c != (bpf.ConnCount{Opened: 1}) {
		t.Errorf("counts after old1 closed: %+v (%v), want 1 opened, 0 closed", c, err)
	}
	sock.call(t, sockReq{Op: "close", ID: "new0"})
	waitLive(t, f.dp, f.pods[0].IP4, 0)
}

// TestPrivilegedSocketEndsTCPToGonePod: a client's keep-alive connection to
// a pod that vanished (no FIN, no RST, packets black-holed) fails with
// ETIMEDOUT at its next request's first retransmission timeout once the pod
// is a gone peer, whether the client dialed the pod IP or a Service VIP that
// conntrack translated to it (a gone flow). Without a gone entry (the
// control) the same request is still waiting when its read times out.
func TestPrivilegedSocketEndsTCPToGonePod(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixtureWith(t, true)
		sock := startSockHelper(t, f.cli.NS, f.cli.Cgroup)
		vip := netip.MustParseAddrPort("10.96.0.11:80")
		if v6 {
			vip = netip.MustParseAddrPort("[fd00:96::11]:80")
		}
		c, err := bed.NewClusterIP(f.node.NS, vip, "tcp", f.backends(v6, 0))
		must(t, err)
		t.Cleanup(func() { c.Close() })
		direct := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		control := netip.AddrPortFrom(f.pods[2].Addr(v6), podPort)
		var viaLocal string
		for _, c := range []struct {
			id   string
			addr netip.AddrPort
		}{{"direct", direct}, {"vip", vip}, {"control", control}} {
			r := sock.call(t, sockReq{Op: "tcp_open", Family: famSock(v6), Addr: c.addr.String(), ID: c.id})
			if r.OK != 1 {
				t.Fatalf("opening %s: %+v", c.id, r)
			}
			if c.id == "vip" {
				viaLocal = r.Local
			}
		}
		f.vanish(0)
		f.vanish(2)
		gone := time.Now()
		f.gonePeer(0, v6, gone)
		must(t, f.dp.UpsertGoneFlow(bpf.GoneFlow{Local: netip.MustParseAddrPort(viaLocal), Remote: vip,
			GoneAt: gone, Expires: time.Now().Add(time.Minute)}))

		const wait = 3 * time.Second
		for _, id := range []string{"direct", "vip"} {
			r := sock.call(t, sockReq{Op: "tcp_req", ID: id, Timeout: wait})
			if r.Fails["etimedout"] != 1 {
				t.Errorf("%s: want the request to fail with ETIMEDOUT, got %+v", id, r)
			}
			t.Logf("%s: request -> ETIMEDOUT after %v", id, r.Elapsed.Round(time.Millisecond))
		}
		r := sock.call(t, sockReq{Op: "tcp_req", ID: "control", Timeout: wait})
		if r.Fails["timeout"] != 1 {
			t.Errorf("control (vanished, no gone entry): want the read to time out with the socket alive, got %+v", r)
		}
		if got := sockCounter(t, f.dp, bpf.SockTCPEnded, v6); got != 1 {
			t.Errorf("tcp_ended = %d, want 1", got)
		}
		if got := sockCounter(t, f.dp, bpf.SockTCPEndedFlow, v6); got != 1 {
			t.Errorf("tcp_ended_flow = %d, want 1", got)
		}
		if got := sockCounter(t, f.dp, bpf.SockTCPSetsockoptError, v6); got != 0 {
			t.Errorf("tcp_setsockopt_failed = %d", got)
		}
	})
}

// TestPrivilegedSocketNeverEndsLiveOrNewer: a socket to a live pod that
// retransmits (a lossy path) is never ended while another pod is gone, and
// a socket established after its peer's IP was listed gone (a new pod that
// reused the IP) is spared even when it retransmits; once the gone entry is
// deleted, the gone flag drops.
func TestPrivilegedSocketNeverEndsLiveOrNewer(t *testing.T) {
	f := newFixtureWith(t, true)
	sock := startSockHelper(t, f.cli.NS, f.cli.Cgroup)
	// srv1 is gone (listed), srv2 is live but its path loses everything
	// for a while, srv3 "reused" srv1's place: listed gone before the
	// client connected to it.
	f.gonePeer(0, false, time.Now())
	f.gonePeer(2, false, time.Now())
	for _, c := range []struct {
		id string
		i  int
	}{{"live", 1}, {"newer", 2}} {
		if r := sock.call(t, sockReq{Op: "tcp_open", Family: "4", Addr: netip.AddrPortFrom(f.pods[c.i].IP4, podPort).String(), ID: c.id}); r.OK != 1 {
			t.Fatalf("opening %s: %+v", c.id, r)
		}
	}
	_, err := f.node.NS.Run("ip", "route", "replace", "blackhole", f.pods[1].IP4.String()+"/32")
	must(t, err)
	f.vanish(2)
	for _, id := range []string{"live", "newer"} {
		r := sock.call(t, sockReq{Op: "tcp_req", ID: id, Timeout: 2 * time.Second})
		if r.Fails["timeout"] != 1 {
			t.Errorf("%s: want the socket alive (read timeout), got %+v", id, r)
		}
	}
	// The lossy path heals: the live connection carries on.
	_, err = f.node.NS.Run("ip", "route", "replace", f.pods[1].IP4.String()+"/32", "dev", f.pods[1].HostVeth, "scope", "link")
	must(t, err)
	r := sock.call(t, sockReq{Op: "tcp_req", ID: "live", Timeout: 10 * time.Second})
	if r.By["srv2"] != 1 {
		t.Errorf("the live connection did not survive its lossy spell: %+v", r)
	}
	if got := sockCounter(t, f.dp, bpf.SockTCPSpared, false); got == 0 {
		t.Errorf("tcp_spared_newer = 0: the newer socket never reached the check")
	}
	if got := sockCounter(t, f.dp, bpf.SockTCPEnded, false); got != 0 {
		t.Errorf("tcp_ended = %d, want 0", got)
	}
	if on, err := f.dp.Gone(); err != nil || !on {
		t.Fatalf("gone flag %v %v with two entries", on, err)
	}
	must(t, f.dp.DeleteGonePeer(f.pods[0].IP4))
	must(t, f.dp.DeleteGonePeer(f.pods[2].IP4))
	if on, err := f.dp.Gone(); err != nil || on {
		t.Errorf("gone flag %v %v with no entry left", on, err)
	}
}

// TestPrivilegedUDPConnectedToGonePodFails: a connected UDP socket whose
// peer is a gone pod IP fails at its next send (EPERM), so the client
// reconnects; an unconnected socket sending to that IP, a socket connected
// to a live pod, and a socket connected after the pod was listed gone (a
// new pod that reused the IP) keep sending.
func TestPrivilegedUDPConnectedToGonePodFails(t *testing.T) {
	udpFamiliesRun(t, func(t *testing.T, fam udpFamily) {
		f := newUDPFixtureWith(t, true)
		srv1 := fam.addr(netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort))
		srv2 := fam.addr(netip.AddrPortFrom(f.pods[1].Addr(fam.v6), podPort))
		for _, c := range []struct {
			id   string
			addr netip.AddrPort
			srv  string
		}{{"a", srv1, "srv1"}, {"b", srv2, "srv2"}} {
			if r := f.sock.call(t, sockReq{Op: "connect", ID: c.id, Family: fam.sock, Addr: c.addr.String()}); r.OK != 1 {
				t.Fatalf("connect %s: %+v", c.id, r)
			}
			if r := f.sock.call(t, sockReq{Op: "exchange", ID: c.id}); r.By[c.srv] != 1 {
				t.Fatalf("exchange on %s: %+v", c.id, r)
			}
		}
		f.vanish(0)
		f.gonePeer(0, fam.v6, time.Now())
		if r := f.sock.call(t, sockReq{Op: "exchange", ID: "a"}); r.Fails["eperm"] != 1 {
			t.Errorf("connected to the gone pod: want the send refused (EPERM), got %+v", r)
		}
		if r := f.sock.call(t, sockReq{Op: "exchange", ID: "b"}); r.By["srv2"] != 1 {
			t.Errorf("connected to a live pod: %+v", r)
		}
		// Unconnected: sent (and lost: the pod is gone), never refused here.
		if r := f.sendto(t, fam, netip.AddrPortFrom(f.pods[0].Addr(fam.v6), podPort), 1, false); r.Fails["timeout"] != 1 {
			t.Errorf("unconnected to the gone pod: want sent and unanswered, got %+v", r)
		}
		// Connected after the pod was listed gone: a new owner of the IP.
		if r := f.sock.call(t, sockReq{Op: "connect", ID: "c", Family: fam.sock, Addr: srv1.String()}); r.OK != 1 {
			t.Fatalf("connect c: %+v", r)
		}
		if r := f.sock.call(t, sockReq{Op: "exchange", ID: "c"}); r.Fails["timeout"] != 1 {
			t.Errorf("connected after the departure: want sent (unanswered), got %+v", r)
		}
		if r := f.sock.call(t, sockReq{Op: "exchange", ID: "a"}); r.Fails["eperm"] != 1 {
			t.Errorf("second send to the gone pod: %+v", r)
		}
		for e, want := range map[bpf.SocketEvent]uint64{bpf.SockUDPRefused: 2, bpf.SockUDPEnded: 1, bpf.SockUDPSpared: 1} {
			if got := sockCounter(t, f.dp, e, fam.v6); got != want {
				t.Errorf("%v = %d, want %d", e, got, want)
			}
		}
		// The entry goes: nothing is refused any more.
		must(t, f.dp.DeleteGonePeer(f.pods[0].Addr(fam.v6)))
		if r := f.sock.call(t, sockReq{Op: "exchange", ID: "a"}); r.Fails["timeout"] != 1 {
			t.Errorf("after the gone entry went: want sent, got %+v", r)
		}
	})
}

func TestPrivilegedSocketProbe(t *testing.T) {
	bed.RequirePrivileged(t)
	f, err := bpf.Probe()
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	// Every supported kernel (5.10 and later) has what the socket hooks
	// need, TCP_USER_TIMEOUT from bpf_setsockopt included (5.9).
	if !f.Sockets || !f.SockOps || !f.UserTimeoutFromBPF || !f.CgroupEgressRefuse || f.SocketsMissing != "" {
		t.Errorf("kernel %s has every socket hook feature, yet: %+v", f.Kernel, f)
	}
	if f.SocketIterators == "" {
		t.Error("socket iterators not reported")
	}
}
