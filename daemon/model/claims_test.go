package model

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/draind/draind/k8s"
)

// claimsReference answers the claims' questions from scratch, from the
// slices applied: what claims must keep answering however it indexes them.
type claimsReference map[string]*k8s.Slice

// ready returns the pods listed ready at ip.
func (r claimsReference) ready(ip netip.Addr) []types.UID {
	var out []types.UID
	for _, s := range r {
		for i := range s.Len() {
			if e := s.Endpoint(i); e.Addr == ip && e.PodUID != "" && e.Ready() && !slices.Contains(out, e.PodUID) {
				out = append(out, e.PodUID)
			}
		}
	}
	slices.Sort(out)
	return out
}

// nodes returns whether uid is listed at ip and the nodes it is listed on.
func (r claimsReference) nodes(ip netip.Addr, uid types.UID) (listed bool, nodes []string) {
	for _, s := range r {
		for i := range s.Len() {
			if e := s.Endpoint(i); e.Addr == ip && e.PodUID == uid {
				listed = true
				if e.Node != "" {
					nodes = append(nodes, e.Node)
				}
			}
		}
	}
	return listed, nodes
}

// refDeparted is a pod's last listing at an IP that ended: the nodes it
// was listed on just before.
type refDeparted struct {
	uid   types.UID
	nodes []string
	at    time.Time
}

// TestClaimsMatchReference applies random slice states (shared IPs, a pod
// listed by several slices, pods listed twice in one slice, endpoints
// without a pod, IPv4 and IPv6, updates of conditions only) and checks every answer, and the IPs each
// change reports, against the reference. A pod whose last listing at an IP
// ended (with a node) less than keep ago is still hosted there. The IPs
// the generation watches change at random: an answer for a watched IP
// holds while the generation does.
func TestClaimsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ips := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"),
		netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("::ffff:10.0.0.1")}
	uids := []types.UID{"", "pod-a", "pod-b", "pod-c"}
	nodes := []string{"", "node-1", "node-2"}
	keys := []string{"ns/s1", "ns/s2", "ns/s3", "ns/s4"}
	// A slice lists one family of addresses, as the API's do.
	keyFamily := map[string]k8s.Family{"ns/s1": k8s.IPv4, "ns/s2": k8s.IPv4, "ns/s3": k8s.IPv6, "ns/s4": k8s.IPv6}
	ipsOf := map[k8s.Family][]netip.Addr{}
	for _, ip := range ips {
		ipsOf[k8s.FamilyOf(ip)] = append(ipsOf[k8s.FamilyOf(ip)], ip)
	}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	const keep = 10 * time.Second
	c := NewClaims(clk, keep)
	ref := claimsReference{}
	// departed: the pods whose last listing at an IP ended in the latest
	// step that ended one there (a step may end several: any may answer).
	departed := map[netip.Addr][]refDeparted{}
	// answers: hostOf's answers of the last step that watched their IP,
	// with the generation read before them: while it stays (and until the
	// answer's end), the answer must too (the Leases' memo relies on it),
	// and an IP watched again must not answer from before.
	type answer struct {
		node   string
		listed bool
		until  time.Time
		gen    uint64
	}
	answers := map[string]answer{}
	var watched map[netip.Addr]struct{} // nil: every IP (until the first watch)
	for step := 0; step < 20000; step++ {
		clk.SetTime(clk.Now().Add(time.Duration(rng.IntN(2000)) * time.Millisecond))
		if step > 2000 && rng.IntN(20) == 0 {
			watched = map[netip.Addr]struct{}{}
			var list []netip.Addr
			for _, ip := range ips {
				if rng.IntN(2) == 0 {
					watched[ip] = struct{}{}
					list = append(list, ip)
				}
			}
			c.Watch(list)
		}
		key := keys[rng.IntN(len(keys))]
		var s *k8s.Slice
		switch prev := ref[key]; {
		case prev != nil && rng.IntN(3) == 0:
			// The usual update: the same endpoints, new conditions.
			var eps []k8s.Endpoint
			for i := range prev.Len() {
				e := prev.Endpoint(i)
				e.Conds = uint8(rng.IntN(8))
				eps = append(eps, e)
			}
			s = apiSlice(&k8s.Slice{Family: keyFamily[key]}, "", eps...)
		case rng.IntN(5) > 0:
			var eps []k8s.Endpoint
			pool := ipsOf[keyFamily[key]]
			for range rng.IntN(5) {
				e := k8s.Endpoint{Addr: pool[rng.IntN(len(pool))], PodUID: uids[rng.IntN(len(uids))], Node: nodes[rng.IntN(len(nodes))]}
				e.Conds = uint8(rng.IntN(8))
				eps = append(eps, e)
			}
			s = apiSlice(&k8s.Slice{Family: keyFamily[key]}, "", eps...)
		}
		before := map[netip.Addr][]types.UID{}
		type ipUID struct {
			ip  netip.Addr
			uid types.UID
		}
		nodesBefore := map[ipUID][]string{}
		for _, ip := range ips {
			before[ip] = ref.ready(ip)
			for _, uid := range uids[1:] {
				if listed, ns := ref.nodes(ip, uid); listed {
					nodesBefore[ipUID{ip, uid}] = ns
				}
			}
		}
		changed := c.SetSlice(key, s)
		if s == nil {
			delete(ref, key)
		} else {
			ref[key] = s
		}
		departedNow := map[netip.Addr][]refDeparted{}
		for k, ns := range nodesBefore {
			if listed, _ := ref.nodes(k.ip, k.uid); !listed && len(ns) > 0 {
				departedNow[k.ip] = append(departedNow[k.ip], refDeparted{k.uid, ns, clk.Now()})
			}
		}
		maps.Copy(departed, departedNow)
		var want []netip.Addr
		for _, ip := range ips {
			if !slices.Equal(before[ip], ref.ready(ip)) {
				want = append(want, ip)
			}
		}
		slices.SortFunc(changed, netip.Addr.Compare)
		changed = slices.Compact(changed)
		slices.SortFunc(want, netip.Addr.Compare)
		if !slices.Equal(changed, want) {
			t.Fatalf("step %d: setSlice(%s) reported %v changed, want %v", step, key, changed, want)
		}
		for _, ip := range ips {
			ready := ref.ready(ip)
			for _, uid := range uids[1:] {
				other := slices.ContainsFunc(ready, func(u types.UID) bool { return u != uid })
				if got := c.ClaimedByOther(ip, uid); got != other {
					t.Fatalf("step %d: claimedByOther(%v, %s) = %v, want %v (ready: %v)", step, ip, uid, got, other, ready)
				}
				listed, ns := ref.nodes(ip, uid)
				var gone []string // the nodes it departed from, remembered
				for _, d := range departed[ip] {
					if d.uid == uid && clk.Since(d.at) < keep {
						gone = d.nodes
					}
				}
				tie := len(departed[ip]) > 1 // which one the index remembers is its choice
				gen, isWatched := c.Generation(), c.isWatched(ip)
				if _, w := watched[ip]; w != isWatched && watched != nil {
					t.Fatalf("step %d: %v watched: %v, want %v", step, ip, isWatched, w)
				}
				node, gotListed, until := c.HostOf(ip, uid)
				k := ip.String() + "/" + string(uid)
				if a, ok := answers[k]; ok && isWatched && a.gen == gen && (a.until.IsZero() || clk.Now().Before(a.until)) && (a.node != node || a.listed != gotListed) {
					t.Fatalf("step %d: hostOf(%v, %s) = %q, %v at generation %d, which answered %q, %v", step, ip, uid, node, gotListed, gen, a.node, a.listed)
				}
				if isWatched {
					answers[k] = answer{node, gotListed, until, gen}
				}
				distinct := slices.Compact(slices.Sorted(slices.Values(ns)))
				switch {
				case len(distinct) > 1: // contradicting listings answer nothing, whatever their order
					if gotListed || node != "" || !until.IsZero() {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v, %v; listed on %v, want no answer", step, ip, uid, node, gotListed, until, distinct)
					}
				case len(ns) > 0:
					if !gotListed || !slices.Contains(ns, node) {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v; want listed on one of %v", step, ip, uid, node, gotListed, ns)
					}
				case listed: // listed without a node: a remembered host may answer
					if !gotListed || (node != "" && !slices.Contains(gone, node)) {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v; want listed, on no node or one of %v", step, ip, uid, node, gotListed, gone)
					}
				case len(gone) > 0 && tie:
					if gotListed && !slices.Contains(gone, node) {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v; want not listed or remembered on one of %v", step, ip, uid, node, gotListed, gone)
					}
				case len(gone) > 0:
					if !gotListed || !slices.Contains(gone, node) {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v; want remembered on one of %v", step, ip, uid, node, gotListed, gone)
					}
				default:
					if gotListed || node != "" {
						t.Fatalf("step %d: hostOf(%v, %s) = %q, %v; want not listed", step, ip, uid, node, gotListed)
					}
				}
			}
		}
	}
	// Everything removed: nothing is left in the index.
	for _, key := range keys {
		c.SetSlice(key, nil)
	}
	if n := len(c.byIP.v4) + len(c.byIP.other) + len(c.byIP.more) + len(c.slices); n != 0 {
		t.Fatalf("%d index entries left after every slice went", n)
	}
	// keep later, every departed host is forgotten, and its note too.
	clk.SetTime(clk.Now().Add(keep))
	c.mu.Lock()
	c.pruneDeparted()
	c.mu.Unlock()
	if len(c.departed) != 0 || len(c.departures) != 0 {
		t.Fatalf("%d departed hosts, %d notes left after keep", len(c.departed), len(c.departures))
	}
}

// TestClaimsSameStateTwice: re-applying a slice (a Service event re-applies
// its slices) reports nothing and counts nothing twice.
func TestClaimsSameStateTwice(t *testing.T) {
	c := NewClaims(clocktesting.NewFakePassiveClock(time.Unix(1e9, 0)), time.Minute)
	ip := netip.MustParseAddr("10.0.0.1")
	s := apiSlice(&k8s.Slice{Family: k8s.IPv4}, "", k8s.Endpoint{Addr: ip, PodUID: "a", Node: "n1", Conds: k8s.CondReady})
	if got := c.SetSlice("ns/s", s); !slices.Equal(got, []netip.Addr{ip}) {
		t.Fatalf("first apply reported %v, want [%v]", got, ip)
	}
	if got := c.SetSlice("ns/s", s); len(got) != 0 {
		t.Fatalf("second apply reported %v, want nothing", got)
	}
	if got := c.SetSlice("ns/s", nil); !slices.Equal(got, []netip.Addr{ip}) {
		t.Fatalf("removal reported %v, want [%v]", got, ip)
	}
	if c.ClaimedByOther(ip, "b") {
		t.Fatalf("%v still claimed after its slice went", ip)
	}
}

// isWatched reports whether gen follows ip.
func (c *Claims) isWatched(ip netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.watched[ip]
	return ok || c.watched == nil
}
