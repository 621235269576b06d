package bed

import (
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
)

// natNS is a namespace with three "endpoints" on lo (192.0.2.1-3:8080, one
// server listening on all of them) and a route for the VIP range, so that
// its own processes reach a VIP through the nat OUTPUT hook as a node's do.
type natNS struct {
	ns  *NetNS
	mu  sync.Mutex
	hit map[netip.Addr]int // accepted connections by local address
}

var (
	natVIP = netip.MustParseAddrPort("198.51.100.10:80")
	natEPs = []netip.AddrPort{
		netip.MustParseAddrPort("192.0.2.1:8080"),
		netip.MustParseAddrPort("192.0.2.2:8080"),
		netip.MustParseAddrPort("192.0.2.3:8080"),
	}
)

func newNATNS(t *testing.T) *natNS {
	t.Helper()
	ns, err := NewNetNS("dbnat-" + RandSuffix(6))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := ns.Handle()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, ep := range natEPs {
		if err := h.AddrAdd(lo, addrOf(ep.Addr())); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(netip.MustParsePrefix("198.51.100.0/24")), Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	n := &natNS{ns: ns, hit: map[netip.Addr]int{}}
	var l net.Listener
	if err := ns.Do(func() (err error) { l, err = net.Listen("tcp4", "0.0.0.0:8080"); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.hit[c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()]++
			n.mu.Unlock()
			c.Close()
		}
	}()
	return n
}

// dial connects to addr from inside the namespace n times and returns how
// many connected.
func (n *natNS) dial(addr netip.AddrPort, count int) (int, error) {
	ok := 0
	err := n.ns.Do(func() error {
		for range count {
			c, err := net.DialTimeout("tcp4", addr.String(), 500*time.Millisecond)
			if err != nil {
				continue
			}
			ok++
			c.Close()
		}
		return nil
	})
	return ok, err
}

// hits waits until the server accepted want connections in total and
// returns them by endpoint address.
func (n *natNS) hits(t *testing.T, want int) map[netip.Addr]int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n.mu.Lock()
		total := 0
		for _, v := range n.hit {
			total += v
		}
		if total >= want || time.Now().After(deadline) {
			out := n.hit
			n.hit = map[netip.Addr]int{}
			n.mu.Unlock()
			return out
		}
		n.mu.Unlock()
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPrivilegedNATSpreadsOverEndpoints: new connections to the VIP reach
// every endpoint, a sync moves them to the new endpoint set, and a Service
// without endpoints gets no DNAT.
func TestPrivilegedNATSpreadsOverEndpoints(t *testing.T) {
	RequirePrivileged(t)
	n := newNATNS(t)
	nat, err := NewNAT(n.ns, "bed_test_nat", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := nat.Sync([]NATService{{VIP: natVIP, Proto: "tcp", Endpoints: natEPs}}); err != nil {
		t.Fatal(err)
	}
	// Each of 3 endpoints misses 90 connections with probability (2/3)^90.
	if ok, err := n.dial(natVIP, 90); err != nil || ok != 90 {
		t.Fatalf("%d of 90 connections to the VIP connected (%v)", ok, err)
	}
	hit := n.hits(t, 90)
	for _, ep := range natEPs {
		if hit[ep.Addr()] == 0 {
			t.Errorf("endpoint %s got no connection: %v", ep, hit)
		}
	}
	if err := nat.Sync([]NATService{{VIP: natVIP, Proto: "tcp", Endpoints: natEPs[1:2]}}); err != nil {
		t.Fatal(err)
	}
	if ok, err := n.dial(natVIP, 20); err != nil || ok != 20 {
		t.Fatalf("%d of 20 connections to the VIP connected (%v)", ok, err)
	}
	if hit := n.hits(t, 20); hit[natEPs[1].Addr()] != 20 || len(hit) != 1 {
		t.Errorf("after the sync to one endpoint, connections went to %v", hit)
	}
	if err := nat.Sync([]NATService{{VIP: natVIP, Proto: "tcp"}}); err != nil {
		t.Fatal(err)
	}
	if ok, _ := n.dial(natVIP, 3); ok != 0 {
		t.Errorf("%d connections to a VIP without endpoints connected", ok)
	}
	if err := nat.Close(); err != nil {
		t.Fatal(err)
	}
	if err := nat.Close(); err != nil {
		t.Errorf("closing twice: %v", err)
	}
	// Bad input: a clear error, nothing changed.
	if err := nat.Sync([]NATService{{VIP: natVIP, Proto: "sctp", Endpoints: natEPs}}); err == nil {
		t.Error("an unknown protocol was accepted")
	}
	if err := nat.Sync([]NATService{{VIP: natVIP, Endpoints: []netip.AddrPort{netip.MustParseAddrPort("[fd00::1]:80")}}}); err == nil {
		t.Error("an IPv6 endpoint of an IPv4 Service was accepted")
	}
}

// TestPrivilegedNATSyncReplacesTable: a sync leaves exactly the chains and
// rules of the Services it was given (a gone Service's chain is deleted, a
// Service without endpoints gets none), in the kernel's table.
func TestPrivilegedNATSyncReplacesTable(t *testing.T) {
	RequirePrivileged(t)
	n := newNATNS(t)
	nat, err := NewNAT(n.ns, "bed_test_sync", false)
	if err != nil {
		t.Fatal(err)
	}
	old := netip.MustParseAddrPort("198.51.100.99:80")
	empty := netip.MustParseAddrPort("198.51.100.12:80")
	if err := nat.Sync([]NATService{{VIP: natVIP, Endpoints: natEPs[:2]}, {VIP: old, Endpoints: natEPs[2:]}}); err != nil {
		t.Fatal(err)
	}
	if got := tableChains(t, nat); !slices.Equal(got, []string{"output", "prerouting", "services", "svc-0", "svc-1"}) {
		t.Errorf("chains after the first sync: %v", got)
	}
	if err := nat.Sync([]NATService{{VIP: natVIP, Endpoints: natEPs[:2]}, {VIP: empty}}); err != nil {
		t.Fatal(err)
	}
	if got := tableChains(t, nat); !slices.Equal(got, []string{"output", "prerouting", "services", "svc-0"}) {
		t.Errorf("chains after the second sync (the gone and the empty Service must have none): %v", got)
	}
	rules := chainRules(t, nat, "services")
	if len(rules) != 1 {
		t.Errorf("services chain has %d rules, want 1 (the Service without endpoints gets none)", len(rules))
	}
	svc := chainRules(t, nat, "svc-0")
	if len(svc) != 2 {
		t.Fatalf("svc-0 has %d rules, want one per endpoint", len(svc))
	}
	ng, ok := svc[0].Exprs[0].(*expr.Numgen)
	if !ok || ng.Modulus != 2 {
		t.Errorf("the first endpoint's rule does not pick 1 of 2 at random: %#v", svc[0].Exprs[0])
	}
	if slices.ContainsFunc(svc[1].Exprs, func(e expr.Any) bool { _, ok := e.(*expr.Numgen); return ok }) {
		t.Error("the last endpoint's rule is not unconditional")
	}
}

func tableChains(t *testing.T, nat *NAT) []string {
	t.Helper()
	c, done, err := nat.conn()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		if ch.Table.Name == nat.table.Name {
			names = append(names, ch.Name)
		}
	}
	slices.Sort(names)
	return names
}

func chainRules(t *testing.T, nat *NAT, chain string) []*nftables.Rule {
	t.Helper()
	c, done, err := nat.conn()
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	rules, err := c.GetRules(nat.table, &nftables.Chain{Name: chain, Table: nat.table})
	if err != nil {
		t.Fatal(err)
	}
	return rules
}

// TestPrivilegedSYNCounterCountsSYNsToItsPort: every SYN to the port counts
// once, SYNs to other ports do not, and a removed counter is an error, not
// a zero.
func TestPrivilegedSYNCounterCountsSYNsToItsPort(t *testing.T) {
	RequirePrivileged(t)
	n := newNATNS(t)
	s, err := NewSYNCounter(n.ns, "bed_test_syns", 8080)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := s.Count(); err != nil || c != 0 {
		t.Fatalf("fresh counter: %d, %v", c, err)
	}
	if ok, err := n.dial(natEPs[0], 5); err != nil || ok != 5 {
		t.Fatalf("%d of 5 connections connected (%v)", ok, err)
	}
	n.dial(netip.AddrPortFrom(natEPs[0].Addr(), 8081), 3) // refused: SYNs to another port
	if c, err := s.Count(); err != nil || c != 5 {
		t.Errorf("counted %d SYNs (%v), want 5", c, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Count(); err == nil {
		t.Error("reading a removed counter gave no error")
	}
}
