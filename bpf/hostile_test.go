package bpf_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

func backendSet(n int, base byte) []netip.AddrPort {
	out := make([]netip.AddrPort, n)
	for i := range out {
		out[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, base, byte(i >> 8), byte(i)}), 8080)
	}
	return out
}

func backendEntries(t *testing.T, dp *bpf.Datapath) int {
	t.Helper()
	ms, err := dp.MapStats()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == bpf.MapBackends {
			return m.Entries
		}
	}
	t.Fatal("no backends map")
	return 0
}

// loadDatapath loads the programs and maps, pinned in a bpffs of the
// test's own, attached nowhere: for tests of the maps alone.
func loadDatapath(t *testing.T) (*bpf.Datapath, string) {
	t.Helper()
	bed.RequirePrivileged(t)
	if _, err := bpf.Probe(); err != nil {
		t.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	dir, unmount, err := bed.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmount() })
	dp, err := bpf.Load(bpf.Options{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return dp, dir
}

// TestHostileFullBackendMapLeavesNoOrphans: a backend-set update
// that fails half-way on a full map leaves no entry behind, and the live set
// of the service-port keeps steering.
func TestHostileFullBackendMapLeavesNoOrphans(t *testing.T) {
	dp, _ := loadDatapath(t)
	exp := time.Now().Add(time.Minute)
	// Fill the map up to 100 slots short of capacity with two sets.
	capacity := 0
	ms, _ := dp.MapStats()
	for _, m := range ms {
		if m.Name == bpf.MapBackends {
			capacity = m.Capacity
		}
	}
	half := min((capacity-100)/2, bpf.MaxBackends)
	for id := 1; id <= 2; id++ {
		if err := dp.SetBackends(bpf.Backends{Service: bpf.ServicePortID(id), Backends: backendSet(half, byte(id)), Expires: exp}); err != nil {
			t.Fatalf("filling: %v", err)
		}
	}
	small := backendSet(3, 9)
	if err := dp.SetBackends(bpf.Backends{Service: 3, Backends: small, Expires: exp}); err != nil {
		t.Fatal(err)
	}
	before := backendEntries(t, dp)
	// Replacing service-port 3's set with one that cannot fit fails.
	err := dp.SetBackends(bpf.Backends{Service: 3, Backends: backendSet(capacity-before+50, 8), Expires: exp})
	if !errors.Is(err, bpf.ErrMapFull) {
		t.Fatalf("an update beyond the map's capacity: %v, want ErrMapFull", err)
	}
	if after := backendEntries(t, dp); after != before {
		t.Errorf("the failed update left %d orphan entries", after-before)
	}
	d, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range d.Backends {
		if b.Service == 3 && fmt.Sprint(b.Backends) != fmt.Sprint(small) {
			t.Errorf("the live set changed: %v", b.Backends)
		}
	}
	if n, err := dp.Prune(); err != nil || n != 0 {
		t.Errorf("prune found %d orphans (%v)", n, err)
	}
}

// TestHostileDumpDuringUpdates: a dump taken while the daemon replaces and
// deletes backend sets (`draind bpf dump` holds no lock against it) reads
// each service-port's set whole, the old or the new one, and never fails.
func TestHostileDumpDuringUpdates(t *testing.T) {
	dp, dir := loadDatapath(t)
	p, err := bpf.OpenPinned(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	exp := time.Now().Add(time.Minute)
	// Three sets of one size take turns in two generations' slots, so a
	// read that mixed two of them would show.
	sets := [][]netip.AddrPort{backendSet(4, 21), backendSet(4, 22), backendSet(4, 23)}
	other := backendSet(2, 30)
	if err := dp.SetBackends(bpf.Backends{Service: 5, Backends: sets[0], Expires: exp}); err != nil {
		t.Fatal(err)
	}
	// The writer replaces service-port 5's set and deletes and re-creates
	// service-port 6 until the dumps are done.
	var written atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			err := dp.SetBackends(bpf.Backends{Service: 5, Backends: sets[n%len(sets)], Expires: exp.Add(time.Duration(n))})
			if n%2 == 0 {
				err = errors.Join(err, dp.DeleteBackends(6))
			} else {
				err = errors.Join(err, dp.SetBackends(bpf.Backends{Service: 6, Backends: other, Expires: exp}))
			}
			if err != nil {
				t.Errorf("update %d: %v", n, err)
				return
			}
			written.Add(1)
			// Still far more often than a daemon replaces one set.
			time.Sleep(200 * time.Microsecond)
		}
	}()
	const replacements = 2000
	var dumps, failed, withOther int
	deadline := time.Now().Add(time.Minute)
	for ; written.Load() < replacements && time.Now().Before(deadline) && failed < 5; dumps++ {
		var d *bpf.Dump
		if dumps%2 == 0 {
			d, err = p.Dump()
		} else {
			d, err = dp.Dump()
		}
		if err != nil {
			t.Errorf("dump %d: %v", dumps, err)
			failed++
			continue
		}
		var saw5 bool
		for _, b := range d.Backends {
			switch b.Service {
			case 5:
				saw5 = true
				if !slices.ContainsFunc(sets, func(s []netip.AddrPort) bool { return slices.Equal(s, b.Backends) }) {
					t.Errorf("dump %d: service-port 5 reads %v, none of the sets written", dumps, b.Backends)
					failed++
				}
			case 6:
				withOther++
				if !slices.Equal(b.Backends, other) {
					t.Errorf("dump %d: service-port 6 reads %v, want %v", dumps, b.Backends, other)
					failed++
				}
			}
		}
		if !saw5 {
			t.Errorf("dump %d: service-port 5, never deleted, is missing", dumps)
			failed++
		}
	}
	close(stop)
	<-done
	n := written.Load()
	t.Logf("%d dumps beside %d backend-set replacements; service-port 6 present in %d", dumps, n, withOther)
	if failed == 0 && n < replacements {
		t.Errorf("only %d replacements ran beside the dumps in a minute: the case shows little", n)
	}
}
