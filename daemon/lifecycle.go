package daemon

import "context"

// loopRunner runs one goroutine between start and stop; stop waits for it.
type loopRunner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (r *loopRunner) start(ctx context.Context, run func(context.Context)) {
	ctx, r.cancel = context.WithCancel(ctx)
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		run(ctx)
	}()
}

func (r *loopRunner) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	<-r.done
}
