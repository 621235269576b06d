package daemon

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // pods' servers and clients of the privileged tests
	os.Exit(m.Run())
}
