package realnode

import (
	"maps"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two processes take the next spec when free; a long spec dealt last
// makes the run longer than one dealt first, and [Serial] specs run after
// the others.
func TestMakespan(t *testing.T) {
	st := SpecTimes{Took: map[string]time.Duration{"long": 7 * time.Minute, "s [Serial]": time.Minute}, Typical: time.Minute}
	short := []string{"a", "b", "c", "d", "e", "f"}
	for _, c := range []struct {
		order []string
		want  time.Duration
	}{
		{append([]string{"long"}, short...), 7 * time.Minute},
		{append(short[:len(short):len(short)], "long"), 10 * time.Minute},
		{append([]string{"long", "s [Serial]"}, short...), 8 * time.Minute},
		{nil, 0},
	} {
		if got := st.Makespan(c.order, 2); got != c.want {
			t.Errorf("Makespan(%q, 2) = %v, want %v", c.order, got, c.want)
		}
	}
	if got := st.LowerBound(append([]string{"long"}, short...), 2); got != 7*time.Minute {
		t.Errorf("lower bound with a long spec: %v, want 7m0s", got)
	}
	if got := st.LowerBound(append([]string{"s [Serial]"}, short...), 2); got != 4*time.Minute {
		t.Errorf("lower bound of shared work: %v, want 4m0s", got)
	}
}

// Folding keeps the longer time of each spec; the table WriteSpecTimes
// writes reads back, and a spec it does not list takes the median time.
func TestSpecTimesRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "times.txt")
	st := SpecTimes{Took: map[string]time.Duration{"slow": 90 * time.Second, "mid": 20 * time.Second}}
	st = st.Fold([]SpecTime{{"slow", time.Minute}, {"mid", 25 * time.Second}, {"quick", 100 * time.Millisecond}})
	if err := WriteSpecTimes(path, []string{"a header"}, st); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSpecTimesFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"slow": 90 * time.Second, "mid": 25 * time.Second, "quick": 100 * time.Millisecond}
	if !maps.Equal(got.Took, want) {
		t.Errorf("read back %v, want %v", got.Took, want)
	}
	if got.of("unlisted") != 25*time.Second {
		t.Errorf("an unlisted spec: %v, want the median 25s", got.of("unlisted"))
	}
	for _, bad := range []string{"", "# only a comment\n", "| soon | spec |\n", "| 1s | a | b |\n"} {
		if _, err := ReadSpecTimes(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadSpecTimes(%q) read without error", bad)
		}
	}
}

// The committed table reads, and times most of the suite's specs.
func TestCommittedSpecTimes(t *testing.T) {
	st, err := ReadSpecTimesFile("testdata/conformance-spec-times.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Took) < 100 || st.Typical <= 0 {
		t.Errorf("%d specs, typical %v", len(st.Took), st.Typical)
	}
}
