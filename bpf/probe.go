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
	BTF            bool `json:"btf"`
	CgroupSockAddr bool `json:"cgroup_sock_addr"`
	CgroupSKB      bool `json:"cgroup_skb"`
	// HelperSetRetval: bpf_set_retval in the connect and sendmsg hooks
	// (Linux 5.18+). Without it a refusal fails with EPERM, not
	// ECONNREFUSED; nothing else changes.
	HelperSetRetval bool `json:"helper_set_retval"`
	HelperBootTime  bool `json:"helper_ktime_get_boot_ns"`
	HelperPrandom   bool `json:"helper_get_prandom_u32"`
	// BPFLink is needed to pin attachments so steering survives a restart.
	BPFLink bool `json:"bpf_link"`
	// CgroupSendmsg: the sendmsg4/sendmsg6 hooks (per-datagram UDP
	// steering, Linux 4.18+).
	CgroupSendmsg bool `json:"cgroup_sendmsg"`
	// CgroupRecvmsg: the recvmsg4/recvmsg6 hooks.
	CgroupRecvmsg bool `json:"cgroup_recvmsg"`
	// SocketStorage: per-socket storage and socket cookies in sock_addr
	// programs (the reverse translation of steered UDP).
	SocketStorage bool `json:"socket_storage"`

	// Sockets sums up the socket hooks (Options.Sockets); the fields below
	// say what each part needs. Probe reports their absence in SocketsMissing,
	// not as an error: draind runs without them.
	Sockets        bool   `json:"sockets"`
	SocketsMissing string `json:"sockets_missing,omitempty"`
	// SockOps: sock_ops programs with per-socket storage, callback flags
	// and bpf_setsockopt (live connections per pod address; ending TCP
	// sockets to gone pods).
	SockOps bool `json:"sock_ops"`
	// UserTimeoutFromBPF: bpf_setsockopt accepts TCP_USER_TIMEOUT (Linux
	// 5.9+, checked by version: only a live socket could tell).
	UserTimeoutFromBPF bool `json:"tcp_user_timeout_from_bpf"`
	// CgroupEgressRefuse: cgroup_skb egress programs with per-socket
	// storage (ending connected UDP sockets to gone pods: the send fails
	// with EPERM).
	CgroupEgressRefuse bool `json:"cgroup_egress_refuse"`
	// SocketIterators says whether iter/tcp and iter/udp programs (where
	// bpf_sock_destroy is callable) load with draind's capabilities; they
	// need CAP_PERFMON, and walk only draind's own network namespace, so
	// draind never depends on them.
	SocketIterators string `json:"socket_iterators"`

	// KernelFeatures says, per feature that depends on the kernel, whether
	// it is on and why not (docs/kernels.md has the table).
	KernelFeatures []KernelFeature `json:"kernel_features"`
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
	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; the probes
	// create maps too. A failure is kept: explainLoad names it.
	_ = liftMemlock()
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
		{func(f *Features, v bool) { f.HelperBootTime = v }, func() error { return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnKtimeGetBootNs) },
			"bpf_ktime_get_boot_ns (entry expiry, Linux 5.8+)"},
		{func(f *Features, v bool) { f.HelperPrandom = v }, func() error { return features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetPrandomU32) },
			"bpf_get_prandom_u32 (backend choice)"},
		{func(f *Features, v bool) { f.CgroupSendmsg = v }, func() error {
			return errors.Join(haveSockAddrHook(ebpf.AttachCGroupUDP4Sendmsg, false), haveSockAddrHook(ebpf.AttachCGroupUDP6Sendmsg, false))
		}, "cgroup sendmsg4/sendmsg6 hooks (per-datagram UDP steering, Linux 4.18+)"},
		{func(f *Features, v bool) { f.CgroupRecvmsg = v }, func() error {
			return errors.Join(haveSockAddrHook(ebpf.AttachCGroupUDP4Recvmsg, false), haveSockAddrHook(ebpf.AttachCGroupUDP6Recvmsg, false))
		}, "cgroup recvmsg4/recvmsg6 hooks (reply source translation of steered UDP, Linux 5.2+)"},
		{func(f *Features, v bool) { f.SocketStorage = v }, func() error {
			return errors.Join(features.HaveMapType(ebpf.SkStorage), features.HaveMapType(ebpf.LRUHash),
				features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSkStorageGet),
				features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnGetSocketCookie))
		}, "socket storage, LRU maps and socket cookies in sock_addr programs (reverse translation of steered UDP)"},
	}
	missing = append(missing, runProbes(&f, probes)...)
	// bpf_link for cgroups arrived in 5.7, before bpf_ktime_get_boot_ns
	// (5.8): a kernel that passed the helper probe has it.
	f.BPFLink = f.HelperBootTime
	f.HelperSetRetval = haveSetRetval() == nil
	probeSockets(&f)
	f.KernelFeatures = kernelFeatures(f)
	if len(missing) > 0 {
		return f, fmt.Errorf("probing kernel %s: %w", f.Kernel, errors.Join(missing...))
	}
	return f, nil
}

// runProbes runs each probe, records what the kernel has in f and returns
// one error per missing (or unprobeable) feature, naming it.
func runProbes(f *Features, probes []probe) []error {
	var missing []error
	for _, p := range probes {
		err := p.test()
		p.set(f, err == nil)
		switch {
		case err == nil:
		case errors.Is(err, ebpf.ErrNotSupported):
			missing = append(missing, fmt.Errorf("kernel lacks %s: %w", p.what, err))
		default: // EPERM without CAP_BPF, a locked-down kernel, ...
			missing = append(missing, fmt.Errorf("probing %s: %w", p.what, err))
		}
	}
	return missing
}

// haveSockAddrHook loads a minimal sock_addr program for one attach point
// (calling bpf_set_retval if withRetval): the kernel refuses an attach type
// it does not know with EINVAL, and a helper the attach type may not call
// with a verifier error.
func haveSockAddrHook(at ebpf.AttachType, withRetval bool) error {
	var insns asm.Instructions
	if withRetval {
		insns = append(insns,
			asm.Mov.Imm(asm.R1, -int32(unix.ECONNREFUSED)),
			asm.FnSetRetval.Call(),
		)
	}
	insns = append(insns, asm.Mov.Imm(asm.R0, 1), asm.Return())
	p, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Type: ebpf.CGroupSockAddr, AttachType: at, Instructions: insns, License: "Dual BSD/GPL",
	}, ebpf.ProgramOptions{LogDisabled: true})
	if err == nil {
		return p.Close()
	}
	var ve *ebpf.VerifierError
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.E2BIG) || errors.As(err, &ve) {
		return fmt.Errorf("loading a %s program: %w: %w", at, ebpf.ErrNotSupported, err)
	}
	return err
}

// probeSockets fills the socket hooks' features. A missing one is no error:
// the datapath runs without the socket hooks, and status says why.
func probeSockets(f *Features) {
	var missing []error
	sockopsHelpers := []asm.BuiltinFunc{asm.FnSkStorageGet, asm.FnSockOpsCbFlagsSet, asm.FnSetsockopt, asm.FnKtimeGetBootNs}
	err := features.HaveProgramType(ebpf.SockOps)
	for _, fn := range sockopsHelpers {
		if err == nil {
			err = features.HaveProgramHelper(ebpf.SockOps, fn)
		}
	}
	f.SockOps = err == nil
	if err != nil {
		missing = append(missing, fmt.Errorf("sock_ops programs with socket storage, callback flags and bpf_setsockopt (Linux 5.2+): %w", err))
	}
	major, minor := kernelVersion(f.Kernel)
	f.UserTimeoutFromBPF = major > 5 || major == 5 && minor >= 9
	if !f.UserTimeoutFromBPF {
		missing = append(missing, fmt.Errorf("bpf_setsockopt(TCP_USER_TIMEOUT) (Linux 5.9+; kernel %q)", f.Kernel))
	}
	err = features.HaveProgramType(ebpf.CGroupSKB)
	for _, fn := range []asm.BuiltinFunc{asm.FnSkStorageGet, asm.FnSkFullsock} {
		if err == nil {
			err = features.HaveProgramHelper(ebpf.CGroupSKB, fn)
		}
	}
	f.CgroupEgressRefuse = err == nil
	if err != nil {
		missing = append(missing, fmt.Errorf("cgroup_skb programs with socket storage (Linux 5.2+): %w", err))
	}
	// The hooks load without TCP_USER_TIMEOUT: they then count live
	// connections and end UDP sockets, and only ending TCP sockets is off.
	f.Sockets = f.SockOps && f.CgroupEgressRefuse && f.SocketStorage
	if len(missing) > 0 {
		f.SocketsMissing = errors.Join(missing...).Error()
	}
	f.SocketIterators = probeSocketIterator()
}

// kernelVersion parses the start of a release string ("6.18.44-...").
func kernelVersion(release string) (major, minor int) {
	if _, err := fmt.Sscanf(release, "%d.%d", &major, &minor); err != nil {
		return 0, 0 // unparsable: treated as too old for every feature
	}
	return major, minor
}

// probeSocketIterator loads an empty iter/tcp program: what ending sockets
// with bpf_sock_destroy would need.
func probeSocketIterator() string {
	p, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Type: ebpf.Tracing, AttachType: ebpf.AttachTraceIter, AttachTo: "tcp", License: "Dual BSD/GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}, ebpf.ProgramOptions{LogDisabled: true})
	switch {
	case err == nil:
		p.Close()
		return "loadable, but they walk only draind's own network namespace, never the pods'"
	case errors.Is(err, unix.EPERM):
		return "not loadable: they need CAP_PERFMON, which draind does not hold (and would walk only draind's own network namespace)"
	}
	return "not loadable: " + err.Error()
}
