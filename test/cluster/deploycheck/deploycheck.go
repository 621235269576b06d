// Package deploycheck checks what draind ships for operators: the kustomize
// base in deploy/daemonset (rendering, strict decoding, validation by a real
// kube-apiserver, RBAC that is both sufficient and minimal), the PromQL of
// its dashboard and alert rules against the metrics a running daemon
// actually exports, and the Dockerfile's static build.
//
// The helpers here are also meant for other tests of the cluster bed that
// need the shipped manifests (for example to run draind with exactly the
// DaemonSet's RBAC).
//
// Words are defined in the repository's docs/glossary.md.
package deploycheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	promcrd "github.com/prometheus-operator/prometheus-operator/example"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/test/cluster/draindbin"
)

// InstallMonitoringCRDs installs the PodMonitor and PrometheusRule CRDs
// that ship with the prometheus-operator release whose Go types this module
// uses (the base's monitoring.yaml needs them), and waits until they serve.
func InstallMonitoringCRDs(ctx context.Context, cfg *rest.Config) error {
	var all bytes.Buffer
	if err := promcrd.PrintAll(&all); err != nil {
		return fmt.Errorf("reading the prometheus-operator CRDs: %w", err)
	}
	cs, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	want := map[string]bool{"podmonitors.monitoring.coreos.com": true, "prometheusrules.monitoring.coreos.com": true}
	var names []string
	for _, doc := range strings.Split(all.String(), "\n---\n") {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(doc), &crd); err != nil {
			return fmt.Errorf("decoding a prometheus-operator CRD: %w", err)
		}
		if !want[crd.Name] {
			continue
		}
		if _, err := cs.ApiextensionsV1().CustomResourceDefinitions().Create(ctx, &crd, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		names = append(names, crd.Name)
	}
	if len(names) != len(want) {
		return fmt.Errorf("found CRDs %v in the prometheus-operator module, want %v", names, want)
	}
	for _, n := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			crd, err := cs.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for CRD %s to be established: %w", n, err)
		}
	}
	return nil
}

// BaseDir returns the directory of the kustomize base, deploy/daemonset.
func BaseDir() (string, error) {
	root, err := draindbin.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "daemonset"), nil
}

// Render runs kustomize (the library kubectl apply -k embeds) on dir and
// returns the rendered objects in kustomize's order.
func Render(dir string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		// Through JSON, so numbers become the int64/float64 the API
		// machinery expects (kustomize's maps hold int).
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("encoding %s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", r.CurId(), err)
		}
		out = append(out, u)
	}
	return out, nil
}

// Scheme knows every kind the base may contain: the Kubernetes API types of
// the client-go this module builds against, and the prometheus-operator's
// monitoring.coreos.com/v1.
func Scheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering kubernetes types: %w", err)
	}
	if err := monitoringv1.AddToScheme(s); err != nil {
		return nil, fmt.Errorf("registering monitoring.coreos.com/v1 types: %w", err)
	}
	return s, nil
}

// DecodeStrict decodes one object into its typed Go struct, failing on
// unknown or duplicate fields and on kinds the scheme does not know.
func DecodeStrict(s *runtime.Scheme, obj *unstructured.Unstructured) (runtime.Object, error) {
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", Describe(obj), err)
	}
	ser := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s, kjson.SerializerOptions{Strict: true})
	gvk := obj.GroupVersionKind()
	if !s.Recognizes(gvk) {
		return nil, fmt.Errorf("decoding %s: kind %s is not a known API type", Describe(obj), gvk)
	}
	out, _, err := ser.Decode(data, &gvk, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding %s strictly: %w", Describe(obj), err)
	}
	return out, nil
}

// Describe names an object as kubectl would: kind/namespace/name.
func Describe(obj *unstructured.Unstructured) string {
	if ns := obj.GetNamespace(); ns != "" {
		return obj.GetKind() + "/" + ns + "/" + obj.GetName()
	}
	return obj.GetKind() + "/" + obj.GetName()
}

// Find returns the rendered object of kind and name, or nil.
func Find(objs []*unstructured.Unstructured, gk schema.GroupKind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() == gk && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Query is one PromQL expression shipped to operators, and where it is.
type Query struct {
	Where string // "dashboard panel \"...\" target A", "rule DraindDown", ...
	Expr  string // as written, before Grafana variables are substituted
}

// grafanaIntervals are Grafana's built-in range variables: they stand for
// durations, so they become one to keep the expression parseable.
var grafanaIntervals = regexp.MustCompile(`\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}`)

// grafanaVar is any other dashboard variable ($node, ${node}, [[node]]).
var grafanaVar = regexp.MustCompile(`\$\{[A-Za-z0-9_]+(:[a-z]+)?\}|\$[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z0-9_]+\]\]`)

// labelValues matches Grafana's label_values(selector, label) and
// label_values(label) variable queries.
var labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*(?:,\s*([A-Za-z_][A-Za-z0-9_]*)\s*)?\)\s*$`)

// ExpandGrafana turns a dashboard expression into plain PromQL: range
// variables become 5m and other variables the regexp .* (they are used in
// =~ matchers). A variable anywhere else leaves something the parser
// rejects, which is the point.
func ExpandGrafana(expr string) string {
	expr = grafanaIntervals.ReplaceAllString(expr, "5m")
	return grafanaVar.ReplaceAllString(expr, ".*")
}

// DashboardQueries returns every PromQL expression of a Grafana dashboard:
// panel targets (also inside collapsed rows) and the PromQL of query
// variables. label_values(selector, label) contributes its selector;
// label_values(label) has none and contributes nothing.
func DashboardQueries(dashboard []byte) ([]Query, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, fmt.Errorf("decoding dashboard: %w", err)
	}
	var out []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if strings.TrimSpace(t.Expr) != "" {
					out = append(out, Query{Where: fmt.Sprintf("dashboard panel %q target %s", p.Title, t.RefID), Expr: t.Expr})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, err := variableQuery(v.Query)
		if err != nil {
			return nil, fmt.Errorf("dashboard variable %s: %w", v.Name, err)
		}
		where := fmt.Sprintf("dashboard variable %s", v.Name)
		if m := labelValues.FindStringSubmatch(q); m != nil {
			if m[2] == "" {
				continue // label_values(label): no selector
			}
			out = append(out, Query{Where: where, Expr: m[1]})
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(q), "query_result(") {
			inner := strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(q), "query_result("), ")")
			out = append(out, Query{Where: where, Expr: inner})
			continue
		}
		return nil, fmt.Errorf("dashboard variable %s: query %q is neither label_values(...) nor query_result(...)", v.Name, q)
	}
	return out, nil
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

// variableQuery reads a variable's query, a string in older dashboards and
// an object {"query": "..."} in newer ones.
func variableQuery(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("query is neither a string nor an object: %w", err)
	}
	return o.Query, nil
}

// RuleQueries returns the expression of every rule of a PrometheusRule.
func RuleQueries(pr *monitoringv1.PrometheusRule) []Query {
	var out []Query
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			name := r.Alert
			if name == "" {
				name = r.Record
			}
			out = append(out, Query{Where: fmt.Sprintf("rule group %s rule %s", g.Name, name), Expr: r.Expr.String()})
		}
	}
	return out
}

// Parser is the PromQL parser the checks use: Prometheus' own, with its
// default (non-experimental) language.
var Parser = parser.NewParser(parser.Options{})

// MetricNames parses a PromQL expression and returns the metric names its
// vector and matrix selectors read, sorted. A selector without a fixed
// metric name (e.g. {__name__=~"draind_.*"}) is an error: nothing could
// check it.
func MetricNames(expr string) ([]string, error) {
	e, err := Parser.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parsing %q: %w", expr, err)
	}
	set := map[string]bool{}
	var errs []error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" && name == "" && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			errs = append(errs, fmt.Errorf("selector %s in %q names no metric", vs.String(), expr))
			return nil
		}
		set[name] = true
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	return names, nil
}

// Exported is the set of metric names a scrape exposes, with the series
// names histograms and summaries add (_bucket, _sum, _count).
type Exported map[string]bool

// ParseExposition reads a Prometheus text exposition (what /metrics
// serves) and returns its metric families and the names they export.
func ParseExposition(r io.Reader) (map[string]*dto.MetricFamily, Exported, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the exposition: %w", err)
	}
	ex := Exported{}
	for name, mf := range mfs {
		ex[name] = true
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				ex[name+s] = true
			}
		case dto.MetricType_SUMMARY:
			for _, s := range []string{"_sum", "_count"} {
				ex[name+s] = true
			}
		}
	}
	return mfs, ex, nil
}

// PrometheusProvided are series Prometheus writes itself for every target.
var PrometheusProvided = map[string]bool{
	"up": true, "scrape_duration_seconds": true, "scrape_samples_scraped": true,
	"scrape_samples_post_metric_relabeling": true, "scrape_series_added": true,
}

// Unknown returns the metric names of q that neither the scrape nor
// Prometheus itself provides.
func (ex Exported) Unknown(q Query, expand bool) ([]string, error) {
	expr := q.Expr
	if expand {
		expr = ExpandGrafana(expr)
	}
	names, err := MetricNames(expr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", q.Where, err)
	}
	var unknown []string
	for _, n := range names {
		if !ex[n] && !PrometheusProvided[n] {
			unknown = append(unknown, n)
		}
	}
	return unknown, nil
}
