// Package draincurves reads a rollout's per-pod drain series from
// Prometheus (what draind exports for each draining pod, measured on the
// node hosting it) and renders them as a PNG: live connections, new
// connections still reaching the pod, connections steered away from it,
// and for each pod when its drain series began (the drain started) and
// when its live connections reached zero for good (it was drained). The
// series go on while draind still steers the departed pod's IP (its
// --linger) and end after that.
package draincurves

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"time"
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
type Point struct {
	T time.Time
	V float64
}

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

func queryRange(ctx context.Context, base, expr string, start, end time.Time, step time.Duration) (map[string][]Point, error) {
	v := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)},
		"end": {strconv.FormatInt(end.Unix(), 10)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query_range?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("querying %s: %w", base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("decoding the answer to %s: %w", expr, err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", expr, r.Error)
	}
	out := map[string][]Point{}
	for _, s := range r.Data.Result {
		pod := s.Metric["pod"]
		for _, tv := range s.Values {
			ts, _ := tv[0].(float64)
			str, _ := tv[1].(string)
			val, err := strconv.ParseFloat(str, 64)
			if err != nil {
				continue
			}
			out[pod] = append(out[pod], Point{T: time.Unix(0, int64(ts*1e9)), V: val})
		}
	}
	return out, nil
}
