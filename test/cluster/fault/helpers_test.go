package fault

import (
	"testing"
	"time"
)

// The figures of the fault tests come from these helpers: check them on
// made-up samples (no root needed).
func TestSampleHelpers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	mk := func(steer []bool, counts []uint64) []mapSample {
		var out []mapSample
		for i := range steer {
			out = append(out, mapSample{at: at(10 * i), steering: steer[i], steered: counts[i]})
		}
		return out
	}
	ss := mk([]bool{true, false, false, true, true, false, true, true}, []uint64{5, 5, 5, 5, 7, 7, 7, 9})
	if g := gaps(ss); len(g) != 2 || !g[0][0].Equal(at(10)) || !g[0][1].Equal(at(20)) || !g[1][0].Equal(at(50)) || !g[1][1].Equal(at(50)) {
		t.Errorf("gaps = %v", g)
	}
	if d := backFrom(ss, t0); d != 60*time.Millisecond {
		t.Errorf("backFrom = %v, want 60ms (steering for good from the sample after the last gap)", d)
	}
	if d := backFrom(mk([]bool{true, true}, []uint64{0, 0}), t0); d != 0 {
		t.Errorf("backFrom of an unbroken run = %v, want 0", d)
	}
	if d := backFrom(mk([]bool{true, false}, []uint64{0, 0}), t0); d != -1 {
		t.Errorf("backFrom ending without steering = %v, want -1", d)
	}
	if d := firstSteer(ss, at(15)); d != 25*time.Millisecond {
		t.Errorf("firstSteer = %v, want 25ms (the counter grew at +40 ms)", d)
	}
	if d := firstSteer(ss, at(75)); d != -1 {
		t.Errorf("firstSteer after the last growth = %v, want -1", d)
	}
	ps := []probe{{server: "a"}, {server: "a"}, {fail: "refused"}}
	if got := fmtTally(tally(ps)); got != "!refused=1 a=2" {
		t.Errorf("tally = %q", got)
	}
}
