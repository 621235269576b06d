package bpf_test

import (
	"os"
	"testing"

	"github.com/draind/draind/test/bed"
)

func TestMain(m *testing.M) {
	bed.HelperMain() // servers and clients of the privileged tests
	sockHelperMain() // raw-syscall sockets (UDP sendto/recvfrom, TCP Fast Open)
	capCheckMain()   // loading with the DaemonSet's capabilities only
	os.Exit(m.Run())
}
