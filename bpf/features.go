package bpf

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

// The features that depend on the kernel, each switched off on its own
// where the kernel lacks what it needs (docs/kernels.md).
const (
	// FeatureRefuseECONNREFUSED: a refused connect or datagram fails with
	// ECONNREFUSED (bpf_set_retval, Linux 5.18+); below, with EPERM.
	FeatureRefuseECONNREFUSED = "refuse_econnrefused"
	// FeatureLiveConnections: live connections per pod address counted by
	// the sock_ops hook (Linux 5.3+ here: socket storage in sock_ops).
	FeatureLiveConnections = "live_connections"
	// FeatureEndTCPToGone: client TCP sockets to gone pods end at their
	// next retransmission (bpf_setsockopt TCP_USER_TIMEOUT, Linux 5.9+).
	FeatureEndTCPToGone = "end_tcp_to_gone"
	// FeatureEndUDPToGone: sends of connected UDP sockets to gone pods
	// fail (cgroup_skb egress with socket storage).
	FeatureEndUDPToGone = "end_udp_to_gone"
)

// KernelFeature is one feature's state on this kernel.
type KernelFeature struct {
	Name string `json:"name"`
	On   bool   `json:"on"`
	// Reason says, for a feature that is off, what the kernel lacks and
	// what draind does instead.
	Reason string `json:"reason,omitempty"`
}

func kernelFeatures(f Features) []KernelFeature {
	hooks := "the socket hooks do not load: " + f.SocketsMissing
	out := []KernelFeature{
		{FeatureRefuseECONNREFUSED, f.HelperSetRetval,
			"no bpf_set_retval in sock_addr programs (Linux 5.18+): refused connects and datagrams fail with EPERM"},
		{FeatureLiveConnections, f.Sockets, hooks + "; live connections come from conntrack only"},
		{FeatureEndTCPToGone, f.Sockets && f.UserTimeoutFromBPF, hooks},
		{FeatureEndUDPToGone, f.Sockets, hooks},
	}
	if f.Sockets && !f.UserTimeoutFromBPF {
		out[2].Reason = "no TCP_USER_TIMEOUT in bpf_setsockopt (Linux 5.9+): TCP sockets to gone pods end by their own timeouts"
	}
	for i := range out {
		if out[i].On {
			out[i].Reason = ""
		}
	}
	return out
}

var setRetval struct {
	once sync.Once
	err  error
}

// haveSetRetval says whether the connect and sendmsg hooks may call
// bpf_set_retval (Load switches the call off where they may not).
func haveSetRetval() error {
	setRetval.once.Do(func() {
		_ = liftMemlock() // kept: explainLoad names it if a load fails
		setRetval.err = errors.Join(features.HaveProgramHelper(ebpf.CGroupSockAddr, asm.FnSetRetval),
			haveSockAddrHook(ebpf.AttachCGroupUDP4Sendmsg, true), haveSockAddrHook(ebpf.AttachCGroupUDP6Sendmsg, true))
	})
	return setRetval.err
}

// setRetvalConst tells a connect or sendmsg object whether it may call
// bpf_set_retval (it may not where the kernel lacks it: the verifier then
// never sees the call). It lifts the memlock limit first, as every load
// needs on kernels before 5.11.
func setRetvalConst(spec *ebpf.CollectionSpec) error {
	_ = liftMemlock() // kept: explainLoad names it if a load fails
	v := uint32(0)
	if haveSetRetval() == nil {
		v = 1
	}
	if err := spec.Variables["draind_have_set_retval"].Set(v); err != nil {
		return fmt.Errorf("setting draind_have_set_retval: %w", err)
	}
	return nil
}

var memlock struct {
	once sync.Once
	err  error
}

// liftMemlock raises RLIMIT_MEMLOCK where the kernel charges BPF memory to
// it (before Linux 5.11; later kernels charge the memory cgroup and nothing
// is changed). Raising it fails where the hard limit is lower and draind
// lacks CAP_SYS_RESOURCE; the error is kept for explainLoad.
func liftMemlock() error {
	memlock.once.Do(func() { memlock.err = rlimit.RemoveMemlock() })
	return memlock.err
}

var unknownFunc = regexp.MustCompile(`unknown func ([a-z_0-9]+)#?[0-9]*`)

// explainLoad names the cause of a failed load: pinned maps of another
// layout, the memlock limit, a helper the kernel lacks, a capability
// draind lacks, or another verifier rejection.
func explainLoad(err error, mapDir string) error {
	var ve *ebpf.VerifierError
	switch {
	case errors.As(err, &ve):
		if m := unknownFunc.FindStringSubmatch(strings.Join(ve.Log, "\n")); m != nil {
			return fmt.Errorf("kernel lacks the helper %s (kernel too old for this program): %w", m[1], err)
		}
		return fmt.Errorf("verifier rejected the program: %w", err)
	case errors.Is(err, ebpf.ErrMapIncompatible):
		return fmt.Errorf("pinned maps in %s do not match this build (remove them to start afresh): %w", mapDir, err)
	case (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOMEM)) && liftMemlock() != nil:
		return fmt.Errorf("memlock limit too low: this kernel charges BPF maps to RLIMIT_MEMLOCK and raising it failed (%v); "+
			"run draind with an unlimited memlock limit (LimitMEMLOCK=infinity in the container runtime's unit): %w", liftMemlock(), err)
	case errors.Is(err, unix.EPERM):
		if missing := missingCaps(); missing != "" {
			return fmt.Errorf("permission denied: draind needs CAP_BPF and CAP_NET_ADMIN, and lacks %s: %w", missing, err)
		}
		return fmt.Errorf("permission denied though draind holds CAP_BPF and CAP_NET_ADMIN (a security module, or kernel.unprivileged_bpf_disabled with a kernel before 5.8?): %w", err)
	case errors.Is(err, unix.ENOMEM):
		return fmt.Errorf("out of memory creating maps (the memory cgroup's limit?): %w", err)
	}
	return err
}

// missingCaps names CAP_BPF and CAP_NET_ADMIN where the effective set lacks
// them (CAP_SYS_ADMIN stands for both).
func missingCaps() string {
	eff, ok := effectiveCaps()
	if !ok || eff&(1<<unix.CAP_SYS_ADMIN) != 0 {
		return ""
	}
	var out []string
	if eff&(1<<unix.CAP_BPF) == 0 {
		out = append(out, "CAP_BPF")
	}
	if eff&(1<<unix.CAP_NET_ADMIN) == 0 {
		out = append(out, "CAP_NET_ADMIN")
	}
	return strings.Join(out, " and ")
}

func effectiveCaps() (uint64, bool) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return n, err == nil
		}
	}
	return 0, false
}
