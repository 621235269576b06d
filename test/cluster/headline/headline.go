package headline

import (
	"context"
	"fmt"
	"os"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/test/scenario"
)

// Variants is the headline: each variant quiet, then each under load
// (quiet ones first: the load is created once and stays).
var Variants = []scenario.Variant{
	scenario.Baseline, scenario.Sleep, scenario.Draind,
	scenario.Baseline.UnderLoad(), scenario.Sleep.UnderLoad(), scenario.Draind.UnderLoad(),
}

// RunVariants runs each variant on c in turn.
func RunVariants(ctx context.Context, c *Cluster, cfg scenario.Config, variants []scenario.Variant) ([]*scenario.Result, error) {
	var results []*scenario.Result
	for _, v := range variants {
		res, err := scenario.Run(ctx, c, cfg, v)
		if err != nil {
			return results, fmt.Errorf("variant %s: %w", v.Label(), err)
		}
		results = append(results, res)
	}
	return results, nil
}

// Check returns what the results contradict of draind's claims: draind
// variants have no failed request in any client (and every offline call
// ended drained); baseline variants do have failures (or the scenario
// tests nothing); under the same load, every draind pod's preStop ends
// before the shortest sleep: it returns once the pod is drained (the
// clients close their connections promptly), not after a fixed time.
func Check(results []*scenario.Result) []string {
	var problems []string
	by := map[string]*scenario.Result{}
	for _, r := range results {
		by[r.Variant.Label()] = r
		switch r.Variant.Name {
		case scenario.Draind.Name:
			for _, c := range r.Clients {
				if c.Failed() != 0 {
					problems = append(problems, fmt.Sprintf("%s: the %s client saw %d failed requests (%s), want 0", r.Variant.Label(), c.Name, c.Failed(), c.FailKinds()))
				}
			}
			for _, p := range r.Pods {
				if p.PreStop != "drained" {
					problems = append(problems, fmt.Sprintf("%s: pod %s's offline call ended %q, want drained", r.Variant.Label(), p.Name, p.PreStop))
				}
			}
		case scenario.Baseline.Name:
			if r.FailedTotal() == 0 {
				problems = append(problems, fmt.Sprintf("%s: no client saw a failure without draind and without preStop: the scenario tests nothing", r.Variant.Label()))
			}
		}
		for _, c := range r.Clients {
			if c.OK == 0 {
				problems = append(problems, fmt.Sprintf("%s: the %s client never succeeded", r.Variant.Label(), c.Name))
			}
		}
	}
	for _, load := range []bool{false, true} {
		s, d := by[scenario.Sleep.Label()], by[scenario.Draind.Label()]
		if load {
			s, d = by[scenario.Sleep.UnderLoad().Label()], by[scenario.Draind.UnderLoad().Label()]
		}
		if s == nil || d == nil || len(s.Pods) == 0 || len(d.Pods) == 0 {
			continue
		}
		// Pod by pod, not the rollouts' lengths: a rollout also waits for
		// every new pod to start, which on a saturated machine varies by
		// more than the sleep draind saves.
		sLo, _, _ := s.PreStopRange()
		_, dHi, _ := d.PreStopRange()
		if dHi >= sLo {
			problems = append(problems, fmt.Sprintf("%s's longest preStop took %v, %s's shortest %v: want draind faster", d.Variant.Label(), dHi, s.Variant.Label(), sLo))
		}
	}
	return problems
}

// CheckDraindLogs reports API calls the daemons were refused: with the
// ServiceAccount's RBAC every call they make must be allowed.
func CheckDraindLogs(c *Cluster) []string {
	var problems []string
	for _, path := range c.DraindLogs() {
		b, err := os.ReadFile(path)
		if err != nil {
			problems = append(problems, fmt.Sprintf("reading %s: %v", path, err))
			continue
		}
		for line := range strings.Lines(string(b)) {
			if strings.Contains(strings.ToLower(line), "forbidden") {
				problems = append(problems, fmt.Sprintf("%s: %s", path, strings.TrimSpace(line)))
			}
		}
	}
	return problems
}

// DrainEvents counts the Events draind recorded on pods in namespace, by
// reason (DrainStarted, Drained, DrainTimedOut): proof that it could write
// them with its RBAC.
func DrainEvents(ctx context.Context, c *Cluster, namespace string) (map[string]int, error) {
	evs, err := c.kube.Admin.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing events in %s: %w", namespace, err)
	}
	out := map[string]int{}
	for _, e := range evs.Items {
		if e.Source.Component == "draind" || e.ReportingController == "draind" {
			out[e.Reason] += int(max(e.Count, 1))
		}
	}
	return out, nil
}
