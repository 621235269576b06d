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
// slowest first, and are ordered by when they started, which is not the
// order the report lists them in.
func TestReadE2EReport(t *testing.T) {
	const report = `[{"SpecReports": [
  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeText": "should serve", "LeafNodeType": "It", "State": "passed", "RunTime": 2000000000,
   "StartTime": "2026-12-05T10:00:02Z"},
  {"ContainerHierarchyTexts": ["[sig-network] Services"], "LeafNodeText": "should fail", "LeafNodeType": "It", "State": "failed", "RunTime": 90000000000,
   "StartTime": "2026-12-05T10:00:01Z",
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
	if order := []string{"[sig-network] Services should fail", "[sig-network] Services should serve"}; !slices.Equal(res.Order, order) {
		t.Errorf("the specs by when they started: %q, want %q", res.Order, order)
	}
	if _, err := readE2EReport(filepath.Join(t.TempDir(), "none.json")); err == nil {
		t.Error("a missing report read without error")
	}
}

// A failed spec's detail keeps the head of its message and the tail of its
// log.
func TestHeadTailLines(t *testing.T) {
	for _, c := range []struct {
		text, head2, tail2 string
	}{
		{"", "", ""},
		{"a\n", "a", "a"},
		{"a\nb\nc\n", "a\nb", "b\nc"},
		{"a\nb", "a\nb", "a\nb"},
	} {
		if got := headLines(c.text, 2); got != c.head2 {
			t.Errorf("headLines(%q, 2) = %q, want %q", c.text, got, c.head2)
		}
		if got := tailLines(c.text, 2); got != c.tail2 {
			t.Errorf("tailLines(%q, 2) = %q, want %q", c.text, got, c.tail2)
		}
	}
}
