package headline

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/draind/draind/test/cluster/e2e"
)

// Network-programming latency, as kube-proxy and draind export it: from
// the trigger time of the change (an EndpointSlice's
// endpoints.kubernetes.io/last-change-trigger-time) to the data path
// applying it. Both use the same buckets.
const (
	proxyProgramming  = "kubeproxy_network_programming_duration_seconds"
	draindProgramming = "draind_network_programming_duration_seconds"
)

// buckets is a cumulative histogram: upper bound → observations at or
// below it (+Inf included).
type buckets map[float64]float64

// histogramOf sums the buckets and the _sum of histogram in a flattened
// exposition (series with labels → value) over the series that carry
// every label of only.
func histogramOf(series map[string]float64, histogram string, only ...string) (buckets, float64) {
	out, total := buckets{}, 0.0
	for s, v := range series {
		name, labels, _ := strings.Cut(s, "{")
		keep := true
		for _, l := range only {
			keep = keep && strings.Contains(labels, l)
		}
		if name == histogram+"_sum" && keep {
			total += v
		}
		_, le, ok := strings.Cut(labels, `le="`)
		if name != histogram+"_bucket" || !keep || !ok {
			continue
		}
		le, _, _ = strings.Cut(le, `"`)
		bound, err := strconv.ParseFloat(le, 64)
		if err != nil {
			continue
		}
		out[bound] += v
	}
	return out, total
}

func (b buckets) add(o buckets, sign float64) {
	for k, v := range o {
		b[k] += sign * v
	}
}

// count is the number of observations.
func (b buckets) count() float64 { return b[math.Inf(1)] }

// quantile estimates the q-quantile as Prometheus' histogram_quantile
// does: linear interpolation inside the bucket holding it (NaN without
// observations).
func (b buckets) quantile(q float64) float64 {
	if b.count() <= 0 {
		return math.NaN()
	}
	bounds := make([]float64, 0, len(b))
	for k := range b {
		bounds = append(bounds, k)
	}
	sort.Float64s(bounds)
	rank := q * b.count()
	lower, below := 0.0, 0.0
	for _, ub := range bounds {
		if b[ub] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			if b[ub] == below {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/(b[ub]-below)
		}
		lower, below = ub, b[ub]
	}
	return lower
}

// Programming is one draind variant's network-programming latency, summed
// over the nodes: draind's (EndpointSlice trigger) and kube-proxy's over
// the same span.
type Programming struct {
	Variant           string
	Draind, KubeProxy buckets
	// DraindSum and KubeProxySum are the histograms' _sum: seconds in all.
	DraindSum, KubeProxySum float64
}

// String is one line: p50 and p99 of both, and the ratio draind/kube-proxy.
func (p Programming) String() string {
	d50, d99 := p.Draind.quantile(0.5), p.Draind.quantile(0.99)
	k50, k99 := p.KubeProxy.quantile(0.5), p.KubeProxy.quantile(0.99)
	dm, km := p.DraindSum/p.Draind.count(), p.KubeProxySum/p.KubeProxy.count()
	return fmt.Sprintf("%s: draind p50 %s p99 %s mean %s (%.0f observations); kube-proxy p50 %s p99 %s mean %s (%.0f); draind/kube-proxy p50 %.2f, p99 %.2f, mean %.2f",
		p.Variant, msec(d50), msec(d99), msec(dm), p.Draind.count(), msec(k50), msec(k99), msec(km), p.KubeProxy.count(), d50/k50, d99/k99, dm/km)
}

func msec(s float64) string {
	if math.IsNaN(s) {
		return "-"
	}
	return fmt.Sprintf("%.1fms", s*1000)
}

// proxyHistograms reads kube-proxy's network-programming histogram on
// every node, summed.
func proxyHistograms(ctx context.Context, nodes []*e2e.Node) (buckets, float64, error) {
	all, total := buckets{}, 0.0
	for _, n := range nodes {
		m, err := n.Kube.ProxyMetrics(ctx)
		if err != nil {
			return nil, 0, err
		}
		b, s := histogramOf(m, proxyProgramming)
		all.add(b, 1)
		total += s
	}
	return all, total, nil
}

// draindHistogram reads draind's network-programming histogram
// (EndpointSlice trigger) from its metrics endpoint on p's node.
func (p *draindProc) draindHistogram(ctx context.Context) (buckets, float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: netnsDialer{p.node.NS.Do}.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:9461/metrics", nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("reading draind's metrics on %s: %w", p.node.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, 0, err
	}
	series := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		line = strings.TrimSpace(line)
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			series[line[:i]] = v
		}
	}
	b, total := histogramOf(series, draindProgramming, `trigger="endpointslice"`)
	return b, total, nil
}

// measureProgramming starts measuring a draind variant: it returns what
// to call, with draind still running, when the variant ends; that records
// the variant's Programming (kube-proxy's counted from now on).
func (c *Cluster) measureProgramming(ctx context.Context, variant string, procs *[]*draindProc) (func() error, error) {
	before, beforeSum, err := proxyHistograms(ctx, c.nodes)
	if err != nil {
		return nil, err
	}
	return func() error {
		p := Programming{Variant: variant, Draind: buckets{}}
		for _, d := range *procs {
			b, s, err := d.draindHistogram(context.Background())
			if err != nil {
				return err
			}
			p.Draind.add(b, 1)
			p.DraindSum += s
		}
		after, afterSum, err := proxyHistograms(context.Background(), c.nodes)
		if err != nil {
			return err
		}
		after.add(before, -1)
		p.KubeProxy, p.KubeProxySum = after, afterSum-beforeSum
		c.mu.Lock()
		c.programming = append(c.programming, p)
		c.mu.Unlock()
		return nil
	}, nil
}

// Programming returns the network-programming latency of every draind
// variant run so far.
func (c *Cluster) Programming() []Programming {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Programming(nil), c.programming...)
}
