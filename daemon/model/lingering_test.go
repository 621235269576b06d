package model

import (
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
)

// TestLingerQueue sets, replaces, clears (as a pod's Lease deletion and a
// new owner of the IP do) and expires lingering records at random, and
// checks the model against a reference after each step: exactly the
// records whose end has not come linger, every index agrees, a pod's
// entries are found by pod, and the next deadline is the earliest end of
// a record still lingering (one that ended early wakes no pass).
func TestLingerQueue(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: time.Minute}, &fuzzState{}, NewClaims(clock.RealClock{}, time.Minute))
	now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	uids := []types.UID{"pod-a", "pod-b", "pod-c", "pod-d"}
	want := map[bpf.EndpointKey]time.Time{} // the reference: key -> end
	wantUID := map[bpf.EndpointKey]types.UID{}
	for step := range 5000 {
		k := bpf.EndpointKey{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(40))}), Port: uint16(8080 + rng.IntN(2)), Proto: bpf.TCP}
		switch r := rng.IntN(10); {
		case r < 6: // departs (again): ends between now and a minute later, in any order
			uid := uids[rng.IntN(len(uids))]
			end := now.Add(time.Duration(rng.IntN(60000)) * time.Millisecond)
			m.setLinger(k, &lingerRecord{c: contribution{kind: fromLinger, uid: uid, policy: bpf.PolicyRefuse}, until: end})
			want[k], wantUID[k] = end, uid
		case r < 7: // another pod claims the IP
			m.clearLinger(k)
			delete(want, k)
		case r < 8: // a pod's drain Lease was deleted
			uid := uids[rng.IntN(len(uids))]
			m.EndLingersOf(uid)
			for k, u := range wantUID {
				if u == uid {
					delete(want, k)
				}
			}
		default:
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Millisecond)
			m.ExpireLingering(now)
			for k, end := range want {
				if !now.Before(end) {
					delete(want, k)
				}
			}
		}
		if len(m.lingering) != len(want) {
			t.Fatalf("step %d: %d lingering, want %d", step, len(m.lingering), len(want))
		}
		var first time.Time
		for k, end := range want {
			if l := m.lingering[k]; l == nil || !l.until.Equal(end) {
				t.Fatalf("step %d: %v lingers %v, want until %v", step, k, l, end)
			}
			if !m.lingeringOf(wantUID[k]) {
				t.Fatalf("step %d: pod %s lingers at %v, lingeringOf says not", step, wantUID[k], k)
			}
			if first.IsZero() || end.Before(first) {
				first = end
			}
		}
		if got := m.firstLingerEnd(); !got.Equal(first) {
			t.Fatalf("step %d: first linger end %v, want %v", step, got, first)
		}
		if got := m.NextDeadline(); !got.Equal(first) {
			t.Fatalf("step %d: next deadline %v, want %v", step, got, first)
		}
		checkContributionIndex(t, m)
		if stale := len(m.lingerQueue) - len(m.lingering); stale > len(m.lingering)+64 {
			t.Fatalf("step %d: the queue holds %d records that ended early, %d live", step, stale, len(m.lingering))
		}
	}
	// A listing that flaps departs and returns its endpoint again and
	// again within a linger: the records that ended early do not pile up.
	k := bpf.EndpointKey{Addr: netip.MustParseAddr("10.0.1.1"), Port: 8080, Proto: bpf.TCP}
	for range 1000 {
		m.setLinger(k, &lingerRecord{c: contribution{kind: fromLinger, uid: "pod-flap", policy: bpf.PolicyRefuse}, until: now.Add(time.Minute)})
		m.clearLinger(k)
	}
	if stale := len(m.lingerQueue) - len(m.lingering); stale > len(m.lingering)+64 {
		t.Fatalf("a flapping listing left %d records that ended early in the queue, %d live", stale, len(m.lingering))
	}
	checkContributionIndex(t, m)
	// A minute later every record ended: none is left, in the queue
	// either (those that ended early included).
	m.ExpireLingering(now.Add(time.Minute))
	if len(m.lingering) != 0 || len(m.lingerQueue) != 0 || m.firstLingerEnd() != (time.Time{}) {
		t.Fatalf("%d lingering, %d queued a minute after the last departure", len(m.lingering), len(m.lingerQueue))
	}
	checkContributionIndex(t, m)
}

// BenchmarkLingerSteadyState: a long rollout's steady state, where endpoints
// depart and their lingers end at the same rate, with n lingering (a
// thousand departures a second for --linger's two minutes: 120,000). One
// op is a departure and the pass after it (expireLingering,
// nextDeadline); its cost must not grow with n.
func BenchmarkLingerSteadyState(b *testing.B) {
	for _, n := range []int{1000, 10000, 120000} {
		b.Run("lingering="+strconv.Itoa(n), func(b *testing.B) {
			m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: 2 * time.Minute}, &fuzzState{}, NewClaims(clock.RealClock{}, time.Minute))
			now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			step := 2 * time.Minute / time.Duration(n)
			depart := func(i int) {
				k := bpf.EndpointKey{Addr: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), Port: 8080, Proto: bpf.TCP}
				uid := types.UID("pod-" + strconv.Itoa(i))
				// Of 10,000 service-ports, as in BenchmarkClusterScale.
				c := contribution{kind: fromLinger, uid: uid, servicePort: bpf.ServicePortID(1 + i%10000), policy: bpf.PolicyRefuse}
				m.setLinger(k, &lingerRecord{c: c, until: now.Add(2 * time.Minute)})
				now = now.Add(step)
				m.ExpireLingering(now)
				m.NextDeadline()
			}
			for i := range n {
				depart(i)
			}
			b.ResetTimer()
			for i := range b.N {
				depart(n + i%(1<<23))
			}
			b.StopTimer()
			if len(m.lingering) < n-1 || len(m.lingering) > n+1 {
				b.Fatalf("%d lingering, want %d", len(m.lingering), n)
			}
		})
	}
}
