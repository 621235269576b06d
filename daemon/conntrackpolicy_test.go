package daemon

import (
	"testing"
	"time"
)

func TestExpiryBackoffReachesItsCap(t *testing.T) {
	if got := expiryBackoff(1); got != 200*time.Millisecond {
		t.Errorf("first retry after %v", got)
	}
	if got := expiryBackoff(50); got != 30*time.Second {
		t.Errorf("backoff after many failures %v, want the 30 s cap", got)
	}
}
