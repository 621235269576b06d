// Package draincurves reads a rollout's per-pod drain series from
// Prometheus (what draind exports for each draining pod, measured on the
// node hosting it) and renders them as a PNG: live connections, new
// connections still reaching the pod, connections steered away from it,
// and for each pod when its drain series began (the drain started) and
// when its live connections reached zero for good (it was drained). The
// series go on while draind still steers the departed pod's IP (its
// --linger) and end after that.
//
// Words are defined in the repository's docs/glossary.md.
package draincurves

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/draind/draind/test/cluster/prom"
)

// Panels are the three curves of each pod, top to bottom.
var Panels = []Panel{
	{Title: "Live connections", Unit: "connections",
		Query: `sum by (pod) (draind_draining_pod_live_connections{namespace=%q})`},
	{Title: "New connections reaching the pod", Unit: "per second",
		Query: `sum by (pod) (rate(draind_draining_pod_syns_total{namespace=%q}[%s]))`},
	{Title: "Connections steered away", Unit: "per second",
		Query: `sum by (pod) (rate(draind_draining_pod_steered_total{namespace=%q}[%s]))`},
}

// Panel is one query, by pod.
type Panel struct {
	Title, Unit string
	Query       string // %q: the namespace; %s: the rate window
}

// Point is one sample.
type Point = prom.Point

// Curves are a rollout's per-pod series, by panel (Panels' order) and pod.
type Curves struct {
	Namespace  string
	Start, End time.Time
	Series     []map[string][]Point
}

// Pods returns every pod of any panel, sorted.
func (c *Curves) Pods() []string {
	set := map[string]bool{}
	for _, s := range c.Series {
		for p := range s {
			set[p] = true
		}
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// Span is when pod's drain series existed: its drain started at the
// first sample; the last is the end of draind's steering around it (or
// of the range).
func (c *Curves) Span(pod string) (first, last time.Time) {
	for _, s := range c.Series {
		for _, p := range s[pod] {
			if first.IsZero() || p.T.Before(first) {
				first = p.T
			}
			if p.T.After(last) {
				last = p.T
			}
		}
	}
	return first, last
}

// Drained is when pod's live connections reached zero for good: the
// first sample of its live-connections series from which every later one
// is zero (zero if the series does not end at zero).
func (c *Curves) Drained(pod string) time.Time {
	var at time.Time
	for _, p := range c.Series[0][pod] {
		switch {
		case p.V != 0:
			at = time.Time{}
		case at.IsZero():
			at = p.T
		}
	}
	return at
}

// Fetch reads the panels' series of namespace's pods between start and
// end from the Prometheus at base (its HTTP API, /api/v1/query_range),
// with rates over 4 steps (10 s at least, for the usual scrape intervals).
func Fetch(ctx context.Context, base, namespace string, start, end time.Time, step time.Duration) (*Curves, error) {
	return FetchRate(ctx, base, namespace, start, end, step, max(4*step, 10*time.Second))
}

// FetchRate is Fetch with the rates' window: at least two scrape
// intervals of the Prometheus at base.
func FetchRate(ctx context.Context, base, namespace string, start, end time.Time, step, rate time.Duration) (*Curves, error) {
	window := rate.String()
	c := &Curves{Namespace: namespace, Start: start, End: end}
	for _, p := range Panels {
		q := fmt.Sprintf(p.Query, namespace)
		if p.Query != Panels[0].Query {
			q = fmt.Sprintf(p.Query, namespace, window)
		}
		s, err := queryRange(ctx, base, q, start, end, step)
		if err != nil {
			return nil, err
		}
		c.Series = append(c.Series, s)
	}
	return c, nil
}

// queryRange reads expr's series by pod.
func queryRange(ctx context.Context, base, expr string, start, end time.Time, step time.Duration) (map[string][]Point, error) {
	series, err := prom.Client{Base: base}.QueryRange(ctx, expr, start, end, step)
	if err != nil {
		return nil, err
	}
	out := map[string][]Point{}
	for _, s := range series {
		pod := s.Metric["pod"]
		out[pod] = append(out[pod], s.Points()...)
	}
	return out, nil
}
