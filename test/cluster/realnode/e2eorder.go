package realnode

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"
)

// Ginkgo deals specs out to its processes in an order its seed decides,
// each process taking the next spec when it is free. It knows nothing of
// how long a spec takes: a seed that deals a seven-minute spec last makes
// the run seven minutes longer than one that deals it first. PickSeed
// chooses, from how long each spec took before (SpecTimes), a seed whose
// order leaves no long spec to the end, and the run is the same every time
// for one build of the suite.

// SpecTimes is how long specs take: Took by name, Typical for a spec it
// does not name.
type SpecTimes struct {
	Took    map[string]time.Duration
	Typical time.Duration
}

func (st SpecTimes) of(spec string) time.Duration {
	if d, ok := st.Took[spec]; ok {
		return d
	}
	return st.Typical
}

// serial reports whether ginkgo runs spec alone, after the others.
func serial(spec string) bool { return strings.Contains(spec, "[Serial]") }

// Makespan is how long procs processes take to run specs dealt in order:
// each takes the next spec when it is free, and the [Serial] specs run one
// at a time after all the others, as ginkgo runs them.
func (st SpecTimes) Makespan(order []string, procs int) time.Duration {
	free := make([]time.Duration, max(procs, 1))
	var end, serialWork time.Duration
	for _, s := range order {
		if serial(s) {
			serialWork += st.of(s)
			continue
		}
		i := 0
		for j := range free {
			if free[j] < free[i] {
				i = j
			}
		}
		free[i] += st.of(s)
		end = max(end, free[i])
	}
	return end + serialWork
}

// LowerBound is a time no order of specs beats: the longest spec, or the
// work shared evenly by procs processes, whichever is longer, then the
// [Serial] specs.
func (st SpecTimes) LowerBound(specs []string, procs int) time.Duration {
	var longest, work, serialWork time.Duration
	for _, s := range specs {
		d := st.of(s)
		if serial(s) {
			serialWork += d
			continue
		}
		longest, work = max(longest, d), work+d
	}
	return max(longest, work/time.Duration(max(procs, 1))) + serialWork
}

// ReadSpecTimes reads a table of spec times as WriteSpecTimes writes it
// ("| 7m5.6s | name |" rows; other lines are comments). Typical
// is the median of the times it lists.
func ReadSpecTimes(r io.Reader) (SpecTimes, error) {
	st := SpecTimes{Took: map[string]time.Duration{}}
	var all []time.Duration
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(l, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) != 2 {
			return SpecTimes{}, fmt.Errorf("spec times: %q is not | time | spec |", l)
		}
		d, err := time.ParseDuration(strings.TrimSpace(cells[0]))
		if err != nil {
			return SpecTimes{}, fmt.Errorf("spec times: %q: %w", l, err)
		}
		st.Took[strings.TrimSpace(cells[1])] = d
		all = append(all, d)
	}
	if err := sc.Err(); err != nil {
		return SpecTimes{}, err
	}
	if len(all) == 0 {
		return SpecTimes{}, fmt.Errorf("spec times: no | time | spec | row")
	}
	slices.Sort(all)
	st.Typical = all[len(all)/2]
	return st, nil
}

// ReadSpecTimesFile reads the table at path (ReadSpecTimes).
func ReadSpecTimesFile(path string) (SpecTimes, error) {
	f, err := os.Open(path)
	if err != nil {
		return SpecTimes{}, err
	}
	defer f.Close()
	return ReadSpecTimes(f)
}

// Fold returns st with the times of specs folded in: each spec's time is
// the longer of the two, so that the table plans for the slow runs of a
// spec whose time varies (the session-affinity-timeout specs take 2.5 or 7
// minutes, as chance decides).
func (st SpecTimes) Fold(specs []SpecTime) SpecTimes {
	out := SpecTimes{Took: maps.Clone(st.Took), Typical: st.Typical}
	if out.Took == nil {
		out.Took = map[string]time.Duration{}
	}
	for _, s := range specs {
		out.Took[s.Name] = max(out.Took[s.Name], s.Took)
	}
	return out
}

// WriteSpecTimes writes st's table, slowest first, under header (comment
// lines), as ReadSpecTimes reads it.
func WriteSpecTimes(path string, header []string, st SpecTimes) error {
	var sb strings.Builder
	for _, h := range header {
		fmt.Fprintf(&sb, "# %s\n", h)
	}
	names := slices.Collect(maps.Keys(st.Took))
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(st.Took[b], st.Took[a]), strings.Compare(a, b))
	})
	for _, n := range names {
		fmt.Fprintf(&sb, "| %v | %s |\n", st.Took[n].Round(100*time.Millisecond), n)
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

// SeedChoice is the seed PickSeed chose and what it expects of it.
type SeedChoice struct {
	Seed     int64
	Makespan time.Duration // the order's, by the spec times
	Bound    time.Duration // SpecTimes.LowerBound
	Tried    int
}

// PickSeed lists the order of cfg's specs for the seeds 1, 2, … (dry runs
// of a second each) and returns the first seed whose order the spec times
// say is within 5% of the lower bound, or the best of tries seeds.
func (m *Multi) PickSeed(ctx context.Context, cfg E2EConfig, st SpecTimes, tries int) (SeedChoice, error) {
	var best SeedChoice
	for seed := int64(1); seed <= int64(max(tries, 1)); seed++ {
		c := cfg
		c.Seed, c.DryRun, c.Dir = seed, true, fmt.Sprintf("%s/order-%d", cfg.Dir, seed)
		res, err := m.RunE2E(ctx, c)
		if err != nil {
			return SeedChoice{}, fmt.Errorf("listing the specs' order for seed %d: %w", seed, err)
		}
		if len(res.Order) == 0 {
			return SeedChoice{}, fmt.Errorf("listing the specs' order for seed %d: the dry run lists no spec (log %s)", seed, res.Log)
		}
		got := SeedChoice{Seed: seed, Makespan: st.Makespan(res.Order, cfg.Procs), Bound: st.LowerBound(res.Order, cfg.Procs), Tried: int(seed)}
		if best.Seed == 0 || got.Makespan < best.Makespan {
			best = got
		}
		best.Tried = int(seed)
		if float64(got.Makespan) <= 1.05*float64(got.Bound) {
			return best, nil
		}
	}
	return best, nil
}
