package deadpeer

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // the scenario's pods and clients re-execute this test binary
	os.Exit(m.Run())
}
