package bpf_test

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/draind/draind/bpf"
)

// draining reads the flag the programs see.
func draining(t *testing.T, dp *bpf.Datapath) bool {
	t.Helper()
	on, err := dp.Draining()
	must(t, err)
	return on
}

// forceFlag writes draind_node behind the datapath's back: what a crash
// between the last delete and the flag's clearing, or maps pinned by a
// draind that predates the flag, leave behind.
func (f *fixture) forceFlag(on bool) {
	f.t.Helper()
	paths, err := filepath.Glob(filepath.Join(f.pinDir, "v*", string(bpf.MapNode)))
	if err != nil || len(paths) != 1 {
		f.t.Fatalf("finding the pinned flag: %v %v", paths, err)
	}
	m, err := ebpf.LoadPinnedMap(paths[0], nil)
	must(f.t, err)
	defer m.Close()
	v := make([]byte, m.ValueSize())
	if on {
		v[0] = 1 // little-endian draining = 1
	}
	must(f.t, m.Put(uint32(0), v))
}

// TestPrivilegedIdleFlag checks the "something drains on this node" flag the
// hooks read first: raised before the first entry, lowered after the last,
// recomputed when maps are adopted, and really the programs' gate.
func TestPrivilegedIdleFlag(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		svc := bpf.ServicePortID(1)
		exp := time.Now().Add(time.Minute)
		if draining(t, f.dp) {
			t.Fatal("fresh maps: the flag says draining")
		}

		must(t, f.dp.UpsertDrain(bpf.Drain{Key: f.podKey(0, v6), Service: svc, Policy: bpf.PolicyRefuse, Expires: exp}))
		if !draining(t, f.dp) {
			t.Fatal("a drain entry exists, the flag says idle")
		}
		if r := f.dial(f.client, pod, 5); r.Fails[refusal(t)] != 5 {
			t.Fatalf("refuse drain: %v %v", r.By, r.Fails)
		}

		// A frontend keeps the flag up after the last drain goes.
		must(t, f.dp.SetBackends(bpf.Backends{Service: svc, Backends: f.backends(v6, 1, 2), Expires: exp}))
		must(t, f.dp.UpsertFrontend(bpf.Frontend{Key: f.vipKey(v6), Service: svc, Expires: exp}))
		must(t, f.dp.DeleteDrain(f.podKey(0, v6)))
		if !draining(t, f.dp) {
			t.Fatal("a frontend entry exists, the flag says idle")
		}
		if r := f.dial(f.client, f.vip[v6], 30); r.OK != 30 || r.By["srv1"] != 0 {
			t.Fatalf("steered frontend: %v %v", r.By, r.Fails)
		}
		// Deleting what is not there changes nothing.
		must(t, f.dp.DeleteDrain(f.podKey(2, v6)))
		if !draining(t, f.dp) {
			t.Fatal("deleting an absent drain lowered the flag")
		}

		must(t, f.dp.DeleteFrontend(f.vipKey(v6)))
		if draining(t, f.dp) {
			t.Fatal("no entry left, the flag still says draining")
		}
		before := counter(t, f.dp, bpf.OutSteeredClusterIP, v6)
		if r := f.dial(f.client, f.vip[v6], 60); r.OK != 60 || r.By["srv1"] == 0 {
			t.Errorf("idle: want kube-proxy spreading incl. srv1, got %v %v", r.By, r.Fails)
		}
		if after := counter(t, f.dp, bpf.OutSteeredClusterIP, v6); after != before {
			t.Errorf("idle: steered_clusterip moved from %d to %d", before, after)
		}

		// The flag gates the programs: lowered behind the datapath's back
		// while a refuse entry exists, the entry is not seen (the control
		// that shows the check is real). A restart's adoption raises it.
		must(t, f.dp.UpsertDrain(bpf.Drain{Key: f.podKey(0, v6), Service: svc, Policy: bpf.PolicyRefuse, Expires: exp}))
		must(t, f.dp.Close())
		f.forceFlag(false)
		if r := f.dial(f.client, pod, 5); r.By["srv1"] != 5 {
			t.Fatalf("flag forced idle: want the entry unseen (all on srv1), got %v %v", r.By, r.Fails)
		}
		f.load()
		if !draining(t, f.dp) {
			t.Fatal("adopted maps hold a drain, the flag says idle")
		}
		if r := f.dial(f.client, pod, 5); r.Fails[refusal(t)] != 5 {
			t.Fatalf("after adoption: want refused, got %v %v", r.By, r.Fails)
		}

		// A flag left up over empty maps (a crash after the last delete) is
		// lowered on adoption.
		must(t, f.dp.DeleteDrain(f.podKey(0, v6)))
		must(t, f.dp.Close())
		f.forceFlag(true)
		f.load()
		if draining(t, f.dp) {
			t.Fatal("adopted empty maps, the flag still says draining")
		}
	})
}

// TestPrivilegedIdleFlagConcurrent churns entries from many goroutines while
// one refuse entry stays: the flag must never drop, and every connect() to
// the steady entry is refused throughout.
func TestPrivilegedIdleFlagConcurrent(t *testing.T) {
	f := newFixture(t)
	exp := time.Now().Add(time.Minute)
	must(t, f.dp.UpsertDrain(bpf.Drain{Key: f.podKey(0, false), Policy: bpf.PolicyRefuse, Expires: exp}))

	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := bpf.EndpointKey{Addr: netip.AddrFrom4([4]byte{10, 200, byte(g), byte(i % 200)}), Port: 80, Proto: bpf.TCP}
				var err error
				if g%2 == 0 {
					err = f.dp.UpsertDrain(bpf.Drain{Key: k, Policy: bpf.PolicyOff, Expires: exp})
					if err == nil {
						err = f.dp.DeleteDrain(k)
					}
				} else {
					err = f.dp.UpsertFrontend(bpf.Frontend{Key: k, Service: 9, Expires: exp})
					if err == nil {
						err = f.dp.DeleteFrontend(k)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("churn %d/%d: %w", g, i, err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			on, err := f.dp.Draining()
			if err != nil || !on {
				errs <- fmt.Errorf("flag read %v (%v) while a drain entry exists", on, err)
				return
			}
		}
	}()
	deadline := time.Now().Add(time.Second)
	dials := 0
	for time.Now().Before(deadline) {
		r := f.dial(f.client, netip.AddrPortFrom(f.pods[0].IP4, podPort), 20)
		dials += 20
		if r.Fails[refusal(t)] != 20 {
			t.Errorf("during churn: want 20 refused, got %v %v", r.By, r.Fails)
			break
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if !draining(t, f.dp) {
		t.Error("after the churn the steady entry exists but the flag says idle")
	}
	must(t, f.dp.DeleteDrain(f.podKey(0, false)))
	if draining(t, f.dp) {
		t.Error("after the last delete the flag still says draining")
	}
	st, err := f.dp.MapStats()
	must(t, err)
	for _, s := range st {
		if (s.Name == bpf.MapDrains || s.Name == bpf.MapFrontends) && s.Entries != 0 {
			t.Errorf("%s holds %d entries after the churn", s.Name, s.Entries)
		}
	}
	t.Logf("%d connect()s refused during the churn", dials)
}
