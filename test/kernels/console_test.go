package kernels

import (
	"strings"
	"testing"
)

func TestParseConsole(t *testing.T) {
	r := parseLines(
		"kernel 6.12.1-cloud-amd64",
		"=== RUN   TestA",
		"=== RUN   TestA/ipv4",
		"--- PASS: TestA (1.00s)",
		"    --- PASS: TestA/ipv4 (1.00s)",
		"=== RUN   TestB",
		"    b_test.go:10: kernel feature live_connections on=true ",
		"    b_test.go:12: to 10.0.0.1:80: map[web-0:3] fails map[timeout:1]\r",
		"--- FAIL: TestB (2.00s)",
		"FAIL",
		"DRAIND-KERNEL-RESULT /tests/x.test exit=1 seconds=3.0",
		"DRAIND-KERNEL-DONE",
	)
	if r.kernel != "6.12.1-cloud-amd64" || !r.done || len(r.exits) != 1 || r.passed() != 1 {
		t.Errorf("parsed %+v", r)
	}
	if r.tests["TestA"] != "PASS" || r.tests["TestB"] != "FAIL" || !r.features["live_connections"] {
		t.Errorf("tests %v features %v", r.tests, r.features)
	}
	if got := r.said("TestB"); !strings.Contains(got, "fails map[timeout:1]") || strings.Contains(got, "\r") ||
		strings.Contains(got, "DRAIND-KERNEL") || strings.Contains(got, "--- FAIL") {
		t.Errorf("TestB said %q", got)
	}
	if len(r.last) != 12 || r.last[11] != "DRAIND-KERNEL-DONE" {
		t.Errorf("console's last lines %q", r.last)
	}
	if got := r.said("TestA"); got != "" {
		t.Errorf("TestA printed nothing of its own, said %q", got)
	}
}

// TestParseConsoleCrash: a guest kernel crash is told apart from a failed
// test run, named by its first report line and its panic line, and its
// report kept; an ordinary run has none.
func TestParseConsoleCrash(t *testing.T) {
	r := parseLines(
		"kernel 6.12.118+deb13-cloud-amd64",
		"=== RUN   TestPrivilegedUDPPodIPPolicies",
		"=== RUN   TestPrivilegedUDPPodIPPolicies/ipv4",
		"[  170.967693] traps: PANIC: double fault, error_code: 0x0",
		"[  170.979961] Oops: double fault: 0000 [#1] PREEMPT SMP NOPTI",
		"[  170.982364] RIP: 0010:__kmalloc_node_noprof+0xd8/0x430",
		"[  170.989919] Call Trace:",
		"[  171.006207] Kernel panic - not syncing: Fatal exception in interrupt",
	)
	if want := "traps: PANIC: double fault, error_code: 0x0, then Fatal exception in interrupt"; r.panicked != want {
		t.Errorf("panicked %q, want %q", r.panicked, want)
	}
	if len(r.crash) != 5 || !strings.Contains(r.crash[2], "RIP: 0010:__kmalloc_node_noprof") {
		t.Errorf("crash report %q", r.crash)
	}
	if r.done || len(r.tests) != 0 || len(r.failures()) != 0 {
		t.Errorf("a crashed run parsed as done=%v with tests %v", r.done, r.tests)
	}
	// A test that failed before the crash stays failed: the second boot
	// runs it again, and must not hide it.
	failedFirst := parseLines(
		"kernel 6.12.118",
		"=== RUN   TestA",
		"    a_test.go:9: refused with EPERM",
		"--- FAIL: TestA (1.00s)",
		"=== RUN   TestB",
		"--- PASS: TestB (1.00s)",
		"[  99.0] Oops: general protection fault: 0000 [#1] SMP",
		"[  99.1] Kernel panic - not syncing: Fatal exception",
	)
	if f := failedFirst.failures(); failedFirst.panicked == "" || len(f) != 1 ||
		!strings.HasPrefix(f[0], "TestA FAIL") || !strings.Contains(f[0], "refused with EPERM") {
		t.Errorf("a crash after a failed test: panicked %q, failures %q", failedFirst.panicked, f)
	}
	ok := parseLines("kernel 6.1.0", "=== RUN   TestA", "--- PASS: TestA (1.00s)", "DRAIND-KERNEL-DONE", "")
	if ok.panicked != "" || len(ok.crash) != 0 {
		t.Errorf("a clean run parsed as crashed: %q %q", ok.panicked, ok.crash)
	}
}

// parseLines parses a console made of these lines.
func parseLines(lines ...string) result {
	return parseConsole([]byte(strings.Join(lines, "\n")))
}
