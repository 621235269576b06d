package bpf_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/draind/draind/bpf"
)

var probed struct {
	once sync.Once
	f    bpf.Features
}

func features() bpf.Features {
	probed.once.Do(func() { probed.f, _ = bpf.Probe() })
	return probed.f
}

// refusal is how a refused connect or datagram fails on this kernel (the
// class test/bed counts it as): ECONNREFUSED where the hooks can set it,
// EPERM on kernels without bpf_set_retval (before 5.18, docs/kernels.md).
func refusal(t *testing.T) string {
	t.Helper()
	if features().HelperSetRetval {
		return "refused"
	}
	t.Logf("kernel %s lacks bpf_set_retval: a refusal fails with EPERM", features().Kernel)
	return "eperm"
}

func kernelAtLeast(release string, major, minor int) bool {
	var a, b int
	fmt.Sscanf(release, "%d.%d", &a, &b)
	return a > major || a == major && b >= minor
}

// checkKernelFeatures checks the per-feature table against what the probe
// found: every feature listed once, on where its parts are there, and a
// reason for each one that is off.
func checkKernelFeatures(t *testing.T, f bpf.Features) {
	t.Helper()
	want := map[string]bool{
		bpf.FeatureRefuseECONNREFUSED: f.HelperSetRetval,
		bpf.FeatureLiveConnections:    f.Sockets,
		bpf.FeatureEndTCPToGone:       f.Sockets && f.UserTimeoutFromBPF,
		bpf.FeatureEndUDPToGone:       f.Sockets,
	}
	var names []string
	for _, k := range f.KernelFeatures {
		names = append(names, k.Name)
		if k.On != want[k.Name] {
			t.Errorf("kernel %s: %s on=%v, want %v", f.Kernel, k.Name, k.On, want[k.Name])
		}
		if !k.On && k.Reason == "" || k.On && k.Reason != "" {
			t.Errorf("kernel %s: %s on=%v with reason %q", f.Kernel, k.Name, k.On, k.Reason)
		}
		t.Logf("kernel feature %s on=%v %s", k.Name, k.On, k.Reason)
	}
	// In the order status shows them.
	wantNames := []string{bpf.FeatureRefuseECONNREFUSED, bpf.FeatureLiveConnections, bpf.FeatureEndTCPToGone, bpf.FeatureEndUDPToGone}
	if !slices.Equal(names, wantNames) {
		t.Errorf("kernel features %v, want %v", names, wantNames)
	}
}
