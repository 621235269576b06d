// Package prom runs Debian's Prometheus server for the tests and reads
// its HTTP API: prom.go (the API client: instant and range queries),
// server.go (the server a test starts and stops).
//
// Words are defined in the repository's docs/glossary.md.
package prom

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Client queries the Prometheus at Base (http://host:port).
type Client struct{ Base string }

// Series is one series of an answer: an instant query's has Value, a
// range query's Values (each [unix seconds, "value"]).
type Series struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
	Values [][2]any          `json:"values"`
}

// Float returns the series' value (the last one of a range; NaN if none
// parses).
func (s Series) Float() float64 {
	v := s.Value
	if len(s.Values) > 0 {
		v = s.Values[len(s.Values)-1]
	}
	return sampleValue(v)
}

// Point is one sample of a range.
type Point struct {
	T time.Time
	V float64
}

// Points returns the series' samples that parse, in order.
func (s Series) Points() []Point {
	out := make([]Point, 0, len(s.Values))
	for _, tv := range s.Values {
		ts, _ := tv[0].(float64)
		v := sampleValue(tv)
		if math.IsNaN(v) {
			continue
		}
		out = append(out, Point{T: time.Unix(0, int64(ts*1e9)), V: v})
	}
	return out
}

func sampleValue(tv [2]any) float64 {
	f, err := strconv.ParseFloat(fmt.Sprint(tv[1]), 64)
	if err != nil {
		return math.NaN()
	}
	return f
}

// Query evaluates expr at the instant at (zero: now).
func (c Client) Query(ctx context.Context, expr string, at time.Time) ([]Series, error) {
	v := url.Values{"query": {expr}}
	if !at.IsZero() {
		v.Set("time", Time(at))
	}
	return c.get(ctx, "/api/v1/query", v)
}

// QueryRange evaluates expr every step from start to end.
func (c Client) QueryRange(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	return c.get(ctx, "/api/v1/query_range", url.Values{"query": {expr}, "start": {Time(start)},
		"end": {Time(end)}, "step": {strconv.FormatFloat(step.Seconds(), 'f', -1, 64)}})
}

// Time is t as the API takes it: Unix seconds, to the millisecond.
func Time(t time.Time) string {
	return strconv.FormatFloat(float64(t.UnixNano())/1e9, 'f', 3, 64)
}

func (c Client) get(ctx context.Context, path string, v url.Values) ([]Series, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Base+path+"?"+v.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("querying %s: %w", c.Base, err)
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []Series `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("decoding the answer to %s: %w", v.Get("query"), err)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", v.Get("query"), r.Error)
	}
	return r.Data.Result, nil
}
