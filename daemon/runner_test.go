package daemon

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
)

// TestRunnerSignalsAndDeadlines: a pass runs on a signal at once, and
// otherwise at the deadline the last pass returned (or maxInterval); a
// signal moves the next deadline to the one its pass returns. It runs in a
// synctest bubble: time moves only when every goroutine waits, so each
// step checks exactly which passes ran by then, with no polling.
func TestRunnerSignalsAndDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		var mu sync.Mutex
		var runs []time.Duration // when each pass ran, since t0
		r := newRunner(clock.RealClock{}, 0, time.Minute, func() time.Time {
			mu.Lock()
			runs = append(runs, time.Since(t0))
			mu.Unlock()
			return time.Now().Add(5 * time.Second)
		})
		r.Start(t.Context())
		defer r.Stop()
		// after lets d pass, waits for the loop to settle and checks the
		// passes that ran so far.
		after := func(d time.Duration, what string, want ...time.Duration) {
			t.Helper()
			time.Sleep(d)
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(runs, want) {
				t.Fatalf("%s: passes ran at %v, want %v", what, runs, want)
			}
		}
		after(time.Minute-time.Second, "before maxInterval")
		after(time.Second, "at maxInterval", time.Minute)
		after(4*time.Second, "before the deadline the last pass returned", time.Minute)
		after(time.Second, "at that deadline", time.Minute, time.Minute+5*time.Second)

		// A signal runs a pass at once; the deadline is then its pass's.
		time.Sleep(2 * time.Second)
		r.Run()
		after(0, "on a signal", time.Minute, time.Minute+5*time.Second, time.Minute+7*time.Second)
		after(4*time.Second, "at a deadline the signal replaced", time.Minute, time.Minute+5*time.Second, time.Minute+7*time.Second)
		after(time.Second, "at the signalled pass's deadline",
			time.Minute, time.Minute+5*time.Second, time.Minute+7*time.Second, time.Minute+12*time.Second)
	})
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

	// While the loop's own pass runs, a deadline another pass reports
	// later than this pass's (maxInterval) must still reach the loop.
	synctest.Test(t, func(t *testing.T) {
		var r *runner
		var n atomic.Int32
		r = newRunner(clock.RealClock{}, 0, time.Minute, func() time.Time {
			if n.Add(1) == 1 {
				r.Schedule(time.Now().Add(2 * time.Minute))
			}
			return time.Time{}
		})
		r.Start(t.Context())
		defer r.Stop()
		synctest.Wait()
		r.Run()
		synctest.Wait()
		if got := n.Load(); got != 2 {
			t.Fatalf("%d passes without time passing, want 2: a deadline reported during the loop's pass was lost", got)
		}
	})
}
