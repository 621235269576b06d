package fault

import (
	"fmt"
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // this test binary is also the bed's servers and clients
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the shared control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
