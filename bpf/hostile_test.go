package bpf_test

import (
	"errors"
	"fmt"
	"net/netip"
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

// TestHostileFullBackendMapLeavesNoOrphans: a backend-set update
// that fails half-way on a full map leaves no entry behind, and the live set
// of the service-port keeps steering.
func TestHostileFullBackendMapLeavesNoOrphans(t *testing.T) {
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
	defer dp.Close()
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
	err = dp.SetBackends(bpf.Backends{Service: 3, Backends: backendSet(capacity-before+50, 8), Expires: exp})
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
