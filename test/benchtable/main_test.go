package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = `goos: linux
BenchmarkClusterScale/endpoints=150k-2   1   7698451768 ns/op   0.40 p99-ms   64.0 heap-MB
--- BENCH: BenchmarkClusterScale/endpoints=150k-2
    bench_test.go:351: slowest: an event 3.7s after Ready waited 46ms
BenchmarkClusterScale/endpoints=150k-2   1   7698451768 ns/op   0.30 p99-ms   62.0 heap-MB
BenchmarkClusterScale/endpoints=150k-2   1   7698451768 ns/op   1.90 p99-ms   66.0 heap-MB
BenchmarkConnect/hook_idle-2   1   1780532980 ns/op   205.9 idle-ns/invocation
PASS
`

func TestResults(t *testing.T) {
	r := &results{metrics: map[string][]string{}, values: map[string]map[string][]float64{}}
	if err := r.read(strings.NewReader(sample)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, metric, stat string
		want               float64
	}{
		{"BenchmarkClusterScale/endpoints=150k", "p99-ms", "median", 0.40},
		{"BenchmarkClusterScale/endpoints=150k", "p99-ms", "max", 1.90},
		{"BenchmarkClusterScale/endpoints=150k", "heap-MB", "min", 62},
		{"BenchmarkConnect/hook_idle", "idle-ns/invocation", "median", 205.9},
	} {
		got, err := stat(r.values[c.name][c.metric], c.stat)
		if err != nil || got != c.want {
			t.Errorf("%s %s %s = %v (%v), want %v", c.name, c.metric, c.stat, got, err, c.want)
		}
	}
	if n := len(r.values["BenchmarkClusterScale/endpoints=150k"]["ns/op"]); n != 0 {
		t.Errorf("ns/op kept (%d values): the benchmarks' own metrics say what was timed", n)
	}
	var out bytes.Buffer
	if err := r.print(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "0.3 – 1.90") {
		t.Errorf("the table does not show the range of p99-ms:\n%s", out.String())
	}
}

func TestMedianEven(t *testing.T) {
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 1..4 = %v, want 2.5", got)
	}
}
