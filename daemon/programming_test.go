package daemon

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/k8s"
)

// programmingObserved returns the count and sum of the network-programming
// histogram for trigger.
func programmingObserved(t *testing.T, h *harness, trigger string) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	if err := h.d.Metrics.NetworkProgramming.WithLabelValues(trigger).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestNetworkProgrammingLatency: a slice update's trigger-time annotation
// and a new drain Lease's acquire time start the latency, the datapath
// write that applies the change ends it; updates that change nothing, carry
// no annotation or repeat an already counted trigger time observe nothing.
func TestNetworkProgrammingLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		h.addService(webService())
		h.addService(svc("api", []string{"10.96.0.20"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}))
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.putSlice(slice("api-1", "api", v4, httpPorts(9090), onNode(ready("10.0.1.1", "d"), "node-b"), ready("10.0.1.2", "e")))
		h.pass()

		// The controller saw the pod terminate 3 s ago; draind writes now.
		trig := h.clock.Now().Add(-3 * time.Second)
		s := slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b"))
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: trig.Format(time.RFC3339Nano)}
		h.putSlice(s)
		h.clock.Step(250 * time.Millisecond)
		if ops := h.pass(); ops == 0 {
			t.Fatal("the terminating endpoint wrote nothing")
		}
		if n, sum := programmingObserved(t, h, TriggerEndpointSlice); n != 1 || sum != 3.25 {
			t.Errorf("after the slice's change: %d observations, sum %v s; want 1, 3.25 s", n, sum)
		}

		// The same version again (a resync, a relist): nothing new.
		h.putSlice(s)
		h.pass()
		// A change without the annotation (a mirrored or hand-written slice).
		h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("10.0.0.1", "a"), ready("10.0.0.2", "b")))
		h.pass()
		if n, _ := programmingObserved(t, h, TriggerEndpointSlice); n != 1 {
			t.Errorf("%d observations after updates without a new trigger time, want 1", n)
		}

		// An offline drain on node-b: its Lease's acquire time is the start.
		h.lease("d", "default", "pod-d", "node-b", k8s.ReasonOffline, time.Minute, "10.0.1.1")
		h.clock.Step(1500 * time.Millisecond)
		if ops := h.pass(); ops == 0 {
			t.Fatal("the drain Lease wrote nothing")
		}
		if n, sum := programmingObserved(t, h, TriggerLease); n != 1 || sum != 1.5 {
			t.Errorf("after the drain Lease: %d observations, sum %v s; want 1, 1.5 s", n, sum)
		}
		// A trigger time after the write (another machine's clock ahead) is
		// not observed.
		s = slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.2", "b"), ready("10.0.0.1", "a"))
		s.Annotations = map[string]string{corev1.EndpointsLastChangeTriggerTime: h.clock.Now().Add(time.Minute).Format(time.RFC3339Nano)}
		h.putSlice(s)
		h.pass()
		if n, _ := programmingObserved(t, h, TriggerEndpointSlice); n != 1 {
			t.Errorf("%d observations after a trigger time in the future, want 1", n)
		}
	})
}

// TestProgrammingBuckets: kube-proxy's buckets (pkg/proxy/metrics), so
// the two histograms' quantiles compare bucket by bucket.
func TestProgrammingBuckets(t *testing.T) {
	b := programmingBuckets()
	if len(b) != 2+59+12+7 {
		t.Fatalf("%d buckets, want 80", len(b))
	}
	for i, want := range map[int]float64{0: 0.25, 1: 0.5, 2: 1, 60: 59, 61: 60, 72: 115, 73: 120, 79: 300} {
		if b[i] != want {
			t.Errorf("bucket %d = %v, want %v", i, b[i], want)
		}
	}
}
