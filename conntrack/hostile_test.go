package conntrack

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/draind/draind/test/bed"
)

// TestHostileConntrackZone: a flow with exactly the tuple of a pod's flow,
// but in another conntrack zone, belongs to someone else (another VRF,
// another tenant's zone) and must survive that pod's expiry and stay out of
// its count. The flows are created and checked through ti-mo/conntrack.
func TestHostileConntrackZone(t *testing.T) {
	bed.RequirePrivileged(t)
	ns := testNS(t)
	h0, err := Open(Options{NetNS: ns.Path()})
	if err != nil {
		t.Fatal(err)
	}
	defer h0.Close()
	h5, err := Open(Options{NetNS: ns.Path(), Zone: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer h5.Close()

	pod6 := netip.MustParseAddr("fd01::1")
	podFlows := func(zone uint16) []Flow {
		udp := svcFlow(UDP, 40000, 53, podA, 5353)
		tcp := svcFlow(TCP, 40001, 80, podA, 8080)
		v6 := Flow{Proto: UDP,
			Orig:  Tuple{Src: netip.MustParseAddrPort("[fd00::9]:5000"), Dst: netip.MustParseAddrPort("[fd96::10]:53")},
			Reply: Tuple{Src: netip.AddrPortFrom(pod6, 5353), Dst: netip.MustParseAddrPort("[fd00::9]:5000")}}
		udp.State = 0
		out := []Flow{udp, tcp, v6}
		for i := range out {
			out[i].Zone = zone
		}
		return out
	}
	create := func(zone uint16) {
		t.Helper()
		fls := podFlows(zone)
		if err := createFlows(ns.Path(), len(fls), 600, func(i int) Flow { return fls[i] }); err != nil {
			t.Fatal(err)
		}
	}
	filters := []Filter{
		{Proto: UDP, ReplySrc: ap(podA, 5353)},
		{Proto: TCP, ReplySrc: ap(podA, 8080)},
		{Proto: UDP, ReplySrc: netip.AddrPortFrom(pod6, 5353)},
	}
	// zonesLeft lists, per zone, how many of the pod's flows the table
	// holds, as ti-mo/conntrack reads it.
	zonesLeft := func() map[uint16]int {
		t.Helper()
		left := map[uint16]int{}
		for _, fl := range tableFlows(t, ns.Path()) {
			fl.Start = time.Time{}
			want := podFlows(fl.Zone)
			if !slices.Contains(want, fl) {
				t.Fatalf("unexpected flow in the table: %+v", fl)
			}
			left[fl.Zone]++
		}
		return left
	}
	create(0)
	create(5)

	for _, h := range []*Netlink{h0, h5} {
		c, err := h.Count(context.Background(), podA)
		if err != nil {
			t.Fatal(err)
		}
		if c.UDP != 1 || c.TCP[TCPEstablished] != 1 {
			t.Fatalf("zone %d: Count(%s) = %+v, want one UDP and one TCP flow (its own zone's)", h.zone, podA, c)
		}
		c, err = h.Count(context.Background(), pod6)
		if err != nil {
			t.Fatal(err)
		}
		if c.UDP != 1 {
			t.Fatalf("zone %d: Count(%s) = %+v, want one UDP flow (its own zone's)", h.zone, pod6, c)
		}
		// The kernel itself leaves the other zone out of the dump (CTA_ZONE,
		// Linux 6.8+): the userspace re-check is not the only guard.
		var dumped []uint16
		dump, _, err := h.sockets()
		if err != nil {
			t.Fatal(err)
		}
		err = h.dumpFlows(context.Background(), dump, kernelFilter{replySrc: podA, zone: h.zone}, func(ent *ctEntry) error {
			dumped = append(dumped, ent.Zone)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(dumped) != 2 || dumped[0] != h.zone || dumped[1] != h.zone {
			t.Fatalf("zone %d: the kernel-filtered dump returned flows of zones %v, want the two of zone %d", h.zone, dumped, h.zone)
		}
	}

	// Expiry in zone 0 (the default) leaves the zone 5 twins alone.
	res, err := h0.Expire(context.Background(), filters)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 3 || !slices.Equal(res.PerFilter, []int{1, 1, 1}) {
		t.Fatalf("zone 0 expiry = %+v, want its three flows deleted", res)
	}
	if left := zonesLeft(); left[0] != 0 || left[5] != 3 {
		t.Fatalf("after zone 0 expiry the table holds %v flows per zone, want only zone 5's three", left)
	}
	// The exported rules, applied to the same flows in zone 0, decide the same.
	want, _, err := expireTable(0, filters, append(podFlows(0), podFlows(5)...))
	if err != nil {
		t.Fatal(err)
	}
	if want.Deleted != res.Deleted {
		t.Fatalf("FilterSet.Classify in zone 0 deletes %d, Netlink deleted %d", want.Deleted, res.Deleted)
	}

	// And the other way round: a handle configured for zone 5 leaves
	// zone 0 alone.
	create(0)
	if res, err = h5.Expire(context.Background(), filters); err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 3 {
		t.Fatalf("zone 5 expiry = %+v, want its three flows deleted", res)
	}
	if left := zonesLeft(); left[0] != 3 || left[5] != 0 {
		t.Fatalf("after zone 5 expiry the table holds %v flows per zone, want only zone 0's three", left)
	}
}
