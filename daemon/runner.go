package daemon

import (
	"context"
	"math"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/draind/draind/daemon/internal/runloop"
)

// runner calls fn on demand, at most once per minInterval (bursts of
// signals coalesce into one run), and at least once per maxInterval or at
// the deadline fn returns, whichever comes first. Like kube-proxy's
// BoundedFrequencyRunner, but with minInterval 0 by default: draind's
// passes are incremental and cheap, and a drain must reach the kernel in
// well under a millisecond.
type runner struct {
	clock       clock.WithTicker
	minInterval time.Duration
	maxInterval time.Duration
	fn          func() (next time.Time)
	signal      chan struct{}
	loop        runloop.Loop
	// due is when the loop's timer fires next (UnixNano), for Schedule.
	due atomic.Int64
}

// Start runs the loop until Stop.
func (r *runner) Start(ctx context.Context) { r.loop.Start(ctx, r.Loop) }

// Stop ends the loop and waits for a pass in progress.
func (r *runner) Stop() { r.loop.Stop() }

func newRunner(c clock.WithTicker, minInterval, maxInterval time.Duration, fn func() time.Time) *runner {
	return &runner{clock: c, minInterval: minInterval, maxInterval: maxInterval, fn: fn, signal: make(chan struct{}, 1)}
}

// Run requests a run; it never blocks.
func (r *runner) Run() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// Schedule tells the loop that fn ran elsewhere and wants the next run at
// next (zero: no deadline): the loop runs once more if its own timer
// would fire later.
func (r *runner) Schedule(next time.Time) {
	if !next.IsZero() && next.UnixNano() < r.due.Load() {
		r.Run()
	}
}

// Loop runs until ctx ends.
func (r *runner) Loop(ctx context.Context) {
	var last time.Time
	next := r.clock.Now().Add(r.maxInterval)
	// One timer for every wait (a pass per few slice updates would
	// otherwise make and stop one each time).
	r.due.Store(next.UnixNano())
	t := r.clock.NewTimer(max(next.Sub(r.clock.Now()), 0))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.signal:
			if !t.Stop() {
				select { // fired meanwhile: not a deadline any more
				case <-t.C():
				default:
				}
			}
		case <-t.C():
		}
		if r.minInterval > 0 && !last.IsZero() {
			if d := r.minInterval - r.clock.Since(last); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-r.clock.After(d):
				}
			}
		}
		last = r.clock.Now()
		next = last.Add(r.maxInterval)
		// While fn runs, and until its deadline is known, any deadline a
		// pass elsewhere reports is sooner: Schedule signals (fn's pass may
		// end before the other begins and know nothing of its deadline).
		r.due.Store(math.MaxInt64)
		if dl := r.fn(); !dl.IsZero() && dl.Before(next) {
			next = dl
		}
		r.due.Store(next.UnixNano())
		t.Reset(max(next.Sub(r.clock.Now()), 0))
	}
}
