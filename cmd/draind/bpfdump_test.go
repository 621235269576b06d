package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

// TestPrivilegedBPFDump writes entries with a datapath, closes it (the
// daemon is down) and reads them back with `draind bpf dump`.
func TestPrivilegedBPFDump(t *testing.T) {
	bed.RequirePrivileged(t)
	if _, err := bpf.Probe(); err != nil {
		t.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	dir, unmount, err := bed.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	defer unmount()
	dp, err := bpf.Load(bpf.Options{PinDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute)
	vip := bpf.EndpointKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: bpf.TCP}
	pod := bpf.EndpointKey{Addr: netip.MustParseAddr("fd00:244::11"), Port: 8080, Proto: bpf.TCP}
	for _, err := range []error{
		dp.SetBackends(bpf.Backends{Service: 3, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.244.0.12:8080")}, Expires: exp}),
		dp.UpsertFrontend(bpf.Frontend{Key: vip, Service: 3, Expires: exp}),
		dp.UpsertDrain(bpf.Drain{Key: pod, Policy: bpf.PolicyRefuse, Expires: exp}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dp.Close()

	run := func(args ...string) string {
		cmd := newRootCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetArgs(append([]string{"bpf", "dump", "--bpffs-dir", dir}, args...))
		if err := cmd.ExecuteContext(context.Background()); err != nil {
			t.Fatalf("draind bpf dump %v: %v", args, err)
		}
		return out.String()
	}
	text := run()
	for _, want := range []string{"10.96.0.10:80/TCP", "10.244.0.12:8080", "[fd00:244::11]:8080/TCP", "refuse"} {
		if !strings.Contains(text, want) {
			t.Errorf("dump lacks %q:\n%s", want, text)
		}
	}
	var j dumpJSON
	if err := json.Unmarshal([]byte(run("-o", "json")), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.Frontends) != 1 || j.Frontends[0].Service != 3 || len(j.Backends) != 1 || len(j.Drains) != 1 || j.Drains[0].Policy != bpf.PolicyRefuse {
		t.Errorf("json dump: %+v", j)
	}
	if d := time.Until(j.Drains[0].Expires); d < 50*time.Second || d > 61*time.Second {
		t.Errorf("expiry read back as %v from now", d)
	}
	// Uninstall: everything goes, and dump then says so.
	rm := newRootCmd()
	rm.SetOut(&bytes.Buffer{})
	rm.SetArgs([]string{"bpf", "remove", "--bpffs-dir", dir})
	if err := rm.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("bpf remove: %v", err)
	}
	if _, err := bpf.OpenPinned(dir); err == nil {
		t.Error("pins still there after bpf remove")
	}
	// Nothing pinned: a clear error, not an empty table.
	empty, unmount2, err := bed.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	defer unmount2()
	cmd := newRootCmd()
	cmd.SetArgs([]string{"bpf", "dump", "--bpffs-dir", empty})
	if err := cmd.ExecuteContext(context.Background()); err == nil || !strings.Contains(err.Error(), "opening pinned map") {
		t.Errorf("dump of an empty bpffs: %v", err)
	}
}
