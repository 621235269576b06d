package runloop

import (
	"context"
	"sync/atomic"
	"testing"
)

// TestStopWaitsForRun: Stop ends run's context and returns only once run
// has returned; Stop without Start does nothing.
func TestStopWaitsForRun(t *testing.T) {
	var l Loop
	l.Stop()
	var returned atomic.Bool
	started := make(chan struct{})
	l.Start(context.Background(), func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		returned.Store(true)
	})
	<-started
	l.Stop()
	if !returned.Load() {
		t.Fatal("Stop returned before run did")
	}
}
