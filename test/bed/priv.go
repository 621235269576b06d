package bed

import (
	"os"
	"testing"
)

// EnvPrivileged enables the root-only tests.
const EnvPrivileged = "PRIVILEGED_TESTS"

// PrivilegedReason says why privileged tests cannot run here, or "" if they can.
func PrivilegedReason() string {
	if os.Getenv(EnvPrivileged) != "1" {
		return "root-only test: set " + EnvPrivileged + "=1 and run as root to run it"
	}
	if os.Geteuid() != 0 {
		return "root-only test: " + EnvPrivileged + "=1 but not running as root"
	}
	return ""
}

// RequirePrivileged skips tb, printing why, unless privileged tests can run.
func RequirePrivileged(tb testing.TB) {
	tb.Helper()
	if r := PrivilegedReason(); r != "" {
		tb.Skip("SKIP: " + r)
	}
}
