package model

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
)

// BenchmarkVanishPending is a pass's look at vanished candidates while n
// of them wait for a gone Lease that may never come: the endpoints a
// rebalance of the EndpointSlice controller or a label change moved while
// ready wait VanishWait (10 s), and every pass of those seconds (one per
// slice update of the cluster) looks at them.
func BenchmarkVanishPending(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run("pending="+strconv.Itoa(n), func(b *testing.B) {
			m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: 2 * time.Minute}, &fuzzState{}, NewClaims(clock.RealClock{}, time.Minute))
			now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			eps := make([]VanishedEndpoint, n)
			for i := range eps {
				eps[i] = VanishedEndpoint{Service: "default/svc-" + strconv.Itoa(i%1000),
					Key: bpf.EndpointKey{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), Port: 8080, Proto: bpf.TCP},
					UID: types.UID("pod-" + strconv.Itoa(i)), At: now}
			}
			m.AddVanished(eps)
			dirty := map[string]time.Time{}
			b.ResetTimer()
			for range b.N {
				now = now.Add(time.Microsecond) // a million passes stay within VanishWait
				m.MarkVanished(dirty, now, now)
			}
			b.StopTimer()
			if len(dirty) != 0 {
				b.Fatalf("%d Services marked, no candidate's pod is gone", len(dirty))
			}
			got := 0
			for _, p := range m.vanish.pending {
				got += len(p)
			}
			if got != n {
				b.Fatalf("%d candidates pending, want %d", got, n)
			}
		})
	}
}

// TestVanishCandidateDropped: a candidate whose pod is not known gone
// within VanishWait is dropped, marking no Service.
func TestVanishCandidateDropped(t *testing.T) {
	m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: 2 * time.Minute}, &fuzzState{}, NewClaims(clock.RealClock{}, time.Minute))
	at := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	m.AddVanished([]VanishedEndpoint{{Service: "default/web", Key: key("10.0.0.1:8080", bpf.TCP), UID: "a", At: at}})
	pending := func() int {
		n := 0
		for _, eps := range m.vanish.pending {
			n += len(eps)
		}
		return n
	}
	dirty := map[string]time.Time{}
	m.MarkVanished(dirty, at, at.Add(VanishWait-time.Second))
	if n := pending(); n != 1 {
		t.Fatalf("%d candidates within VanishWait, want 1", n)
	}
	m.MarkVanished(dirty, at, at.Add(VanishWait))
	if n := pending(); n != 0 {
		t.Errorf("%d candidates kept past VanishWait", n)
	}
	if len(dirty) != 0 {
		t.Errorf("Services marked %v, no candidate's pod is gone", dirty)
	}
}
