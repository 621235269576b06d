package bpf

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// TestExplainLoadNamesCause: a failed load names its cause, told apart by
// the error itself and by whether raising the memlock limit failed.
func TestExplainLoadNamesCause(t *testing.T) {
	liftMemlock() // settle the once before the cases set its outcome
	saved := memlock.err
	defer func() { memlock.err = saved }()
	helper := &ebpf.VerifierError{Cause: unix.EINVAL, Log: []string{"0: (85) call bpf_set_retval#187", "unknown func bpf_set_retval#187"}}
	other := &ebpf.VerifierError{Cause: unix.EACCES, Log: []string{"R1 invalid mem access 'scalar'"}}
	mapPerm := fmt.Errorf("map create: %w", unix.EPERM)
	for _, tc := range []struct {
		name       string
		err        error
		memlockErr error
		want       string
	}{
		{"missing helper", helper, nil, "kernel lacks the helper bpf_set_retval"},
		{"other verifier error", other, nil, "verifier rejected the program"},
		{"memlock", mapPerm, errors.New("setting memlock rlimit: operation not permitted"), "memlock limit too low"},
		{"memlock ENOMEM", fmt.Errorf("map create: %w", unix.ENOMEM), errors.New("raise failed"), "memlock limit too low"},
		{"permission", mapPerm, nil, "permission denied"},
		{"memory cgroup", fmt.Errorf("map create: %w", unix.ENOMEM), nil, "out of memory"},
		{"incompatible pin", fmt.Errorf("x: %w", ebpf.ErrMapIncompatible), nil, "do not match this build"},
	} {
		memlock.err = tc.memlockErr
		got := explainLoad(tc.err, "/sys/fs/bpf/draind/v1")
		if !strings.Contains(got.Error(), tc.want) || !errors.Is(got, errors.Unwrap(tc.err)) && !errors.Is(got, tc.err) {
			t.Errorf("%s: %q, want it to say %q and wrap the cause", tc.name, got, tc.want)
		}
	}
}

func TestKernelFeaturesSayWhyOff(t *testing.T) {
	f := Features{Sockets: true, UserTimeoutFromBPF: false, HelperSetRetval: false}
	fs := kernelFeatures(f)
	want := map[string]bool{FeatureRefuseECONNREFUSED: false, FeatureLiveConnections: true, FeatureEndTCPToGone: false, FeatureEndUDPToGone: true}
	for _, k := range fs {
		if k.On != want[k.Name] || k.On == (k.Reason != "") {
			t.Errorf("%+v: want on=%v and a reason only when off", k, want[k.Name])
		}
	}
	if !strings.Contains(fs[0].Reason, "EPERM") || !strings.Contains(fs[2].Reason, "TCP_USER_TIMEOUT") {
		t.Errorf("reasons do not say what happens instead: %+v", fs)
	}
	off := kernelFeatures(Features{SocketsMissing: "sock_ops programs"})
	for _, k := range off[1:] {
		if k.On || !strings.Contains(k.Reason, "sock_ops programs") {
			t.Errorf("without the socket hooks: %+v", k)
		}
	}
}
