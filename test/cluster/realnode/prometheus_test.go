package realnode_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draincurves"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/prom"
	"github.com/draind/draind/test/cluster/realnode"
)

// promPort is where the bed's Prometheus listens, on the node's address
// inside the node's namespace (nothing else on the node uses it).
const promPort = 9090

// scrapeInterval is the bed Prometheus' scrape interval: short enough that
// a pod's drain, which lasts a few seconds, spans several scrapes.
const scrapeInterval = 500 * time.Millisecond

// nodeProm is Debian's Prometheus server running in the node's network
// namespace: it scrapes draind (job draind, on the node's address, labelled
// with the node as the PodMonitor does) and kube-proxy (job kube-proxy,
// on the node's loopback), and answers on the node's address, which the
// host reaches over the node's link.
type nodeProm struct{ *prom.Server }

// startNodeProm starts Prometheus in n's namespace (waitUp waits for its
// first scrapes). It is stopped when the test ends.
func startNodeProm(t *testing.T, n *realnode.Node) *nodeProm {
	t.Helper()
	began := time.Now()
	cfg := fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[1]s
  evaluation_interval: 1s
scrape_configs:
- job_name: draind
  honor_labels: true
  static_configs:
  - targets: [%[2]q]
    labels: {node: %[3]q}
- job_name: kube-proxy
  static_configs:
  - targets: ["127.0.0.1:10249"]
    labels: {node: %[3]q}
`, scrapeInterval, net.JoinHostPort(n.NodeIP.String(), "9461"), n.Name)
	addr := net.JoinHostPort(n.NodeIP.String(), strconv.Itoa(promPort))
	p := &nodeProm{prom.Start(t, cfg, addr, func(cmd *exec.Cmd) error { return kube.StartCmd(n.NetnsPath, cmd) })}
	t.Logf("Prometheus %s started in the node's namespace in %v, scraping draind and kube-proxy every %v", p.Base, time.Since(began).Round(time.Millisecond), scrapeInterval)
	return p
}

// waitUp waits until Prometheus has scraped both targets up twice: rate()
// has two samples from then on.
func (p *nodeProm) waitUp(ctx context.Context, t *testing.T) {
	t.Helper()
	began := time.Now()
	deadline := began.Add(time.Minute)
	for {
		s, err := p.Query(ctx, `count_over_time(up[1m]) >= 2 and up == 1`, time.Time{})
		if err == nil && len(s) == 2 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.TailLog(t, 40)
			t.Fatalf("Prometheus in the node's namespace did not scrape draind and kube-proxy within a minute (last answer %v, %v)", s, err)
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
	t.Logf("Prometheus scrapes draind and kube-proxy (waited %v)", time.Since(began).Round(time.Millisecond))
}

// waitScraped waits until Prometheus holds a scrape of both jobs taken
// after at, so that a query evaluated at that scrape sees everything up
// to at.
func (p *nodeProm) waitScraped(ctx context.Context, t *testing.T, at time.Time) time.Time {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		s, err := p.Query(ctx, `min(timestamp(up))`, time.Time{})
		if err == nil && len(s) == 1 {
			if ts := s[0].Float(); ts > float64(at.UnixNano())/1e9 {
				return time.Unix(0, int64(ts*1e9)).Add(time.Millisecond)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("Prometheus has no scrape after %v (last answer %v, %v)", at, s, err)
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// emptyInBed are the dashboard queries whose answer is legitimately empty
// in this bed, each with why: matched by a fragment of the expression.
var emptyInBed = []struct{ fragment, why string }{
	{`count(draind_steering_ready{node=~`, "counts agents not steering (== 0): draind steers"},
	{`count(up{job="draind", node=~`, "counts agents down (== 0): draind is up"},
}

// checkDashboard evaluates every query of the shipped dashboard through
// Prometheus over the rollout (from..to), with the node and the rollout's
// namespace for the dashboard's variables: each returns data at some step,
// except the few emptyInBed names.
func checkDashboard(ctx context.Context, t *testing.T, p *nodeProm, n *realnode.Node, namespace string, from, to time.Time) {
	t.Helper()
	dir, err := deploycheck.BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "dashboards", "draind.json"))
	if err != nil {
		t.Fatal(err)
	}
	qs, err := deploycheck.DashboardQueries(raw)
	if err != nil {
		t.Fatal(err)
	}
	vars := strings.NewReplacer("${node}", n.Name, "$node", n.Name, "${namespace}", namespace, "$namespace", namespace)
	withData, allowed := 0, 0
	for _, q := range qs {
		expr := deploycheck.ExpandGrafana(vars.Replace(q.Expr))
		s, err := p.QueryRange(ctx, expr, from, to, time.Second)
		if err != nil {
			t.Errorf("%s: %v", q.Where, err)
			continue
		}
		if len(s) > 0 {
			withData++
			continue
		}
		why := ""
		for _, e := range emptyInBed {
			if strings.Contains(expr, e.fragment) {
				why = e.why
			}
		}
		if why == "" {
			t.Errorf("%s returns no data during the rollout of %s: %s", q.Where, namespace, expr)
			continue
		}
		allowed++
		t.Logf("empty, as it should be in this bed (%s): %s", why, expr)
	}
	t.Logf("dashboard through the bed's Prometheus over the rollout: %d of %d queries with data, %d empty for a stated reason", withData, len(qs), allowed)
}

// checkPodSeries asserts that each old pod's drain shows in its per-pod
// series: absent before the restart, present from the pod's drain on
// (draind exports them only for pods it drains), its live connections
// ending at zero (drained); and the stale client's pod, whose IP that
// client keeps dialing, shows connections steered away. The series go on
// past the pod's removal while draind steers the departed IP (--linger).
func checkPodSeries(ctx context.Context, t *testing.T, p *nodeProm, res *rolloutResult, restarted, to time.Time) {
	t.Helper()
	var rows []string
	for i, pod := range res.oldPods {
		sel := fmt.Sprintf(`{job="draind", namespace=%q, pod=%q}`, res.namespace, pod.Name)
		row := "| " + pod.Name
		for _, m := range []string{"draind_draining_pod_live_connections", "draind_draining_pod_syns_total", "draind_draining_pod_steered_total"} {
			s, err := p.QueryRange(ctx, m+sel, restarted.Add(-10*time.Second), to, scrapeInterval)
			if err != nil {
				t.Fatal(err)
			}
			if len(s) != 1 || len(s[0].Values) == 0 {
				t.Errorf("%s%s: want one series with samples during the rollout, have %d", m, sel, len(s))
				row += " | -"
				continue
			}
			vs := s[0].Values
			first, _ := vs[0][0].(float64)
			if first <= float64(restarted.UnixNano())/1e9 {
				t.Errorf("%s%s exported before the rollout restarted (at %.3f): it should exist only while the pod drains", m, sel, first)
			}
			var v []float64
			for _, x := range vs {
				f, _ := strconv.ParseFloat(fmt.Sprint(x[1]), 64)
				v = append(v, f)
			}
			row += fmt.Sprintf(" | %.0f → %.0f", v[0], v[len(v)-1])
			switch {
			case strings.HasSuffix(m, "live_connections") && v[len(v)-1] != 0:
				t.Errorf("%s%s ends at %v live connections: the pod never drained in the series (%s)", m, sel, v[len(v)-1],
					liveBySource(ctx, p, sel, restarted.Add(-10*time.Second), to))
			case strings.HasSuffix(m, "steered_total") && i == 0 && !(v[len(v)-1] > v[0]):
				t.Errorf("%s%s went from %v to %v: the stale client dials this pod's IP, draind steered none of it", m, sel, v[0], v[len(v)-1])
			}
		}
		rows = append(rows, row+" |")
	}
	t.Logf("per-pod drain series in Prometheus (first → last sample during the rollout):\n| pod | live connections | syns | steered |\n|---|---|---|---|\n%s", strings.Join(rows, "\n"))
}

// liveBySource is each source's live-connection series of one pod
// (draind_draining_pod_live_connections_by_source), each sample as
// time=value: which source held a connection the pod was said to keep.
func liveBySource(ctx context.Context, p *nodeProm, sel string, from, to time.Time) string {
	s, err := p.QueryRange(ctx, "draind_draining_pod_live_connections_by_source"+sel, from, to, scrapeInterval)
	if err != nil {
		return fmt.Sprintf("by source: %v", err)
	}
	var out []string
	for _, x := range s {
		var vals []string
		for _, pt := range x.Points() {
			vals = append(vals, fmt.Sprintf("%s=%v", pt.T.UTC().Format("15:04:05"), pt.V))
		}
		out = append(out, fmt.Sprintf("%s: %s", x.Metric["source"], strings.Join(vals, " ")))
	}
	return "by source: " + strings.Join(out, "; ")
}

// reportProgramming prints draind's and kube-proxy's network-programming
// latency over the rollout (p50, p99 and draind/kube-proxy), and asserts
// both observed it.
func reportProgramming(ctx context.Context, t *testing.T, p *nodeProm, from, to time.Time) {
	t.Helper()
	window := fmt.Sprintf("%ds", int(math.Ceil(to.Sub(from).Seconds())))
	sources := []struct{ name, metric string }{
		{"draind (endpointslice trigger)", `draind_network_programming_duration_seconds_%s{job="draind", trigger="endpointslice"}`},
		{"draind (all triggers)", `draind_network_programming_duration_seconds_%s{job="draind"}`},
		{"kube-proxy", `kubeproxy_network_programming_duration_seconds_%s{job="kube-proxy"}`},
	}
	q := map[string][3]float64{}
	var b strings.Builder
	for _, src := range sources {
		count := instant(ctx, t, p, fmt.Sprintf("sum(increase(%s[%s]))", fmt.Sprintf(src.metric, "count"), window), to)
		if !(count > 0) {
			t.Errorf("%s observed no network programming during the rollout (%v)", src.name, count)
		}
		var qq [2]float64
		for i, phi := range []string{"0.5", "0.99"} {
			qq[i] = instant(ctx, t, p, fmt.Sprintf("histogram_quantile(%s, sum by (le) (increase(%s[%s])))", phi, fmt.Sprintf(src.metric, "bucket"), window), to)
		}
		mean := instant(ctx, t, p, fmt.Sprintf("sum(increase(%s[%s])) / sum(increase(%s[%s]))", fmt.Sprintf(src.metric, "sum"), window, fmt.Sprintf(src.metric, "count"), window), to)
		q[src.name] = [3]float64{qq[0], qq[1], mean}
		fmt.Fprintf(&b, "| %s | %.0f | %s | %s | %s |\n", src.name, count, ms(qq[0]), ms(qq[1]), ms(mean))
	}
	d, k := q[sources[0].name], q["kube-proxy"]
	t.Logf("real-node figures: network-programming latency during the rollout (%s window; trigger time → datapath write; quantiles interpolated in kube-proxy's buckets, the first ending at 250 ms; mean from _sum/_count):\n| source | observations | p50 | p99 | mean |\n|---|---|---|---|---|\n%sratio draind/kube-proxy: p50 %.2f, p99 %.2f, mean %.2f",
		window, b.String(), d[0]/k[0], d[1]/k[1], d[2]/k[2])
}

func ms(sec float64) string {
	if math.IsNaN(sec) {
		return "NaN"
	}
	return fmt.Sprintf("%.1f ms", sec*1000)
}

// instant is one scalar query: the value of its single series, NaN if none.
func instant(ctx context.Context, t *testing.T, p *nodeProm, expr string, at time.Time) float64 {
	t.Helper()
	s, err := p.Query(ctx, expr, at)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 1 {
		return math.NaN()
	}
	return s[0].Float()
}

// renderCurves renders the rollout's per-pod drain curves from Prometheus
// with draincurves (what cmd/draincurves runs), checks the PNG and writes
// it to $DRAIND_ROLLOUT_PNG if set.
func renderCurves(ctx context.Context, t *testing.T, p *nodeProm, res *rolloutResult, from, to time.Time) {
	t.Helper()
	c, err := draincurves.FetchRate(ctx, p.Base, res.namespace, from, to, scrapeInterval, 4*scrapeInterval)
	if err != nil {
		t.Fatal(err)
	}
	for _, pod := range res.oldPods {
		if len(c.Series[0][pod.Name]) == 0 {
			t.Errorf("the drain curves have no %q samples of %s", draincurves.Panels[0].Title, pod.Name)
		}
		if first, _ := c.Span(pod.Name); c.Drained(pod.Name).Before(first) {
			t.Errorf("the drain curves show no drained moment of %s after its drain began (%v)", pod.Name, first)
		}
	}
	var buf bytes.Buffer
	if err := draincurves.Render(c, &buf, 10*vg.Inch, 9*vg.Inch); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatalf("draincurves wrote no PNG: %v", err)
	}
	colours, inked := inkStats(img)
	t.Logf("drain curves: %dx%d PNG of %d bytes, %d colours, %.1f%% of pixels inked", img.Bounds().Dx(), img.Bounds().Dy(), buf.Len(), colours, 100*inked)
	if colours < 4+len(res.oldPods) || inked < 0.01 {
		t.Errorf("the drain curves PNG looks empty: %d colours, %.2f%% inked", colours, 100*inked)
	}
	out := os.Getenv("DRAIND_ROLLOUT_PNG")
	if out == "" {
		out = filepath.Join(t.TempDir(), "rollout-drain.png")
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("drain curves written to %s", out)
}

// inkStats counts img's distinct colours and the share of non-white
// pixels.
func inkStats(img image.Image) (colours int, inked float64) {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	ink := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bb, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bb, a}] = true
			if r < 0xf000 || g < 0xf000 || bb < 0xf000 {
				ink++
			}
		}
	}
	return len(seen), float64(ink) / float64(b.Dx()*b.Dy())
}

// checkPrometheus asserts, through the bed's Prometheus, what an operator
// would see of the rollout that restarted at restarted: the dashboard,
// each old pod's drain, both network-programming latencies, the curves.
func checkPrometheus(ctx context.Context, t *testing.T, p *nodeProm, n *realnode.Node, res *rolloutResult, restarted time.Time) {
	t.Helper()
	to := p.waitScraped(ctx, t, time.Now())
	from := restarted.Add(-2 * time.Second)
	checkDashboard(ctx, t, p, n, res.namespace, from, to)
	checkPodSeries(ctx, t, p, res, restarted, to)
	reportProgramming(ctx, t, p, restarted, to)
	renderCurves(ctx, t, p, res, from, to)
}
