package kernels

import (
	"strings"
	"testing"
)

func TestParseConsole(t *testing.T) {
	console := strings.Join([]string{
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
	}, "\n")
	r := parseConsole([]byte(console))
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
