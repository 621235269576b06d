package conntrack

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // servers and clients of the privileged tests
	benchChildMain() // draind's side of BenchmarkExpire, measured alone
	capCheckMain()   // Open with only CAP_NET_ADMIN (TestPrivilegedOpenWithNetAdminOnly)
	os.Exit(m.Run())
}
