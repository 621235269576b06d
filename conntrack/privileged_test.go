package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/test/bed"
)

// These tests drive real traffic through a kube-proxy-style ClusterIP
// (iptables DNAT spread with the statistic module) in a "node" namespace,
// with "pods" behind routed veths, and check what expiry does to clients.

const (
	udpPort = 5353 // pods' UDP target port
	tcpPort = 8080 // pods' TCP target port
)

var (
	udpVIP = netip.MustParseAddrPort("10.96.0.53:53")
	tcpVIP = netip.MustParseAddrPort("10.96.0.80:80")
)

// cluster is one node with a client pod and a ctnetlink handle on the node.
type cluster struct {
	t      *testing.T
	bed    *bed.Bed
	node   *bed.Node
	client *bed.Proc
	ct     *Netlink
	// ids maps a connection's name to the helper's id for it (openOn
	// tries several connections and keeps one).
	ids map[string]string
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	bed.RequirePrivileged(t)
	b, err := bed.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing bed: %v", err)
		}
	})
	node, err := b.AddNode("node")
	if err != nil {
		t.Fatal(err)
	}
	// Opened before any flow exists, so every flow carries a timestamp.
	ct, err := Open(Options{NetNS: node.NS.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ct.Close() })
	if !ct.Timestamps() {
		t.Fatal("conntrack timestamps could not be enabled in the node namespace")
	}
	cp, err := node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	client, err := cp.Start("client")
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{t: t, bed: b, node: node, client: client, ct: ct, ids: map[string]string{}}
}

// pod starts a pod serving its name on TCP tcpPort and UDP udpPort.
func (c *cluster) pod(name string) *bed.Pod {
	c.t.Helper()
	p, err := c.node.AddPod(name)
	if err != nil {
		c.t.Fatal(err)
	}
	c.serve(p)
	return p
}

func (c *cluster) serve(p *bed.Pod) {
	c.t.Helper()
	if _, err := p.Start("serve", p.Name, fmt.Sprintf("tcp::%d", tcpPort), fmt.Sprintf("udp::%d", udpPort)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) service(vip netip.AddrPort, proto string, port uint16, pods ...*bed.Pod) *bed.ClusterIP {
	c.t.Helper()
	svc, err := bed.NewClusterIP(c.node.NS, vip, proto, endpoints(port, pods...))
	if err != nil {
		c.t.Fatal(err)
	}
	return svc
}

func endpoints(port uint16, pods ...*bed.Pod) []netip.AddrPort {
	var eps []netip.AddrPort
	for _, p := range pods {
		eps = append(eps, netip.AddrPortFrom(p.IP4, port))
	}
	return eps
}

// openOn opens client connections to vip until one is served by pod (the
// statistic rule picks at random), keeps that one as id and closes the
// others.
func (c *cluster) openOn(id string, vip netip.AddrPort, proto, pod string) {
	c.t.Helper()
	for i := range 64 {
		try := fmt.Sprintf("%s-%d", id, i)
		r := c.call(bed.Request{Op: "open", ID: try, Addr: vip.String(), Proto: proto})
		if r.Server == pod {
			c.ids[id] = try
			return
		}
		c.call(bed.Request{Op: "close", ID: try})
	}
	c.t.Fatalf("64 %s connections to %s, none served by %s", proto, vip, pod)
}

func (c *cluster) call(req bed.Request) bed.Response {
	c.t.Helper()
	r, err := c.client.Call(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", req.Op, req.ID, err)
	}
	return r
}

// send sends one request on connection id and returns who answered, or
// the class of the error ("timeout", "reset", ...) if none did within
// timeout.
func (c *cluster) send(id string, timeout time.Duration) (server, errClass string, took time.Duration) {
	c.t.Helper()
	start := time.Now()
	r, err := c.client.Call(bed.Request{Op: "req", ID: c.ids[id], Timeout: timeout})
	took = time.Since(start)
	if err != nil {
		msg := err.Error()
		return "", msg[strings.LastIndex(msg, ": ")+2:], took
	}
	return r.Server, "", took
}

func (c *cluster) count(a netip.Addr) Counts {
	c.t.Helper()
	n, err := c.ct.Count(context.Background(), a)
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

func (c *cluster) expire(filters ...Filter) ExpireResult {
	c.t.Helper()
	res, err := c.ct.Expire(context.Background(), filters)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Logf("expire %v: %+v", filters, res)
	return res
}

// vanish makes a pod disappear the way a crashed or partitioned pod does:
// its link goes first, so its sockets die without a FIN or RST reaching
// anyone; then the namespace goes, and the node's route to the dead IP
// becomes a blackhole (packets to it are dropped silently). It returns the
// instant the pod was seen gone.
func (c *cluster) vanish(p *bed.Pod) time.Time {
	c.t.Helper()
	h, err := c.node.NS.Handle()
	if err != nil {
		c.t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(p.HostVeth)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := h.LinkDel(l); err != nil {
		c.t.Fatal(err)
	}
	if err := p.Delete(); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.node.NS.Run("ip", "route", "add", "blackhole", p.IP4.String()+"/32"); err != nil {
		c.t.Fatal(err)
	}
	return time.Now()
}

// a. After a UDP endpoint starts draining, the next datagram of an existing
// client flow (same socket, same 5-tuple) goes to a non-draining backend.
func TestPrivilegedUDPDrainRebalancesExistingFlow(t *testing.T) {
	c := newCluster(t)
	p1, p2 := c.pod("p1"), c.pod("p2")
	svc := c.service(udpVIP, "udp", udpPort, p1, p2)

	c.openOn("dns", udpVIP, "udp", "p1")
	if s, e, _ := c.send("dns", 2*time.Second); s != "p1" {
		t.Fatalf("second datagram answered by %q (%s), want p1: the flow should be pinned", s, e)
	}

	// p1 starts draining: kube-proxy drops it from the rules. Conntrack
	// still pins the existing flow, which is the problem being solved.
	if err := svc.SetBackends(endpoints(udpPort, p2)); err != nil {
		t.Fatal(err)
	}
	if s, e, _ := c.send("dns", 2*time.Second); s != "p1" {
		t.Fatalf("control: without expiry the next datagram was answered by %q (%s), want p1 (pinned by conntrack)", s, e)
	}

	res := c.expire(Filter{Proto: UDP, ReplySrc: netip.AddrPortFrom(p1.IP4, udpPort)})
	if res.Deleted < 1 || res.PerFilter[0] != res.Deleted {
		t.Fatalf("expire = %+v, want the client's flow deleted", res)
	}
	if s, e, _ := c.send("dns", 2*time.Second); s != "p2" {
		t.Fatalf("after expiry the same socket's datagram was answered by %q (%s), want p2", s, e)
	}
	if n := c.count(p1.IP4); n.UDP != 0 {
		t.Fatalf("p1 still has %d UDP flows", n.UDP)
	}
}

// b. A draining pod's established TCP connection survives an expiry pass
// that targets the pod's UDP, and Count reports it as live.
func TestPrivilegedDrainingTCPSurvivesUDPExpiry(t *testing.T) {
	c := newCluster(t)
	p1, p2 := c.pod("p1"), c.pod("p2")
	tcpSvc := c.service(tcpVIP, "tcp", tcpPort, p1, p2)
	udpSvc := c.service(udpVIP, "udp", udpPort, p1, p2)
	c.openOn("web", tcpVIP, "tcp", "p1")
	c.openOn("dns", udpVIP, "udp", "p1")

	before := c.count(p1.IP4)
	if before.UDP < 1 || before.TCP[TCPEstablished] < 1 {
		t.Fatalf("before expiry p1 has %+v, want at least one UDP and one established TCP flow", before)
	}
	// p1 starts draining: kube-proxy sends new connections to p2 only.
	if err := tcpSvc.SetBackends(endpoints(tcpPort, p2)); err != nil {
		t.Fatal(err)
	}
	if err := udpSvc.SetBackends(endpoints(udpPort, p2)); err != nil {
		t.Fatal(err)
	}

	// The UDP filter names the Service too (original destination), as the
	// daemon does for Service flows.
	res := c.expire(Filter{Proto: UDP, ReplySrc: netip.AddrPortFrom(p1.IP4, udpPort), OrigDst: udpVIP})
	if res.Deleted < 1 {
		t.Fatalf("expire = %+v, want p1's UDP flow deleted", res)
	}
	if s, e, _ := c.send("web", 2*time.Second); s != "p1" {
		t.Fatalf("draining pod's TCP connection after UDP expiry: answered by %q (%s), want p1", s, e)
	}
	after := c.count(p1.IP4)
	if after.UDP != 0 {
		t.Fatalf("p1 still has %d UDP flows", after.UDP)
	}
	if after.TCP[TCPEstablished] < 1 || after.LiveTCP() < 1 {
		t.Fatalf("after UDP expiry Count(p1) = %+v, want the established TCP connection counted live", after)
	}
}

// c. Once the pod is gone, expiring its TCP flows makes a client with an
// open connection fail within 1 s of its next write; without expiry it
// sends into a black hole and sees nothing within 1 s.
func TestPrivilegedGonePodTCPExpiryFailsFast(t *testing.T) {
	c := newCluster(t)
	p1, p2 := c.pod("p1"), c.pod("p2")
	svc := c.service(tcpVIP, "tcp", tcpPort, p1, p2)
	c.openOn("control", tcpVIP, "tcp", "p1")
	c.openOn("expired", tcpVIP, "tcp", "p1")

	if err := svc.SetBackends(endpoints(tcpPort, p2)); err != nil {
		t.Fatal(err)
	}
	gone := c.vanish(p1)

	s, e, took := c.send("control", time.Second)
	if s != "" || e != "timeout" {
		t.Fatalf("control: without expiry the write got %q/%q after %v, want no answer and no error within 1s (black hole)", s, e, took)
	}

	res := c.expire(Filter{Proto: TCP, ReplySrc: netip.AddrPortFrom(p1.IP4, tcpPort), CreatedBefore: gone})
	if res.Deleted < 2 {
		t.Fatalf("expire = %+v, want both connections' flows deleted", res)
	}
	s, e, took = c.send("expired", time.Second)
	if s != "" || e == "timeout" || e == "" {
		t.Fatalf("after expiry the write got %q/%q after %v, want an error within 1s", s, e, took)
	}
	t.Logf("client error after expiry: %s in %v", e, took)
}

// d. A new pod on the reused IP keeps its flows: expiring with
// CreatedBefore = the moment the old pod was seen gone deletes the old
// pod's flows and not the ones the new pod accepted afterwards.
func TestPrivilegedReusedIPKeepsNewPodFlows(t *testing.T) {
	c := newCluster(t)
	old := c.pod("old")
	svc := c.service(tcpVIP, "tcp", tcpPort, old)
	c.openOn("old", tcpVIP, "tcp", "old")

	gone := c.vanish(old)
	ip := old.IP4
	if _, err := c.node.NS.Run("ip", "route", "del", "blackhole", ip.String()+"/32"); err != nil {
		t.Fatal(err)
	}
	// Timestamps have a nanosecond clock; make "after" unambiguous.
	time.Sleep(10 * time.Millisecond)
	reborn, err := c.node.AddPodIPs("new", ip, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	c.serve(reborn)
	if err := svc.SetBackends(endpoints(tcpPort, reborn)); err != nil {
		t.Fatal(err)
	}
	c.openOn("new", tcpVIP, "tcp", "new")

	if n := c.count(ip); n.TCP[TCPEstablished] < 2 {
		t.Fatalf("before expiry Count(%s) = %+v, want the old and the new connection", ip, n)
	}
	filter := Filter{Proto: TCP, ReplySrc: netip.AddrPortFrom(ip, tcpPort), CreatedBefore: gone}
	res := c.expire(filter)
	if res.Deleted != 1 || res.Kept != 1 {
		t.Fatalf("expire = %+v, want the old pod's flow deleted and the new pod's kept", res)
	}
	if s, e, _ := c.send("new", 2*time.Second); s != "new" {
		t.Fatalf("new pod's connection after expiry: answered by %q (%s), want new", s, e)
	}
	if s, e, took := c.send("old", time.Second); s != "" || e == "" || e == "timeout" {
		t.Fatalf("old pod's client after expiry got %q/%q after %v, want a fast error", s, e, took)
	}
	// Control: the same filter without CreatedBefore deletes the new pod's
	// flow, so it was the timestamp that protected it.
	filter.CreatedBefore = time.Time{}
	if res := c.expire(filter); res.Deleted < 1 {
		t.Fatalf("expire without CreatedBefore = %+v, want the new pod's flow deleted", res)
	}
}

// e. A SYN the pod never answers (its network going, a policy dropping
// it) leaves a SYN_SENT flow with the pod as its reply source for two
// minutes: Count sees it, and LiveTCP does not count it as a connection
// the pod holds, while the pod's established connection still counts.
func TestPrivilegedUnansweredSYNIsNotLive(t *testing.T) {
	c := newCluster(t)
	p1 := c.pod("p1")
	// A Service makes the node track its flows, as kube-proxy's does; the
	// client dials the pod's IP (a stale registry entry, a probe).
	c.service(tcpVIP, "tcp", tcpPort, p1)
	direct := netip.AddrPortFrom(p1.IP4, tcpPort)
	c.openOn("kept", direct, "tcp", "p1")
	before := c.count(p1.IP4)
	if before.TCP[TCPEstablished] != 1 || before.LiveTCP() != 1 {
		t.Fatalf("before: Count(p1) = %+v, want one established connection, live", before)
	}
	// The pod's side of its link goes down: the node still routes to it,
	// so the flow is confirmed, and nothing answers.
	if _, err := p1.NS.Run("ip", "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
	r, err := c.client.Call(bed.Request{Op: "open", ID: "lost", Addr: direct.String(), Timeout: 300 * time.Millisecond})
	if err == nil && r.Err == "" {
		t.Fatalf("a connection to p1 with its link down was answered by %q", r.Server)
	}
	after := c.count(p1.IP4)
	if after.TCP[TCPSynSent] < 1 {
		t.Fatalf("after the unanswered SYN: Count(p1) = %+v, want a SYN_SENT flow", after)
	}
	if got := after.LiveTCP(); got != 1 {
		t.Fatalf("after the unanswered SYN: LiveTCP() = %d of %+v, want 1 (the established connection alone)", got, after)
	}
}

// testNS is a fresh namespace for tests on synthetic flows.
func testNS(t testing.TB) *bed.NetNS {
	t.Helper()
	ns, err := bed.NewNetNS("dct-" + bed.RandSuffix(8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("removing namespace: %v", err)
		}
	})
	return ns
}

// tableCount reads nf_conntrack_count inside ns: the whole table, counted
// by the kernel, independent of this package's dump code.
func tableCount(t testing.TB, ns *bed.NetNS) int {
	t.Helper()
	var n int
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// synthetic returns flow i of a mixed table: a few endpoints (IPv4 and
// IPv6, TCP and UDP, some in zone 5, some dialled directly) and
// background flows to unrelated addresses.
func synthetic(i int) Flow {
	cl4 := netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)})
	cl6 := netip.AddrFrom16([16]byte{0xfd, 0, 1, 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)})
	sport := uint16(1024 + i%50000)
	mk := func(p Proto, cl, dst, ep netip.Addr, dport, eport uint16) Flow {
		return Flow{Proto: p, State: TCPEstablished,
			Orig:  Tuple{Src: netip.AddrPortFrom(cl, sport), Dst: netip.AddrPortFrom(dst, dport)},
			Reply: Tuple{Src: netip.AddrPortFrom(ep, eport), Dst: netip.AddrPortFrom(cl, sport)}}
	}
	switch i % 8 {
	case 0:
		return mk(UDP, cl4, vip, podA, 53, 5353)
	case 1:
		return mk(TCP, cl4, vip, podA, 80, 8080)
	case 2:
		return mk(TCP, cl4, podA, podA, 9090, 9090) // direct dial
	case 3:
		f := mk(UDP, cl4, vip, podA, 53, 5353)
		f.Zone = 5
		return f
	case 4:
		return mk(TCP, cl6, netip.MustParseAddr("fd96::a"), netip.MustParseAddr("fd01::5"), 80, 8080)
	case 5:
		return mk(UDP, cl6, netip.MustParseAddr("fd96::a"), netip.MustParseAddr("fd01::5"), 53, 5353)
	case 6:
		return mk(TCP, cl4, vip, podB, 80, 8080)
	default:
		return mk(UDP, cl6, netip.MustParseAddr("fd96::a"), netip.MustParseAddr("fd01::6"), 53, 5353)
	}
}

// TestPrivilegedExpireMatchesClassify runs an expiry on a real table and
// applies the exported rules (FilterSet.Classify, CountedFor) to the same
// flows: the kernel-filtered dump (including the IPv6 path and zones) and
// the batched deletes must remove exactly what the pure matching rules
// select, no more and no less. The table is filled and checked afterwards
// through ti-mo/conntrack, not through this package's own encoder and
// parser.
func TestPrivilegedExpireMatchesClassify(t *testing.T) {
	bed.RequirePrivileged(t)
	ns := testNS(t)
	// Opened first, so the flows get timestamps; a small batch size so
	// the pass spans many batches.
	ct, err := Open(Options{NetNS: ns.Path(), BatchSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	// The same table seen from zone 5 (synthetic puts 1/8 of it there).
	ct5, err := Open(Options{NetNS: ns.Path(), BatchSize: 7, Zone: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer ct5.Close()
	const n = 4000
	if err := createFlows(ns.Path(), n, 600, synthetic); err != nil {
		t.Fatal(err)
	}
	if got := tableCount(t, ns); got != n {
		t.Fatalf("table has %d flows after creating %d", got, n)
	}
	table := make([]Flow, n)
	now := time.Now() // the kernel's start times are earlier, but within the hour
	for i := range table {
		table[i] = synthetic(i)
		table[i].Start = now
	}

	filters := []Filter{
		{Proto: UDP, ReplySrc: ap(podA, 5353)},                                               // zone 0 here, zone 5 through ct5
		{Proto: TCP, ReplySrc: ap(podA, 9090), OrigDst: ap(podA, 9090)},                      // direct dials
		{Proto: TCP, ReplySrc: netip.MustParseAddrPort("[fd01::5]:8080")},                    // IPv6
		{Proto: UDP, ReplySrc: netip.MustParseAddrPort("[fd01::5]:0"), OrigDst: ap(vip, 53)}, // fixed below
		{Proto: TCP, ReplySrc: ap(podB, 8080), CreatedBefore: time.Now().Add(-time.Hour)},    // all younger: kept
	}
	// Filter 3 mixes address families: the whole call must be rejected
	// before anything is deleted.
	if _, err := ct.Expire(context.Background(), filters); err == nil {
		t.Fatal("Expire accepted a filter whose original destination is of another family")
	}
	if got := tableCount(t, ns); got != n {
		t.Fatalf("a rejected Expire changed the table: %d flows", got)
	}
	filters[3].OrigDst = netip.MustParseAddrPort("[fd96::a]:53")

	// left holds, per zone, the flows the rules leave after that zone's
	// pass.
	var total, totalWant ExpireResult
	left := map[uint16][]Flow{}
	for _, h := range []struct {
		zone uint16
		ct   *Netlink
	}{{0, ct}, {5, ct5}} {
		want, kept, err := expireTable(h.zone, filters, table)
		if err != nil {
			t.Fatal(err)
		}
		left[h.zone] = kept
		got, err := h.ct.Expire(context.Background(), filters)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("zone %d: ipv6 address filtering in the kernel works: %v", h.zone, h.ct.v6Filter == 1)
		if got.Deleted != want.Deleted || got.Kept != want.Kept || fmt.Sprint(got.PerFilter) != fmt.Sprint(want.PerFilter) {
			t.Fatalf("zone %d: Netlink.Expire = %+v, the rules say %+v", h.zone, got, want)
		}
		total.Deleted, total.Kept = total.Deleted+got.Deleted, total.Kept+got.Kept
		totalWant.Deleted, totalWant.Kept = totalWant.Deleted+want.Deleted, totalWant.Kept+want.Kept
		if h.zone == 0 && (want.Deleted != n/8*4 || want.Kept != n/8) {
			t.Fatalf("zone 0: the rules say %+v: the zone 0 pass was meant to delete 4/8 and keep 1/8 (the zone 5 eighth is not its own)", want)
		}
	}
	if totalWant.Deleted != n/8*5 || totalWant.Kept != n/8 {
		t.Fatalf("the rules say %+v: the table was meant to lose 5/8 and keep 1/8", totalWant)
	}
	if left := tableCount(t, ns); left != n-total.Deleted {
		t.Fatalf("table has %d flows, want %d", left, n-total.Deleted)
	}
	// What is left, read by ti-mo/conntrack, is what both passes kept.
	inTable := tableFlows(t, ns.Path())
	key := func(fl Flow) string {
		if fl.Proto != TCP {
			fl.State = 0 // synthetic gives every flow a state; the kernel keeps it for TCP only
		}
		return fmt.Sprint(fl.Proto, fl.Orig, fl.Reply, fl.Zone, fl.State)
	}
	kept5 := map[string]bool{}
	for _, fl := range left[5] {
		kept5[key(fl)] = true
	}
	wantLeft := map[string]bool{}
	for _, fl := range left[0] {
		if kept5[key(fl)] {
			wantLeft[key(fl)] = true
		}
	}
	if len(inTable) != len(wantLeft) {
		t.Fatalf("ti-mo/conntrack reads %d flows, the rules keep %d", len(inTable), len(wantLeft))
	}
	for _, fl := range inTable {
		if !wantLeft[key(fl)] {
			t.Fatalf("flow %+v is in the table but a pass was meant to delete it", fl)
		}
	}
	for _, a := range []netip.Addr{podA, podB, netip.MustParseAddr("fd01::5"), netip.MustParseAddr("fd01::6")} {
		for _, h := range []*Netlink{ct, ct5} {
			gotC, err := h.Count(context.Background(), a)
			if err != nil {
				t.Fatal(err)
			}
			if wantC := countTable(h.zone, a, left[h.zone]); gotC != wantC {
				t.Errorf("zone %d: Count(%s) = %+v, the rules say %+v", h.zone, a, gotC, wantC)
			}
		}
	}
	// A second pass finds nothing left to delete.
	again, err := ct.Expire(context.Background(), filters)
	if err != nil || again.Deleted != 0 {
		t.Fatalf("second pass = %+v, %v; want nothing deleted", again, err)
	}
}

// TestPrivilegedDeleteBatchENOENT sends a batch in which some flows do not
// exist: those are "already gone", not errors, and not counted as deleted.
func TestPrivilegedDeleteBatchENOENT(t *testing.T) {
	bed.RequirePrivileged(t)
	ns := testNS(t)
	if err := createFlows(ns.Path(), 10, 600, synthetic); err != nil {
		t.Fatal(err)
	}
	ct, err := Open(Options{NetNS: ns.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	_, del, err := ct.sockets()
	if err != nil {
		t.Fatal(err)
	}
	res := ExpireResult{PerFilter: make([]int, 2)}
	b := &deleteBatch{ctx: context.Background(), conn: del, e: &encoder{}, max: 100, res: &res}
	for i := range 20 { // flows 10..19 were never created
		b.add(entryOf(synthetic(i)), i%2)
	}
	// Flow 3 twice: the second delete finds it gone (a dump duplicate).
	b.add(entryOf(synthetic(3)), 1)
	if err := b.flush(); err != nil {
		t.Fatal(err)
	}
	if b.failures != 0 {
		t.Fatalf("%d failures (%v): ENOENT must not count as one", b.failures, b.firstFailure)
	}
	if res.Deleted != 10 || res.PerFilter[0] != 5 || res.PerFilter[1] != 5 {
		t.Fatalf("result %+v, want 10 deleted, 5 per filter", res)
	}
	if left := tableCount(t, ns); left != 0 {
		t.Fatalf("%d flows left", left)
	}
}

// entryOf names fl the way a dump would (the zone as CTA_ZONE).
func entryOf(fl Flow) *ctEntry { return &ctEntry{Flow: fl, zoneTop: fl.Zone != 0} }

func TestPrivilegedCancelAndReuse(t *testing.T) {
	bed.RequirePrivileged(t)
	ns := testNS(t)
	if err := createFlows(ns.Path(), 800, 600, synthetic); err != nil {
		t.Fatal(err)
	}
	ct, err := Open(Options{NetNS: ns.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ct.Expire(ctx, []Filter{{Proto: UDP, ReplySrc: ap(podA, 0)}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Expire with a cancelled context: %v", err)
	}
	if _, err := ct.Count(ctx, podA); !errors.Is(err, context.Canceled) {
		t.Fatalf("Count with a cancelled context: %v", err)
	}
	if got := tableCount(t, ns); got != 800 {
		t.Fatalf("a cancelled Expire changed the table: %d flows", got)
	}
	// The handle recovers: fresh sockets, correct results. podA has 200
	// UDP flows, half of them in zone 5 (synthetic), which a zone 0
	// handle neither counts nor deletes.
	c, err := ct.Count(context.Background(), podA)
	if err != nil {
		t.Fatal(err)
	}
	if c.UDP != 100 || c.TCP[TCPEstablished] != 200 {
		t.Fatalf("Count after cancellation = %+v, want 100 UDP (zone 0 only) and 200 established TCP", c)
	}
	res, err := ct.Expire(context.Background(), []Filter{{Proto: UDP, ReplySrc: ap(podA, 0)}})
	if err != nil || res.Deleted != 100 {
		t.Fatalf("Expire after cancellation = %+v, %v; want 100 deleted (zone 0 only)", res, err)
	}
	ct5, err := Open(Options{NetNS: ns.Path(), Zone: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer ct5.Close()
	res, err = ct5.Expire(context.Background(), []Filter{{Proto: UDP, ReplySrc: ap(podA, 0)}})
	if err != nil || res.Deleted != 100 {
		t.Fatalf("Expire in zone 5 = %+v, %v; want the other 100 deleted", res, err)
	}
	if got := tableCount(t, ns); got != 600 {
		t.Fatalf("table has %d flows, want 600: podA's 200 UDP flows gone, nothing else", got)
	}
}

func TestPrivilegedOpen(t *testing.T) {
	bed.RequirePrivileged(t)
	if _, err := Open(Options{NetNS: "/run/netns/does-not-exist-" + bed.RandSuffix(6)}); err == nil ||
		!strings.HasPrefix(err.Error(), "opening network namespace ") || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open of a missing namespace: %v", err)
	}
	ns := testNS(t)
	var before string
	ns.Do(func() error {
		b, err := os.ReadFile(timestampSysctl)
		before = strings.TrimSpace(string(b))
		return err
	})
	if before != "0" {
		t.Fatalf("a fresh namespace has nf_conntrack_timestamp=%s; the test needs 0 to show Open turns it on", before)
	}
	ct, err := Open(Options{NetNS: ns.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer ct.Close()
	if !ct.Timestamps() {
		t.Fatal("Timestamps() = false after Open")
	}
	var after string
	ns.Do(func() error {
		b, err := os.ReadFile(timestampSysctl)
		after = strings.TrimSpace(string(b))
		return err
	})
	if after != "1" {
		t.Fatalf("nf_conntrack_timestamp in the target namespace = %s, want 1", after)
	}
	// The sockets live in the target namespace, not the caller's: a flow
	// created there is visible through them.
	if err := createFlows(ns.Path(), 8, 600, synthetic); err != nil {
		t.Fatal(err)
	}
	c, err := ct.Count(context.Background(), podA)
	if err != nil {
		t.Fatal(err)
	}
	if c.UDP != 1 || c.TCP[TCPEstablished] != 2 {
		t.Fatalf("Count = %+v, want the 3 zone 0 flows of podA created in the namespace (the 4th is in zone 5)", c)
	}
	if err := ct.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ct.Count(context.Background(), podA); err == nil {
		t.Fatal("Count after Close succeeded")
	}
}
