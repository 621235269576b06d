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
// not at all, does not. While the loop's own pass runs, any deadline wakes
// it (its pass may know nothing of the other's).
func TestRunnerSchedule(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)
	clk := testingclock.NewFakeClock(t0)
	idle := newRunner(clk, 0, time.Minute, func() time.Time { return time.Time{} })
	idle.due.Store(t0.Add(time.Minute).UnixNano()) // as the loop leaves it
	idle.Schedule(time.Time{})
	idle.Schedule(t0.Add(2 * time.Minute))
	if len(idle.signal) != 0 {
		t.Fatal("a later deadline, or none, woke the loop")
	}
	idle.Schedule(t0.Add(time.Second))
	if len(idle.signal) != 1 {
		t.Fatal("an earlier deadline did not wake the loop")
	}

	runs := make(chan int, 16)
	var r *runner
	n := 0
	r = newRunner(clk, 0, time.Minute, func() time.Time {
		n++
		if n == 1 {
			// Another pass reports a deadline later than this pass's
			// (maxInterval): the loop must still learn of it.
			r.Schedule(clk.Now().Add(2 * time.Minute))
		}
		runs <- n
		return time.Time{}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
	defer r.Stop()
	eventually(t, 10*time.Second, "the loop to wait", clk.HasWaiters)
	r.Run()
	for want := 1; want <= 2; want++ {
		select {
		case got := <-runs:
			if got != want {
				t.Fatalf("run %d, want %d", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no run %d: a deadline reported during the loop's pass was lost", want)
		}
	}
}
