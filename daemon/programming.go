package daemon

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Network-programming latency, as Kubernetes measures a data plane: from
// when the change happened in the cluster to when this node's datapath
// applied it. kube-proxy exports the same measure as
// kubeproxy_network_programming_duration_seconds; draind uses its buckets,
// so the two histograms compare bucket by bucket.
//
// The start is a time another machine wrote: the EndpointSlice
// controller's endpoints.kubernetes.io/last-change-trigger-time (when the
// pod's deletion or readiness change that the slice carries happened), or
// a drain Lease's acquire time (when the node hosting the pod started an
// offline drain). Clock skew between that machine and this node is part
// of the figure, as it is of kube-proxy's; a start after the write (skew)
// is not observed.

// Values of the trigger label.
const (
	TriggerEndpointSlice = "endpointslice"
	TriggerLease         = "lease"
)

// programming is one change a pass wrote: when it happened, and what
// said so.
type programming struct {
	at      time.Time
	trigger string
}

// programmingBuckets are kube-proxy's: 0.25 s and 0.5 s, every second to
// 59 s, every 5 s to 115 s, every 30 s from 2 to 5 minutes.
func programmingBuckets() []float64 {
	b := []float64{0.25, 0.5}
	for s := 1.0; s <= 59; s++ {
		b = append(b, s)
	}
	for s := 60.0; s <= 115; s += 5 {
		b = append(b, s)
	}
	for s := 120.0; s <= 300; s += 30 {
		b = append(b, s)
	}
	return b
}

func newNetworkProgramming() *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "network_programming_duration_seconds",
		Help: "Network-programming latency: from a change's trigger time (an EndpointSlice's " +
			"last-change-trigger-time annotation, or a new drain Lease's acquire time) to the datapath " +
			"write that applied it, by trigger. Same buckets as kube-proxy's kubeproxy_network_programming_duration_seconds.",
		Buckets: programmingBuckets()}, []string{"trigger"})
	for _, t := range []string{TriggerEndpointSlice, TriggerLease} {
		h.WithLabelValues(t)
	}
	return h
}

// observeProgramming records the changes a datapath write at done applied.
func (m *Metrics) observeProgramming(done time.Time, ps []programming) {
	for _, p := range ps {
		if lat := done.Sub(p.at); lat >= 0 {
			m.NetworkProgramming.WithLabelValues(p.trigger).Observe(lat.Seconds())
		}
	}
}
