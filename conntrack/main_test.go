package conntrack

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // servers and clients of the privileged tests
	benchChildMain() // draind's side of BenchmarkExpire, measured alone
	os.Exit(m.Run())
}
