package bpf

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// Features is what the running kernel offers draind. Probe fills it; the
// status command shows it.
type Features struct {
	Kernel  string `json:"kernel"`
	Cgroup2 string `json:"cgroup2,omitempty"`
	// BTF is not needed by the current programs (they use no CO-RE), but
	// it is reported: later hooks (sock iterators) will need it.
	BTF             bool `json:"btf"`
	CgroupSockAddr  bool `json:"cgroup_sock_addr"`
	CgroupSKB       bool `json:"cgroup_skb"`
	HelperSetRetval bool `json:"helper_set_retval"`
	HelperBootTime  bool `json:"helper_ktime_get_boot_ns"`
	HelperPrandom   bool `json:"helper_get_prandom_u32"`
	// BPFLink is needed to pin attachments so steering survives a restart.
	BPFLink bool `json:"bpf_link"`
}

// probe is one required feature: how to test it and how to name its absence.
type probe struct {
	set  func(*Features, bool)
	test func() error
	what string
}

// Probe checks the kernel for everything the datapath needs. The error, if
// any, names every missing feature and wraps ebpf.ErrNotSupported.
func Probe() (Features, error) {
	var f Features
	var uts unix.Utsname
	if err := unix.Uname(&uts); err == nil {
		f.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	var missing []error
	if p, err := Cgroup2Mount(); err != nil {
		missing = append(missing, err)
	} else {
		f.Cgroup2 = p
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err == nil {
		f.BTF = true
	}
	probes := []probe{
		{func(f *Features, v bool) { f.CgroupSockAddr = v }, func() error { return features.HaveProgramType(ebpf.CGroupSockAddr) },
			"cgroup sock_addr programs (connect4/connect6 hooks, Linux 4.17+)"},
		{func(f *Features, v bool) { f.CgroupSKB = v }, func() error { return features.HaveProgramType(ebpf.CGroupSKB) },
			"cgroup_skb programs (SYN observer, Linux 4.10+)"},
		{func(f *Features, v bool) { f.HelperSetRetval = v }, func() error { return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval) },
			"bpf_set_retval in sock_addr programs (ECONNREFUSED for the refuse policy, Linux 5.18+)"},
		{func(f *Features, v bool) { f.HelperBootTime = v }, func() error { return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnKtimeGetBootNs) },
			"bpf_ktime_get_boot_ns (entry expiry, Linux 5.8+)"},
		{func(f *Features, v bool) { f.HelperPrandom = v }, func() error { return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetPrandomU32) },
			"bpf_get_prandom_u32 (backend choice)"},
	}
	for _, p := range probes {
		err := p.test()
		p.set(&f, err == nil)
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrNotSupported):
			missing = append(missing, fmt.Errorf("kernel lacks %s: %w", p.what, err))
		default: // EPERM without CAP_BPF, a locked-down kernel, ...
			missing = append(missing, fmt.Errorf("probing %s: %w", p.what, err))
		}
	}
	// bpf_link for cgroups arrived in 5.7, before bpf_ktime_get_boot_ns
	// (5.8): a kernel that passed the helper probe has it.
	f.BPFLink = f.HelperBootTime
	if len(missing) > 0 {
		return f, fmt.Errorf("probing kernel %s: %w", f.Kernel, errors.Join(missing...))
	}
	return f, nil
}
