package realnode

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// A report as ginkgo writes it (--json-report): the spec states sort into
// passed, failed and skipped, and the specs that ran carry their run time,
// slowest first.
func TestReadE2EReport(t *testing.T) {
	const report = `[{"SpecReports": [
  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeText": "should serve", "LeafNodeType": "It", "State": "passed", "RunTime": 2000000000},
  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeText": "should fail", "LeafNodeType": "It", "State": "failed", "RunTime": 90000000000,
   "Failure": {"Message": "timed out", "Location": {"FileName": "/src/test/e2e/network/service.go", "LineNumber": 3239}},
   "CapturedGinkgoWriterOutput": "STEP: one\nSTEP: two\n"},
  {"ContainerHierarchyTexts": ["[sig-network] DNS"], "LeafNodeText": "should skip", "LeafNodeType": "It", "State": "skipped", "RunTime": 1000},
  {"LeafNodeText": "", "LeafNodeType": "SynchronizedBeforeSuite", "State": "passed", "RunTime": 500000000000}
]}]`
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := readE2EReport(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Passed, []string{"[sig-network] Services should serve"}) ||
		!slices.Equal(res.Failed, []string{"[sig-network] Services should fail"}) ||
		!slices.Equal(res.Skipped, []string{"[sig-network] DNS should skip"}) {
		t.Errorf("passed %q, failed %q, skipped %q", res.Passed, res.Failed, res.Skipped)
	}
	if res.Why["[sig-network] Services should fail"] != "failed: timed out" {
		t.Errorf("why: %q", res.Why)
	}
	if d, want := res.Detail["[sig-network] Services should fail"], "at service.go:3239: timed out\nSTEP: one\nSTEP: two"; d != want || len(res.Detail) != 1 {
		t.Errorf("detail: %q, want %q for the failed spec alone", res.Detail, want)
	}
	want := []SpecTime{{"[sig-network] Services should fail", 90 * time.Second}, {"[sig-network] Services should serve", 2 * time.Second}}
	if !slices.Equal(res.Specs, want) {
		t.Errorf("specs with their run time: %v, want %v", res.Specs, want)
	}
	if _, err := readE2EReport(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing report read without error")
	}
}

// Two runs that split one suite's specs merge into one outcome: each spec
// keeps the state and the message of the run it ran in; one skipped by
// both stays skipped.
func TestMergeE2E(t *testing.T) {
	rest := &E2EResult{
		Passed: []string{"a"}, Failed: []string{"b"}, Skipped: []string{"long", "x"},
		Why:   map[string]string{"b": "failed: b", "long": "skipped: by --skip", "x": "skipped: x"},
		Specs: []SpecTime{{"a", time.Second}, {"b", 3 * time.Second}}, Took: time.Minute, Log: "rest.log",
	}
	long := &E2EResult{
		Failed: []string{"long"}, Skipped: []string{"a", "b", "x"},
		Why:    map[string]string{"long": "failed: long", "a": "skipped: not focused"},
		Detail: map[string]string{"long": "at x.go:1: long"},
		Specs:  []SpecTime{{"long", 2 * time.Second}}, Took: 2 * time.Minute, Log: "long.log",
	}
	got := mergeE2E(rest, long)
	if !slices.Equal(got.Passed, []string{"a"}) || !slices.Equal(got.Failed, []string{"b", "long"}) || !slices.Equal(got.Skipped, []string{"x"}) {
		t.Errorf("passed %q, failed %q, skipped %q", got.Passed, got.Failed, got.Skipped)
	}
	for s, want := range map[string]string{"a": "", "b": "failed: b", "long": "failed: long", "x": "skipped: x"} {
		if got.Why[s] != want {
			t.Errorf("why %s: %q, want %q", s, got.Why[s], want)
		}
	}
	if want := []SpecTime{{"b", 3 * time.Second}, {"long", 2 * time.Second}, {"a", time.Second}}; !slices.Equal(got.Specs, want) {
		t.Errorf("specs %v, want %v", got.Specs, want)
	}
	if got.Detail["long"] != "at x.go:1: long" {
		t.Errorf("detail %q", got.Detail)
	}
	if got.Took != 2*time.Minute {
		t.Errorf("took %v, want the longer run's", got.Took)
	}
}
