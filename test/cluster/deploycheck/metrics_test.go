package deploycheck

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/k8s"
)

// scrapeDaemon runs a real daemon (fake API, fake datapath, fake conntrack)
// with one drained pod hosted on its node, and returns one scrape of its
// /metrics once the per-pod series are there.
func scrapeDaemon(t *testing.T) []byte {
	t.Helper()
	body, _ := serveDaemon(t)
	return body
}

// serveDaemon is scrapeDaemon, and also returns the URL of the /metrics
// it serves until the test ends.
func serveDaemon(t *testing.T) ([]byte, string) {
	t.Helper()
	const node, appNS, podName = "node-a", "shop", "web-1"
	podUID := types.UID("0b7c6b1e-7d1f-4d0e-9a53-5c1f2a4d0001")
	drainIP := netip.MustParseAddr("10.244.0.7")

	client := fake.NewClientset()
	d, err := daemon.New(daemon.Config{
		Node: node, Namespace: namespace, Version: "deploycheck",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}, client, datapathtest.New(), conntracktest.New())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-runErr:
			if err != nil && ctx.Err() == nil {
				t.Errorf("daemon.Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("daemon.Run did not return 10 s after its context ended")
		}
	})
	d.SetAttached(true)

	// A Service whose endpoint on this node is terminating, the pod behind
	// it, and the pod's drain Lease (as `draind drain` publishes it).
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: appNS},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	ep := func(ip, uid, name, node string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{
			Addresses:  []string{ip},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(true), Terminating: ptr.To(!ready)},
			NodeName:   ptr.To(node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: appNS, Name: name, UID: types.UID(uid)},
		}
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abcde", Namespace: appNS, Labels: map[string]string{discoveryv1.LabelServiceName: "web"},
			Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: time.Now().Add(-time.Second).Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.244.1.5", "0b7c6b1e-7d1f-4d0e-9a53-5c1f2a4d0002", "web-0", "node-b", true),
			ep(drainIP.String(), string(podUID), podName, node, false),
		},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName, Namespace: appNS, UID: podUID},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: drainIP.String(), PodIPs: []corev1.PodIP{{IP: drainIP.String()}}},
	}
	if _, err := client.CoreV1().Services(appNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.DiscoveryV1().EndpointSlices(appNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(appNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	leases := &k8s.Leases{Client: client, Namespace: namespace}
	if _, _, err := leases.Publish(ctx, k8s.DrainRequest{PodNamespace: appNS, PodName: podName, PodUID: podUID,
		IPs: []netip.Addr{drainIP}, Node: node, Reason: k8s.ReasonOperator, Duration: time.Minute}, time.Now()); err != nil {
		t.Fatal(err)
	}

	srv := httptest.NewServer(promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	want := `draind_draining_pod_syns_total{namespace="shop",pod="web-1"}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		body := scrape(t, srv.URL+"/metrics")
		if d.Ready() && bytes.Contains(body, []byte(want)) {
			return body, srv.URL + "/metrics"
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s the daemon is ready=%v and its scrape lacks %s:\n%s", d.Ready(), want, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func scrape(t *testing.T, url string) []byte {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	// The text format: what promlint and the Prometheus text parser read.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping %s: %d %v", url, resp.StatusCode, err)
	}
	return b
}

// shippedQueries returns the PromQL of the dashboard and of the
// PrometheusRule as rendered by kustomize.
func shippedQueries(t *testing.T) (dashboard, rules []Query) {
	t.Helper()
	dir, err := BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "dashboards", "draind.json"))
	if err != nil {
		t.Fatal(err)
	}
	if dashboard, err = DashboardQueries(raw); err != nil {
		t.Fatal(err)
	}
	pr := only[*monitoringv1.PrometheusRule](t, typed(t, rendered(t)), "draind")
	return dashboard, RuleQueries(pr)
}

// TestMetricsAndQueries scrapes a running daemon (the real daemon package,
// its real registry, with a drained pod hosted on its node so the per-pod
// series exist) and checks: the exposition passes promlint; every PromQL
// expression of the dashboard (panel targets and variable queries) and of
// the alert rules parses with Prometheus' parser and reads only metrics the
// scrape exposes (or up, which Prometheus writes); every draind_* metric
// the daemon exports appears on the dashboard.
func TestMetricsAndQueries(t *testing.T) {
	body := scrapeDaemon(t)

	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatalf("promlint: %v", err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}

	_, exported, err := ParseExposition(bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"draind_draining_pod_syns_total", "draind_draining_pod_live_connections",
		"draind_draining_pod_steered_total", "draind_steering_ready", "draind_build_info"} {
		if !exported[m] {
			t.Errorf("the scrape lacks %s", m)
		}
	}

	dash, rules := shippedQueries(t)
	if len(dash) < 20 || len(rules) < 5 {
		t.Fatalf("found %d dashboard and %d rule expressions: the extraction is broken", len(dash), len(rules))
	}
	used := map[string]bool{}
	check := func(qs []Query, grafana bool) {
		for _, q := range qs {
			unknown, err := exported.Unknown(q, grafana)
			if err != nil {
				t.Error(err)
				continue
			}
			if len(unknown) > 0 {
				t.Errorf("%s reads %v, which the daemon does not export: %s", q.Where, unknown, q.Expr)
			}
			expr := q.Expr
			if grafana {
				expr = ExpandGrafana(expr)
			}
			names, _ := MetricNames(expr)
			for _, n := range names {
				used[n] = true
			}
		}
	}
	check(dash, true)
	check(rules, false)
	t.Logf("checked %d dashboard and %d rule expressions against %d exported series names", len(dash), len(rules), len(exported))

	// The key panel: new connections reaching each draining pod.
	if !slices.ContainsFunc(dash, func(q Query) bool {
		return strings.Contains(q.Expr, "rate(draind_draining_pod_syns_total") && strings.Contains(q.Expr, "by (namespace, pod)")
	}) {
		t.Error("no dashboard panel plots rate(draind_draining_pod_syns_total) by (namespace, pod)")
	}
	for name := range exported {
		if !strings.HasPrefix(name, "draind_") || strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_count") {
			continue
		}
		base := strings.TrimSuffix(name, "_bucket")
		if !used[name] && !used[base+"_bucket"] && !used[base] {
			t.Errorf("the daemon exports %s but no dashboard panel or alert shows it", name)
		}
	}

	t.Run("made-up metric is reported", func(t *testing.T) {
		q := Query{Where: "negative", Expr: `sum by (node) (rate(draind_made_up_total{node=~"$node"}[$__rate_interval])) / draind_steering_ready`}
		unknown, err := exported.Unknown(q, true)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(unknown, []string{"draind_made_up_total"}) {
			t.Errorf("unknown = %v, want [draind_made_up_total]", unknown)
		}
	})
	t.Run("made-up metric in a dashboard is reported", func(t *testing.T) {
		raw := []byte(`{"panels":[{"type":"row","title":"r","panels":[{"title":"p","targets":[{"refId":"A","expr":"rate(draind_conections_total[$__rate_interval])"}]}]}],
			"templating":{"list":[{"name":"v","type":"query","query":{"query":"label_values(draind_bulid_info, node)"}}]}}`)
		qs, err := DashboardQueries(raw)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, q := range qs {
			u, err := exported.Unknown(q, true)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, u...)
		}
		slices.Sort(got)
		if !slices.Equal(got, []string{"draind_bulid_info", "draind_conections_total"}) {
			t.Errorf("unknown = %v, want the two misspelt names", got)
		}
	})
	t.Run("unparseable expression is an error", func(t *testing.T) {
		for _, expr := range []string{`rate(draind_connections_total[5m]`, `sum(draind_steering_ready[$interval])`} {
			if _, err := exported.Unknown(Query{Where: "negative", Expr: expr}, true); err == nil {
				t.Errorf("%q parsed", expr)
			}
		}
	})
}
