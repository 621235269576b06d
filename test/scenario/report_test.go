package scenario

import (
	"strings"
	"testing"
	"time"
)

func TestParseVariants(t *testing.T) {
	vs, err := ParseVariants("baseline, sleep+load,draind+load")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, v := range vs {
		got = append(got, v.Label()+"@"+v.Namespace())
	}
	if strings.Join(got, " ") != "baseline@baseline sleep+load@sleep-load draind+load@draind-load" {
		t.Errorf("got %v", got)
	}
	if !vs[2].Draind || vs[2].PreStop != PreStopOffline || vs[0].Draind || vs[1].PreStop != PreStopSleep {
		t.Errorf("variant settings wrong: %+v", vs)
	}
	if _, err := ParseVariants("draind,nope"); err == nil {
		t.Error("unknown variant accepted")
	}
}

func testResult(name string, lastCIP, lastStale time.Duration, fails int) *Result {
	t0 := time.Unix(1000, 0)
	r := &Result{Variant: Variant{Name: name}, Config: Defaults(Config{}), RolloutStart: t0, RolloutEnd: t0.Add(8 * time.Second)}
	del := []time.Time{t0.Add(time.Second), t0.Add(4 * time.Second)}
	for i, d := range del {
		r.Pods = append(r.Pods, PodResult{Name: []string{"web-0", "web-1"}[i], Deleted: d, PreStop: "drained",
			PreStopTook: time.Duration(2+i) * time.Second, SYNsAfterStop: i})
	}
	r.Clients = []ClientResult{
		{Name: ClientClusterIP, OK: 100, Fails: map[string]int{"refused": fails},
			Last: map[string]time.Time{"web-0": del[0].Add(lastCIP), "web-1": del[1].Add(lastCIP / 2), "web-2": t0.Add(time.Hour)}},
		{Name: ClientStale, OK: 50, Fails: map[string]int{"timeout": 2 * fails, "refused": fails},
			Last: map[string]time.Time{"web-0": del[0].Add(lastStale)}},
		{Name: ClientKeepAlive, OK: 10, Last: map[string]time.Time{"web-1": del[1].Add(-time.Second)}},
	}
	return r
}

func TestResultFigures(t *testing.T) {
	r := testResult("sleep", 500*time.Millisecond, 5*time.Second, 3)
	if d, ok := r.LastLanding(ClientClusterIP); !ok || d != 500*time.Millisecond {
		t.Errorf("ClusterIP landing %v %v, want 500ms (web-2 is not a replaced pod)", d, ok)
	}
	if d, ok := r.LastLanding(ClientStale); !ok || d != 5*time.Second {
		t.Errorf("stale landing %v %v", d, ok)
	}
	if _, ok := r.LastLanding(ClientKeepAlive); ok {
		t.Error("keep-alive's last landing was before the delete: want none")
	}
	if r.FailedTotal() != 12 || r.SYNsAfterStop() != 1 || r.Rollout() != 8*time.Second {
		t.Errorf("failed %d syns %d rollout %v", r.FailedTotal(), r.SYNsAfterStop(), r.Rollout())
	}
	c, _ := r.Client(ClientStale)
	if c.FailKinds() != "timeout 6, refused 3" || c.Attempts() != 59 {
		t.Errorf("kinds %q attempts %d", c.FailKinds(), c.Attempts())
	}
	lo, hi, out := r.PreStopRange()
	if lo != 2*time.Second || hi != 3*time.Second || len(out) != 1 {
		t.Errorf("preStop range %v %v %v", lo, hi, out)
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, []*Result{testResult("sleep", 500*time.Millisecond, 5*time.Second, 3), testResult("draind", 0, 0, 0)}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	// Compare with runs of spaces folded: the widths are the printer's.
	var folded []string
	for line := range strings.Lines(out) {
		folded = append(folded, strings.Join(strings.Fields(line), " "))
	}
	norm := strings.Join(folded, "\n")
	for _, want := range []string{
		"| sleep | draind",
		"stale-registry client (old pod IP, every 20ms) | 9 / 59 | 0 / 50",
		"ClusterIP client (longest of the pods) | 500 ms | none",
		"| sleep | ClusterIP: refused 3; stale registry: timeout 6, refused 3 |",
		"| draind | none |",
	} {
		if !strings.Contains(norm, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if thousands(1234567) != "1,234,567" || thousands(12) != "12" || thousands(-1000) != "-1,000" {
		t.Error("thousands")
	}
}
