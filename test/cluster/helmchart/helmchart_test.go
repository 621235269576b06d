package helmchart

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/draind/draind/deploy/release"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/inject"
)

const namespace = "draind-system"

func render(t *testing.T, ns string, values map[string]any) []*unstructured.Unstructured {
	t.Helper()
	objs, err := Render(ns, values)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// byKey indexes objects by Key, failing on duplicates.
func byKey(t *testing.T, objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
	t.Helper()
	m := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		k := Key(o)
		if m[k] != nil {
			t.Fatalf("%s rendered twice", k)
		}
		m[k] = o
	}
	return m
}

// normal turns an object into plain JSON values, so numbers and empty
// collections compare alike whichever renderer produced them.
func normal(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	b, err := json.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHelmMatchesKustomize renders the chart with the Helm SDK and the
// kustomize base (with the webhook components where the values enable the
// webhook) and compares them object by object: the same set of objects,
// each equal field by field once Helm's bookkeeping labels are removed.
func TestHelmMatchesKustomize(t *testing.T) {
	cases := []struct {
		name       string
		values     map[string]any
		components []string
	}{
		{"defaults", nil, nil},
		{"webhook", map[string]any{"webhook": map[string]any{"enabled": true}}, []string{inject.ComponentWebhook}},
		{"webhook with cert-manager",
			map[string]any{"webhook": map[string]any{"enabled": true, "certManager": map[string]any{"enabled": true}}},
			[]string{inject.ComponentWebhook, inject.ComponentCertManager}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			kust, err := inject.RenderOverlay(c.components, "")
			if err != nil {
				t.Fatal(err)
			}
			want := byKey(t, kust)
			got := byKey(t, render(t, namespace, c.values))
			for k, w := range want {
				g := got[k]
				if g == nil {
					t.Errorf("the chart does not render %s", k)
					continue
				}
				g, err := WithoutHelmLabels(g)
				if err != nil {
					t.Error(err)
					continue
				}
				if d := cmp.Diff(normal(t, w), normal(t, g)); d != "" {
					t.Errorf("%s differs from the kustomize base (-kustomize +helm):\n%s", k, d)
				}
			}
			for k := range got {
				if want[k] == nil {
					t.Errorf("the chart renders %s, which the kustomize base does not", k)
				}
			}
			if len(want) < 10 {
				t.Errorf("kustomize rendered only %d objects", len(want))
			}
		})
	}
}

// TestHelmChartVersion: the chart's version and appVersion are the
// release the tree builds, so the default image is the one it was tested
// with.
func TestHelmChartVersion(t *testing.T) {
	dir, err := ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.AppVersion != release.Version || "v"+ch.Metadata.Version != release.Version {
		t.Errorf("chart version %s, appVersion %s; want %s for both", ch.Metadata.Version, ch.Metadata.AppVersion, release.Version)
	}
}

func daemonSet(t *testing.T, objs []*unstructured.Unstructured) *appsv1.DaemonSet {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == "DaemonSet" {
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &ds, true); err != nil {
				t.Fatal(err)
			}
			return &ds
		}
	}
	t.Fatal("no DaemonSet rendered")
	return nil
}

func kinds(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

// TestHelmValues sets each group of values away from its default and
// checks the rendered objects follow, and that every object still decodes
// strictly into its API type.
func TestHelmValues(t *testing.T) {
	vals := map[string]any{
		"image":       map[string]any{"repository": "registry.example/draind", "tag": "v9.9.9"},
		"resources":   map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "256Mi"}, "limits": map[string]any{"memory": "1Gi"}},
		"runFlags":    map[string]any{"log-format": "text", "entry-ttl": "90s", "conntrack": false, "procs": 2, "max-connections": float64(1000000)}, // a values file's numbers are float64
		"ports":       map[string]any{"offline": 19460, "metrics": 19461},
		"namespace":   map[string]any{"create": false},
		"leasePolicy": map[string]any{"validationActions": []any{"Warn", "Audit"}},
		"monitoring": map[string]any{
			"scrapeAnnotations": true,
			"podMonitor":        map[string]any{"enabled": false},
			"prometheusRule":    map[string]any{"labels": map[string]any{"release": "kube-prometheus-stack"}},
			"dashboard":         map[string]any{"enabled": false},
		},
		"webhook": map[string]any{"enabled": true, "replicas": 3},
	}
	objs := render(t, "platform-draind", vals)
	s, err := deploycheck.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetNamespace() != "" && o.GetNamespace() != "platform-draind" {
			t.Errorf("%s is not in the release namespace", Key(o))
		}
		if _, err := deploycheck.DecodeStrict(s, o); err != nil {
			t.Error(err)
		}
	}
	ks := kinds(objs)
	for _, absent := range []string{"Namespace/platform-draind", "PodMonitor/draind", "ConfigMap/draind-dashboard"} {
		if slices.Contains(ks, absent) {
			t.Errorf("%s rendered although disabled", absent)
		}
	}
	for _, present := range []string{"PrometheusRule/draind", "Deployment/draind-webhook", "MutatingWebhookConfiguration/draind-webhook", "ValidatingAdmissionPolicyBinding/draind-drain-lease-holder"} {
		if !slices.Contains(ks, present) {
			t.Errorf("%s not rendered", present)
		}
	}
	ds := daemonSet(t, objs)
	c := ds.Spec.Template.Spec.Containers[0]
	if c.Image != "registry.example/draind:v9.9.9" {
		t.Errorf("image %s", c.Image)
	}
	wantArgs := []string{"run", "--conntrack=false", "--entry-ttl=90s", "--log-format=text", "--max-connections=1000000", "--procs=2"}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args %q, want %q", c.Args, wantArgs)
	}
	if got := c.Resources.Limits.Memory().String(); got != "1Gi" {
		t.Errorf("memory limit %s", got)
	}
	if c.Ports[0].ContainerPort != 19460 || c.Ports[1].ContainerPort != 19461 {
		t.Errorf("ports %v", c.Ports)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["DRAIND_OFFLINE_ADDR"] != ":19460" || env["DRAIND_METRICS_ADDR"] != ":19461" {
		t.Errorf("listen addresses %q %q", env["DRAIND_OFFLINE_ADDR"], env["DRAIND_METRICS_ADDR"])
	}
	ann := ds.Spec.Template.Annotations
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != "19461" || ann["prometheus.io/path"] != "/metrics" {
		t.Errorf("scrape annotations %v", ann)
	}
	for _, o := range objs {
		switch Key(o) {
		case "PrometheusRule.monitoring.coreos.com platform-draind/draind":
			if o.GetLabels()["release"] != "kube-prometheus-stack" {
				t.Errorf("PrometheusRule labels %v", o.GetLabels())
			}
		case "ValidatingAdmissionPolicyBinding.admissionregistration.k8s.io /draind-drain-lease-holder":
			got, _, _ := unstructured.NestedStringSlice(o.Object, "spec", "validationActions")
			if !slices.Equal(got, []string{"Warn", "Audit"}) {
				t.Errorf("validationActions %v", got)
			}
		case "Deployment.apps platform-draind/draind-webhook":
			img := strings.Join(mustStrings(t, o, "spec", "template", "spec", "containers"), " ")
			if !strings.Contains(img, "registry.example/draind:v9.9.9") {
				t.Errorf("webhook images %s", img)
			}
		case "MutatingWebhookConfiguration.admissionregistration.k8s.io /draind-webhook":
			b, _ := json.Marshal(o.Object)
			if strings.Contains(string(b), "draind-system") || !strings.Contains(string(b), `"platform-draind"`) {
				t.Errorf("webhook configuration does not follow the namespace: %s", b)
			}
		}
	}
}

// mustStrings returns every string below a field, depth first.
func mustStrings(t *testing.T, o *unstructured.Unstructured, fields ...string) []string {
	t.Helper()
	v, ok, err := unstructured.NestedFieldNoCopy(o.Object, fields...)
	if err != nil || !ok {
		t.Fatalf("%s: no %v", Key(o), fields)
	}
	var out []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			out = append(out, x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	return out
}

// TestHelmValuesSchema: values.schema.json refuses what would install a
// broken draind, and the Helm SDK reports it before rendering.
func TestHelmValuesSchema(t *testing.T) {
	cases := map[string]map[string]any{
		"unknown value":       {"imag": map[string]any{"tag": "v1"}},
		"latest tag":          {"image": map[string]any{"tag": "latest"}},
		"chart-owned flag":    {"runFlags": map[string]any{"metrics-addr": ":1"}},
		"flag with dashes":    {"runFlags": map[string]any{"--linger": "1m"}},
		"port out of range":   {"ports": map[string]any{"metrics": 70000}},
		"unknown action":      {"leasePolicy": map[string]any{"validationActions": []any{"Block"}}},
		"bad scrape interval": {"monitoring": map[string]any{"podMonitor": map[string]any{"interval": "thirty"}}},
		"webhook fail policy": {"webhook": map[string]any{"failurePolicy": "Maybe"}},
	}
	for name, vals := range cases {
		if _, err := Render(namespace, vals); err == nil || !strings.Contains(err.Error(), "schema") {
			t.Errorf("%s: rendered, or failed for another reason: %v", name, err)
		}
	}
}

// TestHelmLint runs the Helm SDK's lint (`helm lint --strict`) over the
// chart at default values and with the webhook and cert-manager on: no
// message of severity warning or above.
func TestHelmLint(t *testing.T) {
	dir, err := ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	caps, err := Capabilities()
	if err != nil {
		t.Fatal(err)
	}
	for name, vals := range map[string]map[string]any{
		"defaults": {},
		"webhook":  {"webhook": map[string]any{"enabled": true, "certManager": map[string]any{"enabled": true}}},
	} {
		l := action.NewLint()
		l.Strict = true
		l.Namespace = namespace
		l.KubeVersion = &common.KubeVersion{Version: caps.KubeVersion.Version, Major: caps.KubeVersion.Major, Minor: caps.KubeVersion.Minor}
		res := l.Run([]string{dir}, vals)
		for _, m := range res.Messages {
			t.Logf("%s: %s", name, m)
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: lint: %s", name, m)
			}
		}
		for _, err := range res.Errors {
			t.Errorf("%s: lint: %v", name, err)
		}
		if res.TotalChartsLinted != 1 {
			t.Errorf("%s: linted %d charts", name, res.TotalChartsLinted)
		}
	}
}
