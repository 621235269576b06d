package deploycheck

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/draind/draind/test/cluster/draincurves"
	"github.com/draind/draind/test/cluster/prom"
)

// startPrometheus runs Prometheus with one scrape job scraping target
// (host:port) every second, as the PodMonitor configures it: job draind,
// a node label, the target's own namespace and pod labels honoured. It is
// stopped when the test ends.
func startPrometheus(t *testing.T, target, node string) *prom.Server {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
- job_name: draind
  honor_labels: true
  static_configs:
  - targets: [%q]
    labels: {node: %q}
`, target, node)
	return prom.Start(t, cfg, addr, nil)
}

// emptyWhenHealthy are dashboard queries that count something failing
// (series `== 0`): on a healthy daemon their answer is empty.
func emptyWhenHealthy(expr string) bool {
	return strings.Contains(expr, "== 0") && !strings.Contains(expr, " or ")
}

// TestPrometheusEvaluatesDashboard runs the real Prometheus server against
// a real daemon's /metrics (the daemon of TestMetricsAndQueries, with one
// drained pod on its node and a slice carrying a trigger time), scraping it
// as the PodMonitor does, and evaluates every dashboard query through the
// HTTP API: each returns data (or, for those that count failures, nothing
// on this healthy daemon), and the drained pod's per-pod series carry its
// own namespace and pod.
func TestPrometheusEvaluatesDashboard(t *testing.T) {
	prom.Bin(t)
	start := time.Now()
	_, metricsURL := serveDaemon(t)
	u, err := url.Parse(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	p := startPrometheus(t, u.Host, "node-a")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// rate() needs two samples in its window: wait for a few scrapes.
	for {
		s, err := p.Query(ctx, `count_over_time(up{job="draind"}[1m])`, time.Time{})
		if err == nil && len(s) == 1 {
			if n, _ := strconv.Atoi(fmt.Sprint(s[0].Value[1])); n >= 4 {
				break
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("Prometheus did not scrape draind 4 times within a minute (last answer %v, %v)", s, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
	dash, _ := shippedQueries(t)
	empty := 0
	for _, q := range dash {
		expr := ExpandGrafana(q.Expr)
		s, err := p.Query(ctx, expr, time.Time{})
		switch {
		case err != nil:
			t.Errorf("%s: %v", q.Where, err)
		case len(s) == 0 && emptyWhenHealthy(expr):
			empty++
		case len(s) == 0:
			t.Errorf("%s returns no data from a real Prometheus scraping draind: %s", q.Where, expr)
		}
	}
	for _, m := range []string{"draind_draining_pod_syns_total", "draind_draining_pod_live_connections", "draind_draining_pod_steered_total"} {
		s, err := p.Query(ctx, m+`{job="draind", node="node-a", namespace="shop", pod="web-1"}`, time.Time{})
		if err != nil || len(s) != 1 {
			t.Errorf("%s of the drained pod shop/web-1: %v %v", m, s, err)
		}
	}
	s, err := p.Query(ctx, `sum by (trigger) (draind_network_programming_duration_seconds_count)`, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, x := range s {
		got[x.Metric["trigger"]] = fmt.Sprint(x.Value[1])
	}
	if got["endpointslice"] == "0" || got["endpointslice"] == "" || got["lease"] == "0" || got["lease"] == "" {
		t.Errorf("network-programming observations by trigger %v: want the slice's and the Lease's", got)
	}
	t.Logf("evaluated %d dashboard queries in a real Prometheus: %d with data, %d empty as they are on a healthy daemon", len(dash), len(dash)-empty, empty)
	checkDrainCurves(ctx, t, p, start)
}

// checkDrainCurves renders the drained pod's curves from the Prometheus
// data with draincurves (cmd/draincurves) and checks the PNG.
func checkDrainCurves(ctx context.Context, t *testing.T, p *prom.Server, start time.Time) {
	t.Helper()
	c, err := draincurves.Fetch(ctx, p.Base, "shop", start, time.Now(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if pods := c.Pods(); len(pods) != 1 || pods[0] != "web-1" {
		t.Fatalf("drain curves of pods %v, want [web-1]", pods)
	}
	for i, s := range c.Series {
		if len(s["web-1"]) == 0 {
			t.Errorf("no %q samples of web-1", draincurves.Panels[i].Title)
		}
	}
	var buf bytes.Buffer
	if err := draincurves.Render(c, &buf, 8*vg.Inch, 6*vg.Inch); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("draincurves wrote no PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 8*96 || b.Dy() != 6*96 {
		t.Errorf("PNG of %v, want 768x576", b)
	}
	if out := os.Getenv("DRAIND_DRAINCURVES_PNG"); out != "" {
		if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
			t.Error(err)
		}
	}
}
