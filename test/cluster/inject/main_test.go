package inject

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping the shared control plane:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
