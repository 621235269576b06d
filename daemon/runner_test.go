package daemon

import (
	"context"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"
)

// TestRunnerSignalsAndDeadlines: a pass runs on a signal at once, and
// otherwise at the deadline the last pass returned (or maxInterval); a
// signal moves the next deadline to the one its pass returns.
func TestRunnerSignalsAndDeadlines(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(t0)
	runs := make(chan time.Time, 16)
	r := newRunner(clk, 0, time.Minute, func() time.Time {
		runs <- clk.Now()
		return clk.Now().Add(5 * time.Second)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
	defer r.Stop()
	next := func(what string) time.Time {
		t.Helper()
		select {
		case at := <-runs:
			return at
		case <-time.After(10 * time.Second):
			t.Fatalf("no pass %s", what)
			return time.Time{}
		}
	}
	waiting := func() {
		t.Helper()
		eventually(t, 10*time.Second, "the loop to wait", clk.HasWaiters)
	}
	// none: the timer has not fired (a fired timer has no waiter until the
	// loop has run its pass and reset it, so one of the two shows).
	none := func(what string) {
		t.Helper()
		if !clk.HasWaiters() || len(runs) != 0 {
			t.Fatalf("a pass %s", what)
		}
	}

	waiting()
	clk.Step(time.Minute - time.Second)
	none("before maxInterval")
	clk.Step(time.Second)
	if at := next("at maxInterval"); !at.Equal(t0.Add(time.Minute)) {
		t.Errorf("the first pass ran at %v, want maxInterval after the start", at.Sub(t0))
	}
	waiting()
	clk.Step(4 * time.Second)
	none("before the deadline the last pass returned")
	clk.Step(time.Second)
	next("at the deadline the last pass returned")

	// A signal runs a pass at once; the deadline is then its pass's.
	waiting()
	clk.Step(2 * time.Second)
	r.Run()
	signalled := next("on a signal")
	waiting()
	clk.Step(4 * time.Second) // 6 s after the pass before: its deadline passed
	none("at a deadline a signal replaced")
	clk.Step(time.Second)
	if at := next("at the signalled pass's deadline"); at.Sub(signalled) != 5*time.Second {
		t.Errorf("the pass after a signal's ran %v after it, want 5s", at.Sub(signalled))
	}
}

// TestRunnerSchedule: a pass that ran outside the loop and wants the next
// sooner than the loop's timer wakes the loop; one that wants it later, or
// not at all, does not.
func TestRunnerSchedule(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(t0)
	runs := make(chan struct{}, 16)
	r := newRunner(clk, 0, time.Minute, func() time.Time {
		runs <- struct{}{}
		return time.Time{}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
	defer r.Stop()
	eventually(t, 10*time.Second, "the loop to wait", clk.HasWaiters)
	r.Schedule(time.Time{})
	r.Schedule(t0.Add(2 * time.Minute)) // after the loop's own (maxInterval)
	if len(r.signal) != 0 || len(runs) != 0 {
		t.Fatal("a later deadline woke the loop")
	}
	r.Schedule(t0.Add(time.Second))
	select {
	case <-runs:
	case <-time.After(10 * time.Second):
		t.Fatal("an earlier deadline did not wake the loop")
	}
}
