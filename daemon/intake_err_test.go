package daemon

import (
	"errors"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
)

type stoppedInformer struct{}

func (stoppedInformer) AddEventHandler(cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	return nil, errors.New("informer stopped")
}

// TestHandlerRegistrationErrorReturned: a handler the informer refuses is
// an error for the caller, not a nil registration that never syncs.
func TestHandlerRegistrationErrorReturned(t *testing.T) {
	if _, err := onChange(stoppedInformer{}, func(_, _ any, _ time.Time) {}); err == nil {
		t.Fatal("a refused handler registration was not reported")
	}
	d := &Daemon{startErr: errors.New("registering the Pods handler: informer stopped")}
	if err := d.Run(t.Context()); err == nil || err != d.startErr {
		t.Errorf("Run: %v, want the registration error", err)
	}
}
