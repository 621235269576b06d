package bpf

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

func TestCgroup2MountFrom(t *testing.T) {
	for _, tc := range []struct {
		name, info, want string
		err              error
	}{
		{"hybrid", `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`, "/sys/fs/cgroup/unified", nil},
		{"unified with optional fields", `29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate
`, "/sys/fs/cgroup", nil},
		{"escaped space", `41 31 0:38 / /mnt/my\040cgroup rw - cgroup2 none rw
`, "/mnt/my cgroup", nil},
		{"v1 only", `32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
`, "", ErrNoCgroup2},
		{"garbage", "x\n\n- -\n", "", ErrNoCgroup2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "mountinfo")
			if err := os.WriteFile(p, []byte(tc.info), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := cgroup2MountFrom(p)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("got %q, %v; want %q, %v", got, err, tc.want, tc.err)
			}
		})
	}
	if !errors.Is(ErrNoCgroup2, ebpf.ErrNotSupported) {
		t.Error("a missing cgroup2 must read as a missing kernel feature")
	}
}

func TestFindPodsCgroup(t *testing.T) {
	root := t.TempDir()
	if _, err := FindPodsCgroup(root); err == nil {
		t.Fatal("found a pods cgroup in an empty root")
	}
	for _, name := range []string{"kubepods", "kubepods.slice"} {
		if err := os.Mkdir(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The systemd driver's name wins when both exist.
	if got, err := FindPodsCgroup(root); err != nil || got != filepath.Join(root, "kubepods.slice") {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestPolicy(t *testing.T) {
	for _, s := range []string{"rewrite", "refuse", "off"} {
		p, err := ParsePolicy(s)
		if err != nil || p.String() != s {
			t.Errorf("ParsePolicy(%q) = %v, %v", s, p, err)
		}
	}
	for _, s := range []string{"", "Rewrite", "drop", "on"} {
		if _, err := ParsePolicy(s); err == nil {
			t.Errorf("ParsePolicy(%q) accepted", s)
		}
	}
	// Caution order: when policies combine, the highest wins.
	if !(PolicyRewrite < PolicyRefuse && PolicyRefuse < PolicyOff) {
		t.Error("policy order must be rewrite < refuse < off")
	}
}

func TestKeyEncoding(t *testing.T) {
	for _, k := range []EndpointKey{
		{Addr: netip.MustParseAddr("10.1.2.3"), Port: 8080, Proto: TCP},
		{Addr: netip.MustParseAddr("fd00::1"), Port: 53, Proto: UDP},
		{Addr: netip.MustParseAddr("10.1.2.3"), Port: 0, Proto: TCP},
	} {
		enc := encodeKey(k)
		if got := decodeKey(enc); got != k {
			t.Errorf("round trip of %v gave %v", k, got)
		}
	}
	// IPv4 is stored v4-mapped, the same bytes a dual-stack socket's
	// connect6 sees for ::ffff:10.1.2.3.
	v4 := encodeKey(EndpointKey{Addr: netip.MustParseAddr("10.1.2.3"), Port: 1, Proto: TCP})
	mapped := encodeKey(EndpointKey{Addr: netip.MustParseAddr("::ffff:10.1.2.3"), Port: 1, Proto: TCP})
	if v4 != mapped {
		t.Errorf("v4 %x and v4-mapped %x keys differ", v4.Addr, mapped.Addr)
	}
}

func TestKeyCompare(t *testing.T) {
	a := EndpointKey{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Proto: TCP}
	for _, b := range []EndpointKey{
		{Addr: netip.MustParseAddr("10.0.0.2"), Port: 1, Proto: TCP},
		{Addr: netip.MustParseAddr("10.0.0.1"), Port: 81, Proto: TCP},
		{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80, Proto: UDP},
	} {
		if a.Compare(b) >= 0 || b.Compare(a) <= 0 {
			t.Errorf("%v should sort before %v", a, b)
		}
	}
	if a.Compare(a) != 0 {
		t.Error("a key differs from itself")
	}
}

func TestBootClock(t *testing.T) {
	if toBoot(time.Time{}) != 0 {
		t.Error("zero time must encode as 0 (expired)")
	}
	if toBoot(time.Unix(1, 0)) != 0 {
		t.Error("a deadline before boot must encode as 0 (expired)")
	}
	want := time.Now().Add(time.Hour)
	got := fromBoot(toBoot(want))
	if d := got.Sub(want); d > time.Millisecond || d < -time.Millisecond {
		t.Errorf("round trip moved the deadline by %v", d)
	}
	if toBoot(time.Now().Add(-time.Second)) >= uint64(bootNow()) {
		t.Error("a past deadline must be before the boot clock's now")
	}
}

func TestOutcomeNames(t *testing.T) {
	seen := map[string]bool{}
	for o := Outcome(0); int(o) < NumOutcomes; o++ {
		n := o.String()
		if n == "" || seen[n] {
			t.Errorf("outcome %d has an empty or duplicate name %q", o, n)
		}
		seen[n] = true
	}
}

// TestPrivilegedUDPProbeNamesMissingHook: a hook the kernel does not know
// reads as a missing feature, named, wrapping ebpf.ErrNotSupported; the
// datagram hooks this kernel has pass the same probe. (Package-internal:
// test/bed imports this package, so its privilege helper cannot be used.)
func TestPrivilegedUDPProbeNamesMissingHook(t *testing.T) {
	if os.Getenv("PRIVILEGED_TESTS") != "1" || os.Geteuid() != 0 {
		t.Skip("SKIP: root-only test: set PRIVILEGED_TESTS=1 and run as root to run it")
	}
	var f Features
	missing := runProbes(&f, []probe{
		{func(f *Features, v bool) { f.CgroupSendmsg = v }, func() error {
			return errors.Join(haveSockAddrHook(ebpf.AttachCGroupUDP4Sendmsg, false), haveSockAddrHook(ebpf.AttachCGroupUDP6Sendmsg, false))
		}, "sendmsg hooks"},
		{func(f *Features, v bool) { f.CgroupRecvmsg = v }, func() error {
			return haveSockAddrHook(ebpf.AttachType(0x7fff), false)
		}, "the frobnicate hook"},
	})
	if !f.CgroupSendmsg {
		t.Errorf("sendmsg hooks not found on this kernel: %v", missing)
	}
	if f.CgroupRecvmsg || len(missing) != 1 {
		t.Fatalf("an unknown attach type passed the probe: %v %v", f.CgroupRecvmsg, missing)
	}
	if !errors.Is(missing[0], ebpf.ErrNotSupported) || !strings.Contains(missing[0].Error(), "kernel lacks the frobnicate hook") {
		t.Errorf("missing hook reported as %q (ErrNotSupported: %v)", missing[0], errors.Is(missing[0], ebpf.ErrNotSupported))
	}
}
