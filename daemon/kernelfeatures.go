package daemon

import (
	"github.com/draind/draind/bpf"
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterKernelFeatures exports draind_kernel_feature{feature}: 1 where
// the feature is on on this node's kernel, 0 where the kernel lacks what it
// needs (draind status says why).
func (m *Metrics) RegisterKernelFeatures(fs []bpf.KernelFeature) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "kernel_feature",
		Help: "1 if a feature that depends on the kernel is on on this node, 0 if the kernel lacks what it needs (draind status says why)."},
		[]string{"feature"})
	for _, f := range fs {
		v := 0.0
		if f.On {
			v = 1
		}
		g.WithLabelValues(f.Name).Set(v)
	}
	m.Registry.MustRegister(g)
}
