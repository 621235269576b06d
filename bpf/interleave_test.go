package bpf_test

import (
	"math"
	"slices"
	"testing"
	"time"
)

// The benchmarks' shared harness for comparing paths whose difference is
// far below the machine's noise (a few hundred ns of hooks in a round trip
// of tens of µs, on a shared 2-core machine whose round trips drift by tens
// of per cent within seconds).
//
// Every path is timed in short blocks from the same process. A round runs
// one block of every path, forward in even rounds and backward in odd ones
// (A B | B A), so that a pair of rounds has both paths at the same mean time
// and any linear drift cancels within it. The figure is the median over the
// pairs of the ratio of their sums, with a 95 % confidence interval of that
// median (order statistics: it assumes nothing about the noise's
// distribution), so a run says itself whether it resolves a difference.

// interleave runs rounds rounds of one block per path (block(i) times path
// i and returns its time per operation) in the order above and returns the
// blocks' times by path.
func interleave(rounds, paths int, block func(path int) float64) [][]float64 {
	times := make([][]float64, paths)
	for r := 0; r < rounds; r++ {
		for k := 0; k < paths; k++ {
			i := k
			if r%2 == 1 {
				i = paths - 1 - k
			}
			times[i] = append(times[i], block(i))
		}
	}
	return times
}

// pairRatios returns, per pair of rounds (forward, backward), the sum of a's
// two blocks over the sum of b's; a trailing odd round is a pair of its own.
func pairRatios(a, b []float64) []float64 {
	var out []float64
	for r := 0; r < len(a) && r < len(b); r += 2 {
		if r+1 < len(a) && r+1 < len(b) {
			out = append(out, (a[r]+a[r+1])/(b[r]+b[r+1]))
		} else {
			out = append(out, a[r]/b[r])
		}
	}
	return out
}

// medianCI returns the median of v and a distribution-free 95 % confidence
// interval of it: the order statistics n/2 ∓ 0.98·√n (the binomial's normal
// approximation), clamped to the extremes when n is small.
func medianCI(v []float64) (lo, mid, hi float64) {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	half := 0.98 * math.Sqrt(float64(n))
	l := max(int(math.Floor(float64(n)/2-half)), 0)
	h := min(int(math.Ceil(float64(n)/2+half)), n-1)
	return s[l], median(s), s[h]
}

// median is the middle value (the mean of the two middle ones if even).
func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// measured are the blocks of one comparison, path 0 against every other:
// their times by path, and path 0's ratios to path i by pair of blocks
// (ratios[i-1]).
type measured struct {
	names  []string
	times  [][]float64
	ratios [][]float64
}

// measure times the paths named names in blocks with interleave.
func measure(rounds int, names []string, block func(path int) float64) measured {
	m := measured{names: names, times: interleave(rounds, len(names), block)}
	for i := 1; i < len(names); i++ {
		m.ratios = append(m.ratios, pairRatios(m.times[0], m.times[i]))
	}
	return m
}

// measureWithin is measure for blocks that interleave the paths within
// themselves: one call of block times every path, in the order given or
// in the reverse one, and returns by path (in the order of names) the mean
// and the median time of its operations in the block. Blocks alternate the
// order, so that whatever favours a place in the order (the first socket
// made, the first round trip of a round) favours each path alike, and a
// pair of blocks gives one ratio as in measure. It returns the comparison of
// the means and that of the medians. Blocks run until there are at least
// blocks (rounded up to pairs) and a second has passed, so that the
// benchmark's run of b.N = 1 is its only one.
func measureWithin(blocks int, names []string, block func(reverse bool) (mean, p50 []float64)) (means, p50s measured) {
	means = measured{names: names, times: make([][]float64, len(names))}
	p50s = measured{names: names, times: make([][]float64, len(names))}
	start := time.Now()
	for n := 0; n < blocks || n%2 == 1 || time.Since(start) < time.Second; n++ {
		mean, p50 := block(n%2 == 1)
		for i := range names {
			means.times[i] = append(means.times[i], mean[i])
			p50s.times[i] = append(p50s.times[i], p50[i])
		}
	}
	for i := 1; i < len(names); i++ {
		means.ratios = append(means.ratios, pairRatios(means.times[0], means.times[i]))
		p50s.ratios = append(p50s.ratios, pairRatios(p50s.times[0], p50s.times[i]))
	}
	return means, p50s
}

// report reports path 0's median time per operation under unit, and per
// other path its median time ("<name>-<unit>") and the ratio of path 0 to
// it: "<prefix>x-<name>" is the median of the pair ratios,
// "<prefix>x-<name>-lo95" and "<prefix>x-<name>-hi95" its confidence
// interval.
func (m measured) report(b *testing.B, unit, prefix string) {
	b.ReportMetric(median(m.times[0]), unit)
	for i := 1; i < len(m.names); i++ {
		b.ReportMetric(median(m.times[i]), m.names[i]+"-"+unit)
		lo, mid, hi := medianCI(m.ratios[i-1])
		x := prefix + "x-" + m.names[i]
		b.ReportMetric(mid, x)
		b.ReportMetric(lo, x+"-lo95")
		b.ReportMetric(hi, x+"-hi95")
	}
}

func TestInterleaveOrder(t *testing.T) {
	var order []int
	times := interleave(4, 3, func(i int) float64 { order = append(order, i); return float64(len(order)) })
	if want := []int{0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 1, 0}; !slices.Equal(order, want) {
		t.Fatalf("block order %v, want %v", order, want)
	}
	// Each path's blocks of a pair of rounds are centred on the same time:
	// under a linear drift (block k takes k), every pair ratio is 1.
	for i := 1; i < 3; i++ {
		if got := pairRatios(times[0], times[i]); !slices.Equal(got, []float64{1, 1}) {
			t.Fatalf("path 0 against %d under a linear drift: pair ratios %v, want [1 1]", i, got)
		}
	}
}

func TestPairRatios(t *testing.T) {
	got := pairRatios([]float64{2, 4, 3}, []float64{1, 2, 1})
	if want := []float64{6.0 / 3, 3}; !slices.Equal(got, want) {
		t.Fatalf("pair ratios %v, want %v", got, want)
	}
}

func TestMedianCI(t *testing.T) {
	v := make([]float64, 100)
	for i := range v {
		v[i] = float64(100 - i) // 1..100, unsorted
	}
	lo, mid, hi := medianCI(v)
	// n = 100: ranks 50 ∓ 9.8 → indexes 40 and 60 (values 41 and 61).
	if lo != 41 || mid != 50.5 || hi != 61 {
		t.Fatalf("medianCI = %v, %v, %v; want 41, 50.5, 61", lo, mid, hi)
	}
	lo, mid, hi = medianCI([]float64{3, 1, 2})
	if lo != 1 || mid != 2 || hi != 3 {
		t.Fatalf("medianCI of 3 values = %v, %v, %v; want the extremes and 2", lo, mid, hi)
	}
}
