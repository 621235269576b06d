package headline

import (
	"math"
	"testing"
)

// TestHistogramQuantile checks the buckets' quantile against what
// Prometheus' histogram_quantile answers for the same buckets, and the
// exposition parsing against a label filter.
func TestHistogramQuantile(t *testing.T) {
	series := map[string]float64{
		`draind_network_programming_duration_seconds_bucket{trigger="endpointslice",le="0.001"}`: 2,
		`draind_network_programming_duration_seconds_bucket{trigger="endpointslice",le="0.002"}`: 6,
		`draind_network_programming_duration_seconds_bucket{trigger="endpointslice",le="0.004"}`: 10,
		`draind_network_programming_duration_seconds_bucket{trigger="endpointslice",le="+Inf"}`:  10,
		`draind_network_programming_duration_seconds_bucket{trigger="lease",le="0.001"}`:         100,
		`draind_network_programming_duration_seconds_bucket{trigger="lease",le="+Inf"}`:          100,
		`draind_network_programming_duration_seconds_count{trigger="endpointslice"}`:             10,
		`draind_network_programming_duration_seconds_sum{trigger="endpointslice"}`:               0.02,
		`draind_network_programming_duration_seconds_sum{trigger="lease"}`:                       0.05,
	}
	b, total := histogramOf(series, draindProgramming, `trigger="endpointslice"`)
	if b.count() != 10 || len(b) != 4 || total != 0.02 {
		t.Fatalf("buckets %v (sum %v), want the endpointslice trigger's 4 with 10 observations, 0.02 s in all", b, total)
	}
	for _, c := range []struct{ q, want float64 }{
		{0.1, 0.0005},   // rank 1 of 2 in (0, 1ms]
		{0.5, 0.00175},  // rank 5: 3 of 4 into (1ms, 2ms]
		{0.99, 0.00395}, // rank 9.9: 3.9 of 4 into (2ms, 4ms]
	} {
		if got := b.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := (buckets{}).quantile(0.5); !math.IsNaN(got) {
		t.Errorf("quantile of no observations = %v, want NaN", got)
	}
	all, _ := histogramOf(series, draindProgramming)
	all.add(b, -1)
	if all.count() != 100 {
		t.Errorf("all triggers minus endpointslice: %v observations, want the lease's 100", all.count())
	}
}
