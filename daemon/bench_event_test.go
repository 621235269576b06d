package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/k8s"
)

// BenchmarkSliceEvent is the CPU one slice update costs draind, step by
// step, in the cluster of BenchmarkClusterScale (10,000 Services of 15
// endpoints; one endpoint of a random slice turns terminating, the one
// before it ready again): decoding the watch event's protobuf and slimming
// it (the informer's part), the slice handler, and the pass that writes
// the change. BenchmarkClusterScale's latency tail is bursts of these
// queued behind one another, so their sum bounds it.
func BenchmarkSliceEvent(b *testing.B) {
	const perService = 15
	d := mustNew(b, Config{Node: "node-0", Namespace: "draind-system", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		fake.NewClientset(), newBenchDatapath(), nil)
	sliceStore, serviceStore := d.inf.Slices.GetStore(), d.inf.Services.GetStore()
	for i := range scaleServices {
		svc, _ := k8s.ServiceFrom(benchService(i))
		sl, _ := k8s.SliceFrom(benchSlice(i, perService, -1), d.inf.Nodes)
		if err := serviceStore.Add(svc); err != nil {
			b.Fatal(err)
		}
		if err := sliceStore.Add(sl); err != nil {
			b.Fatal(err)
		}
		d.sliceEvent(nil, sl, time.Time{})
	}
	d.sync() // the first, full pass
	d.firstDone.Store(true)

	// The updates as a watch delivers them, encoded up front.
	const variants = 4096
	wire := make([][]byte, variants)
	term := map[int]int{}
	for n := range wire {
		i := rand.IntN(scaleServices)
		next := rand.IntN(perService)
		if prev, ok := term[i]; ok && prev == next {
			next = (next + 1) % perService
		}
		term[i] = next
		var err error
		if wire[n], err = benchSlice(i, perService, next).Marshal(); err != nil {
			b.Fatal(err)
		}
	}
	var decode, handler, pass time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		t0 := time.Now()
		cur, _, err := k8s.SliceFromProto(wire[n%variants], d.inf.Nodes) // as draind's watch decodes them
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		old, _, _ := sliceStore.Get(cur)
		if err := sliceStore.Update(cur); err != nil {
			b.Fatal(err)
		}
		d.sliceEvent(old, cur, time.Now())
		t2 := time.Now()
		d.sync()
		t3 := time.Now()
		decode += t1.Sub(t0)
		handler += t2.Sub(t1)
		pass += t3.Sub(t2)
	}
	b.StopTimer()
	per := func(t time.Duration) float64 { return float64(t.Microseconds()) / float64(b.N) }
	b.ReportMetric(per(decode), "decode-µs/event")
	b.ReportMetric(per(handler), "handler-µs/event")
	b.ReportMetric(per(pass), "pass-µs/event")
}

// TestBenchSliceFormat: benchSlice formats as fmt would.
func TestBenchSliceFormat(t *testing.T) {
	s := benchSlice(4321, 15, 3)
	e := s.Endpoints[7]
	n := 4321*15 + 7
	for got, want := range map[string]string{
		string(s.UID):               fmt.Sprintf("5e1c0000-0000-0000-0000-%012d", 4321),
		e.Addresses[0]:              fmt.Sprintf("10.%d.%d.%d", 100+n>>16, (n>>8)&255, n&255),
		e.TargetRef.Name:            fmt.Sprintf("svc-4321-7d4b9c8f6-%05d", 7),
		string(e.TargetRef.UID):     fmt.Sprintf("00000000-0000-0000-0000-%012d", n),
		*e.NodeName + "/" + *e.Zone: fmt.Sprintf("node-%d/zone-%d", n%scaleNodes, n%3),
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}
