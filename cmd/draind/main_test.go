package main

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The commands stop everything they start (informers, servers, the
	// daemon's loops).
	goleak.VerifyTestMain(m)
}
