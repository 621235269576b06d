// Package runloop runs a daemon part's goroutine: one goroutine between
// Start and Stop, and Stop waits for it to return.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package runloop

import "context"

// Loop runs one goroutine between Start and Stop. The zero value is
// ready; Stop without Start does nothing.
type Loop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Start runs run on a goroutine of its own with a context that Stop (or
// ctx) ends.
func (l *Loop) Start(ctx context.Context, run func(context.Context)) {
	ctx, l.cancel = context.WithCancel(ctx)
	l.done = make(chan struct{})
	go func() {
		defer close(l.done)
		run(ctx)
	}()
}

// Stop ends what Start began and waits for run to return.
func (l *Loop) Stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	<-l.done
}
