package conntracktest

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/conntrack"
)

var (
	podA   = netip.MustParseAddr("10.244.1.5")
	podB   = netip.MustParseAddr("10.244.2.7")
	vip    = netip.MustParseAddr("10.96.0.10")
	client = netip.MustParseAddr("10.244.3.9")
)

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// svcFlow is a flow client:cport -> vip:vport, DNATed to pod:pport.
func svcFlow(p conntrack.Proto, cport uint16, vport uint16, pod netip.Addr, pport uint16) conntrack.Flow {
	return conntrack.Flow{
		Proto: p,
		Orig:  conntrack.Tuple{Src: ap(client, cport), Dst: ap(vip, vport)},
		Reply: conntrack.Tuple{Src: ap(pod, pport), Dst: ap(client, cport)},
		State: conntrack.TCPEstablished,
	}
}

func TestFakeExpire(t *testing.T) {
	gone := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	dnsA := svcFlow(conntrack.UDP, 1, 53, podA, 5353)
	webA := svcFlow(conntrack.TCP, 2, 80, podA, 8080)
	webB := svcFlow(conntrack.TCP, 3, 80, podB, 8080)
	oldA := svcFlow(conntrack.TCP, 4, 80, podA, 8080)
	oldA.Start = gone.Add(-time.Minute)
	newA := svcFlow(conntrack.TCP, 5, 80, podA, 8080)
	newA.Start = gone.Add(time.Minute)
	table := []conntrack.Flow{dnsA, webA, webB, oldA, newA}

	tests := []struct {
		name      string
		filters   []conntrack.Filter
		want      conntrack.ExpireResult
		remaining []conntrack.Flow
	}{
		{
			name:      "draining pod: udp only, tcp untouched",
			filters:   []conntrack.Filter{{Proto: conntrack.UDP, ReplySrc: ap(podA, 5353)}},
			want:      conntrack.ExpireResult{Deleted: 1, PerFilter: []int{1}},
			remaining: []conntrack.Flow{webA, webB, oldA, newA},
		},
		{
			name:      "gone pod on a reused ip: only flows older than the moment it was seen gone",
			filters:   []conntrack.Filter{{Proto: conntrack.TCP, ReplySrc: ap(podA, 8080), CreatedBefore: gone}},
			want:      conntrack.ExpireResult{Deleted: 2, Kept: 1, PerFilter: []int{2}},
			remaining: []conntrack.Flow{dnsA, webB, newA},
		},
		{
			name: "several endpoints in one call",
			filters: []conntrack.Filter{
				{Proto: conntrack.TCP, ReplySrc: ap(podB, 0)},
				{Proto: conntrack.UDP, ReplySrc: ap(podA, 0)},
				{Proto: conntrack.UDP, ReplySrc: ap(podB, 0)},
			},
			want:      conntrack.ExpireResult{Deleted: 2, PerFilter: []int{1, 1, 0}},
			remaining: []conntrack.Flow{webA, oldA, newA},
		},
		{
			name:      "nothing matches",
			filters:   []conntrack.Filter{{Proto: conntrack.TCP, ReplySrc: ap(client, 0)}},
			want:      conntrack.ExpireResult{PerFilter: []int{0}},
			remaining: table,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := New(table...)
			got, err := f.Expire(context.Background(), tt.filters)
			if err != nil {
				t.Fatal(err)
			}
			if got.Deleted != tt.want.Deleted || got.Kept != tt.want.Kept || !slices.Equal(got.PerFilter, tt.want.PerFilter) {
				t.Errorf("Expire() = %+v, want %+v", got, tt.want)
			}
			if rem := f.Flows(); !slices.Equal(rem, tt.remaining) {
				t.Errorf("remaining flows =\n%v\nwant\n%v", rem, tt.remaining)
			}
			calls := f.ExpireCalls()
			if len(calls) != 1 || !slices.Equal(calls[0], tt.filters) {
				t.Errorf("ExpireCalls() = %v, want one call with %v", calls, tt.filters)
			}
		})
	}
}

func TestFakeRejectsInvalidFiltersLikeNetlink(t *testing.T) {
	f := New(svcFlow(conntrack.TCP, 1, 80, podA, 8080))
	if _, err := f.Expire(context.Background(), []conntrack.Filter{{Proto: conntrack.TCP}}); err == nil {
		t.Fatal("Expire with an empty reply source succeeded; it would match every flow")
	}
	if n := len(f.Flows()); n != 1 {
		t.Fatalf("%d flows left, want 1: an invalid call must not touch the table", n)
	}
}

func TestFakeFailNext(t *testing.T) {
	f := New(svcFlow(conntrack.UDP, 1, 53, podA, 5353))
	f.FailNext(2, nil)
	filters := []conntrack.Filter{{Proto: conntrack.UDP, ReplySrc: ap(podA, 0)}}
	for i := range 2 {
		_, err := f.Expire(context.Background(), filters)
		if !errors.Is(err, ErrInjected) {
			t.Fatalf("call %d: error = %v, want ErrInjected", i, err)
		}
		if len(f.Flows()) != 1 {
			t.Fatalf("call %d: a failed call changed the table", i)
		}
	}
	res, err := f.Expire(context.Background(), filters)
	if err != nil || res.Deleted != 1 {
		t.Fatalf("third call = %+v, %v; want 1 deleted", res, err)
	}
	if n := len(f.ExpireCalls()); n != 3 {
		t.Fatalf("ExpireCalls() has %d calls, want 3 (failed attempts are operations too)", n)
	}

	boom := errors.New("netlink: no buffer space")
	f.FailNext(1, boom)
	if _, err := f.Count(context.Background(), podA); !errors.Is(err, boom) {
		t.Fatalf("Count error = %v, want %v", err, boom)
	}
	if _, err := f.Count(context.Background(), podA); err != nil {
		t.Fatalf("Count after the injected failure: %v", err)
	}
	if got := f.CountCalls(); !slices.Equal(got, []netip.Addr{podA, podA}) {
		t.Fatalf("CountCalls() = %v", got)
	}
}

func TestFakeCount(t *testing.T) {
	tw := svcFlow(conntrack.TCP, 3, 80, podA, 8080)
	tw.State = conntrack.TCPTimeWait
	f := New(
		svcFlow(conntrack.TCP, 1, 80, podA, 8080),
		svcFlow(conntrack.TCP, 2, 80, podA, 9090),
		tw,
		svcFlow(conntrack.UDP, 4, 53, podA, 5353),
		svcFlow(conntrack.TCP, 5, 80, podB, 8080),
	)
	c, err := f.Count(context.Background(), podA)
	if err != nil {
		t.Fatal(err)
	}
	want := conntrack.Counts{UDP: 1}
	want.TCP[conntrack.TCPEstablished] = 2
	want.TCP[conntrack.TCPTimeWait] = 1
	if c != want {
		t.Fatalf("Count() = %+v, want %+v", c, want)
	}
	if c.LiveTCP() != 2 {
		t.Fatalf("LiveTCP() = %d, want 2", c.LiveTCP())
	}
	// An IPv4-mapped address names the same pod.
	if m, _ := f.Count(context.Background(), netip.AddrFrom16(podA.As16())); m != want {
		t.Fatalf("Count(mapped) = %+v, want %+v", m, want)
	}
}

func TestFakeContextAndClose(t *testing.T) {
	f := New(svcFlow(conntrack.UDP, 1, 53, podA, 5353))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Expire(ctx, []conntrack.Filter{{Proto: conntrack.UDP, ReplySrc: ap(podA, 0)}}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Expire with a cancelled context: %v", err)
	}
	if _, err := f.Count(ctx, podA); !errors.Is(err, context.Canceled) {
		t.Fatalf("Count with a cancelled context: %v", err)
	}
	if len(f.Flows()) != 1 {
		t.Fatal("a cancelled call changed the table")
	}
	if err := f.Close(); err != nil || !f.Closed() {
		t.Fatalf("Close() = %v, Closed() = %v", err, f.Closed())
	}
	if _, err := f.Count(context.Background(), podA); err == nil {
		t.Fatal("Count after Close succeeded")
	}
}

func TestFakeConcurrentUse(t *testing.T) {
	var f Fake // the zero value is usable
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				f.AddFlow(svcFlow(conntrack.UDP, uint16(g*1000+i), 53, podA, 5353))
				if _, err := f.Count(context.Background(), podA); err != nil {
					t.Error(err)
				}
				if _, err := f.Expire(context.Background(), []conntrack.Filter{{Proto: conntrack.UDP, ReplySrc: ap(podA, 5353)}}); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(f.Flows()); n != 0 {
		t.Fatalf("%d flows left; every add was followed by an expire", n)
	}
	if n := len(f.ExpireCalls()); n != 400 {
		t.Fatalf("%d expire calls recorded, want 400", n)
	}
}

func TestFakeEndpointFlows(t *testing.T) {
	web := svcFlow(conntrack.TCP, 1, 80, podA, 8080)
	dns := svcFlow(conntrack.UDP, 2, 53, podA, 5353)
	webB := svcFlow(conntrack.TCP, 3, 80, podB, 8080)
	zone5 := svcFlow(conntrack.TCP, 4, 80, podA, 8080)
	zone5.Zone = 5
	f := New(web, dns, webB, zone5)
	got, err := f.EndpointFlows(context.Background(), netip.AddrFrom16(podA.As16()), conntrack.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []conntrack.Flow{web}) {
		t.Fatalf("EndpointFlows(%s, tcp) = %v, want only its zone 0 TCP flow", podA, got)
	}
	f.SetZone(5)
	if got, _ := f.EndpointFlows(context.Background(), podA, conntrack.TCP); !slices.Equal(got, []conntrack.Flow{zone5}) {
		t.Fatalf("in zone 5: EndpointFlows(%s, tcp) = %v, want the zone 5 flow", podA, got)
	}
	if _, err := f.EndpointFlows(context.Background(), netip.Addr{}, conntrack.TCP); err == nil {
		t.Fatal("EndpointFlows without an address succeeded")
	}
}
