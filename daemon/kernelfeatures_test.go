package daemon

import (
	"strings"
	"testing"

	"github.com/draind/draind/bpf"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestKernelFeatureMetric(t *testing.T) {
	m := NewMetrics("test", nil, nil, nil)
	m.RegisterKernelFeatures([]bpf.KernelFeature{
		{Name: bpf.FeatureRefuseECONNREFUSED, Reason: "no bpf_set_retval"},
		{Name: bpf.FeatureLiveConnections, On: true},
	})
	want := `
# HELP draind_kernel_feature 1 if a feature that depends on the kernel is on on this node, 0 if the kernel lacks what it needs (draind status says why).
# TYPE draind_kernel_feature gauge
draind_kernel_feature{feature="live_connections"} 1
draind_kernel_feature{feature="refuse_econnrefused"} 0
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "draind_kernel_feature"); err != nil {
		t.Fatal(err)
	}
}
