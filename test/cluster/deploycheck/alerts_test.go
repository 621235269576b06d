package deploycheck

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/test/cluster/draindbin"
)

// promtool returns the path of Prometheus' promtool (Debian package
// prometheus, installed by test/deps.sh). Without it the test skips,
// except under PRIVILEGED_TESTS=1 (CI), where it fails.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("PRIVILEGED_TESTS") == "1" {
			t.Fatalf("promtool not found (test/deps.sh installs the Debian package prometheus): %v", err)
		}
		t.Skipf("SKIP: promtool not found (apt-get install prometheus, or test/deps.sh): %v", err)
	}
	return p
}

// alertTests is the part of a promtool unit-test file the coverage check
// reads.
type alertTests struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestAlertRules checks the alerting rules with Prometheus' own tools:
// `promtool check rules` on the rule file the chart ships and on the
// groups of the kustomize base's PrometheusRule, and `promtool test rules`
// on deploy/alerts/draind_test.yaml, whose cases must cover every alert
// both firing and staying silent.
func TestAlertRules(t *testing.T) {
	bin := promtool(t)
	root, err := draindbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	chartRules := filepath.Join(root, "deploy", "helm", "draind", "files", "draind.rules.yaml")
	objs := rendered(t)
	pr := only[*monitoringv1.PrometheusRule](t, typed(t, objs), "draind")
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	baseRules := filepath.Join(t.TempDir(), "base.rules.yaml")
	if err := os.WriteFile(baseRules, spec, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{chartRules, baseRules} {
		out, err := exec.Command(bin, "check", "rules", f).CombinedOutput()
		if err != nil {
			t.Errorf("promtool check rules %s: %v\n%s", f, err, out)
		}
	}

	testFile := filepath.Join(root, "deploy", "alerts", "draind_test.yaml")
	cmd := exec.Command(bin, "test", "rules", testFile)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules %s: %v\n%s", testFile, err, out)
	} else if !strings.Contains(string(out), "SUCCESS") {
		t.Errorf("promtool test rules %s printed no SUCCESS:\n%s", testFile, out)
	}

	b, err := os.ReadFile(testFile)
	if err != nil {
		t.Fatal(err)
	}
	var tests alertTests
	if err := yaml.Unmarshal(b, &tests); err != nil {
		t.Fatalf("decoding %s: %v", testFile, err)
	}
	if len(tests.RuleFiles) != 1 || filepath.Clean(filepath.Join(filepath.Dir(testFile), tests.RuleFiles[0])) != chartRules {
		t.Errorf("%s tests rule files %v, want only the chart's %s", testFile, tests.RuleFiles, chartRules)
	}
	fires, silent := map[string]int{}, map[string]int{}
	for _, tc := range tests.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname]++
			} else {
				silent[a.Alertname]++
			}
		}
	}
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if fires[r.Alert] == 0 || silent[r.Alert] == 0 {
				t.Errorf("alert %s: %d cases where it fires and %d where it stays silent; want at least one of each", r.Alert, fires[r.Alert], silent[r.Alert])
			}
		}
	}
}
