package e2e

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // this test binary is also the bed's server and client
	os.Exit(m.Run())
}
