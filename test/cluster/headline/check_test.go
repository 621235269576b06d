package headline

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/test/scenario"
)

func result(v scenario.Variant, preStopTook time.Duration, fails map[string]int, preStop string) *scenario.Result {
	t0 := time.Unix(1000, 0)
	r := &scenario.Result{Variant: v, RolloutStart: t0, RolloutEnd: t0.Add(10 * time.Second)}
	for _, name := range []string{scenario.ClientClusterIP, scenario.ClientStale, scenario.ClientKeepAlive} {
		r.Clients = append(r.Clients, scenario.ClientResult{Name: name, OK: 10, Fails: map[string]int{}})
	}
	for k, v := range fails {
		r.Clients[1].Fails[k] = v
	}
	r.Pods = []scenario.PodResult{{Name: "web-0", PreStop: preStop, PreStopTook: preStopTook}}
	if preStop != "" {
		// A second pod a little quicker: the check compares pod by pod.
		r.Pods = append(r.Pods, scenario.PodResult{Name: "web-1", PreStop: preStop, PreStopTook: preStopTook - 100*time.Millisecond})
	}
	return r
}

func TestCheck(t *testing.T) {
	good := []*scenario.Result{
		result(scenario.Baseline, 0, map[string]int{"refused": 3}, ""),
		result(scenario.Sleep, 5*time.Second, map[string]int{"timeout": 3}, "slept"),
		result(scenario.Draind, 2*time.Second, nil, "drained"),
		result(scenario.Draind.UnderLoad(), 3*time.Second, nil, "drained"),
		result(scenario.Sleep.UnderLoad(), 5*time.Second, nil, "slept"),
	}
	if p := Check(good); len(p) != 0 {
		t.Errorf("good results flagged: %v", p)
	}
	for _, tc := range []struct {
		name string
		bad  []*scenario.Result
		want string
	}{
		{"draind failure", []*scenario.Result{result(scenario.Draind, time.Second, map[string]int{"refused": 1}, "drained")}, "failed requests"},
		{"offline timed out", []*scenario.Result{result(scenario.Draind, time.Second, nil, "timed-out")}, "want drained"},
		{"quiet baseline", []*scenario.Result{result(scenario.Baseline, time.Second, nil, "")}, "tests nothing"},
		{"slow draind", []*scenario.Result{result(scenario.Sleep.UnderLoad(), 5*time.Second, nil, "slept"),
			result(scenario.Draind.UnderLoad(), 5*time.Second, nil, "drained")}, "want draind faster"},
		{"slow draind, quiet", []*scenario.Result{result(scenario.Sleep, 5*time.Second, nil, "slept"),
			result(scenario.Draind, 6*time.Second, nil, "drained")}, "want draind faster"},
	} {
		p := Check(tc.bad)
		if len(p) == 0 || slices.ContainsFunc(p, func(s string) bool { return !strings.Contains(s, tc.want) }) {
			t.Errorf("%s: problems %v, want only ones about %q", tc.name, p, tc.want)
		}
	}
}
