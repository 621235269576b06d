package conntrack

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestFakeExpire(t *testing.T) {
	gone := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	dnsA := svcFlow(UDP, 1, 53, podA, 5353)
	webA := svcFlow(TCP, 2, 80, podA, 8080)
	webB := svcFlow(TCP, 3, 80, podB, 8080)
	oldA := svcFlow(TCP, 4, 80, podA, 8080)
	oldA.Start = gone.Add(-time.Minute)
	newA := svcFlow(TCP, 5, 80, podA, 8080)
	newA.Start = gone.Add(time.Minute)
	table := []Flow{dnsA, webA, webB, oldA, newA}

	tests := []struct {
		name      string
		filters   []Filter
		want      ExpireResult
		remaining []Flow
	}{
		{
			name:      "draining pod: udp only, tcp untouched",
			filters:   []Filter{{Proto: UDP, ReplySrc: ap(podA, 5353)}},
			want:      ExpireResult{Deleted: 1, PerFilter: []int{1}},
			remaining: []Flow{webA, webB, oldA, newA},
		},
		{
			name:      "gone pod on a reused ip: only flows older than the moment it was seen gone",
			filters:   []Filter{{Proto: TCP, ReplySrc: ap(podA, 8080), CreatedBefore: gone}},
			want:      ExpireResult{Deleted: 2, Kept: 1, PerFilter: []int{2}},
			remaining: []Flow{dnsA, webB, newA},
		},
		{
			name: "several endpoints in one call",
			filters: []Filter{
				{Proto: TCP, ReplySrc: ap(podB, 0)},
				{Proto: UDP, ReplySrc: ap(podA, 0)},
				{Proto: UDP, ReplySrc: ap(podB, 0)},
			},
			want:      ExpireResult{Deleted: 2, PerFilter: []int{1, 1, 0}},
			remaining: []Flow{webA, oldA, newA},
		},
		{
			name:      "nothing matches",
			filters:   []Filter{{Proto: TCP, ReplySrc: ap(client, 0)}},
			want:      ExpireResult{PerFilter: []int{0}},
			remaining: table,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := NewFake(table...)
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
	f := NewFake(svcFlow(TCP, 1, 80, podA, 8080))
	if _, err := f.Expire(context.Background(), []Filter{{Proto: TCP}}); err == nil {
		t.Fatal("Expire with an empty reply source succeeded; it would match every flow")
	}
	if n := len(f.Flows()); n != 1 {
		t.Fatalf("%d flows left, want 1: an invalid call must not touch the table", n)
	}
}

func TestFakeFailNext(t *testing.T) {
	f := NewFake(svcFlow(UDP, 1, 53, podA, 5353))
	f.FailNext(2, nil)
	filters := []Filter{{Proto: UDP, ReplySrc: ap(podA, 0)}}
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
	tw := svcFlow(TCP, 3, 80, podA, 8080)
	tw.State = TCPTimeWait
	f := NewFake(
		svcFlow(TCP, 1, 80, podA, 8080),
		svcFlow(TCP, 2, 80, podA, 9090),
		tw,
		svcFlow(UDP, 4, 53, podA, 5353),
		svcFlow(TCP, 5, 80, podB, 8080),
	)
	c, err := f.Count(context.Background(), podA)
	if err != nil {
		t.Fatal(err)
	}
	want := Counts{UDP: 1}
	want.TCP[TCPEstablished] = 2
	want.TCP[TCPTimeWait] = 1
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
	f := NewFake(svcFlow(UDP, 1, 53, podA, 5353))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := f.Expire(ctx, []Filter{{Proto: UDP, ReplySrc: ap(podA, 0)}}); !errors.Is(err, context.Canceled) {
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
				f.AddFlow(svcFlow(UDP, uint16(g*1000+i), 53, podA, 5353))
				if _, err := f.Count(context.Background(), podA); err != nil {
					t.Error(err)
				}
				if _, err := f.Expire(context.Background(), []Filter{{Proto: UDP, ReplySrc: ap(podA, 5353)}}); err != nil {
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
