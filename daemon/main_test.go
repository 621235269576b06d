package daemon

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // pods' servers and clients of the privileged tests
	// Every test stops what it started: informers, loops, the Lease
	// writer, the Event broadcaster.
	goleak.VerifyTestMain(m)
}
