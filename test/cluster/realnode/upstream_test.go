package realnode_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/test/cluster/e2ebin"
	"github.com/draind/draind/test/cluster/files"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
	"github.com/draind/draind/test/cluster/realnode"
)

// The upstream sig-network specs run here, and why the others do not, are
// documented in docs/conformance.md; keep the two in step.
//
// This file's name sorts after the package's other test files, so the
// suite runs last in realnode: the rollout tests before it are waiting on
// grace periods most of the time and run beside the module's other
// packages, and the suite, which keeps both cores busy, runs once most of
// those packages are done instead of beside all of them.
const (
	conformanceFocus = `\[sig-network\] (Services|EndpointSlice|EndpointSliceMirroring|Conntrack|DNS|Connectivity|Networking Granular Checks)|\[sig-network\].*\[Conformance\]`
	conformanceSkip  = `\[Disruptive\]|\[Flaky\]|\[Feature:|\[FeatureGate:|\[Alpha\]|\[Beta\]|\[Provider:|LoadBalancer|ESIPP|IPVS|` +
		`\[sig-network\] DNS configMap`
)

// conformanceProcs is the number of ginkgo processes: the specs mostly
// wait for pods and Services, so six share two cores well. Not more: on a
// loaded machine each spec's kubectl exec slows, and "should fallback to
// local terminating endpoints ... externalTrafficPolicy=Local" must run
// five rounds of three of them within its server's 100 s grace period
// (with seven it once did not, in CI).
const conformanceProcs = 6

// specTimesFile is the longest each spec took in runs on an idle machine:
// conformanceSeed deals the long ones out first.
const specTimesFile = "testdata/conformance-spec-times.txt"

// EnvConformanceSeed sets ginkgo's seed, which decides the specs' order,
// instead of the one conformanceSeed picks.
const EnvConformanceSeed = "DRAIND_CONFORMANCE_SEED"

// EnvConformanceTimes makes TestConformanceSigNetwork fold the spec times
// of its run with draind into specTimesFile (run it alone, on an idle
// machine).
const EnvConformanceTimes = "DRAIND_CONFORMANCE_TIMES"

// withoutDraindFile lists the specs that pass on the bed without draind;
// DRAIND_CONFORMANCE_WITHOUT=1 measures and rewrites it.
const withoutDraindFile = "testdata/conformance-pass-without-draind.txt"

// EnvConformanceWithout makes TestConformanceSigNetwork first run the suite
// without draind (on a bed where it is not installed yet) and rewrite
// withoutDraindFile.
const EnvConformanceWithout = "DRAIND_CONFORMANCE_WITHOUT"

var e2ePrepared sync.Map // *realnode.Multi → true once routed and imported

// TestConformanceSigNetwork runs the upstream Kubernetes e2e suite's
// sig-network specs (Services, EndpointSlice, EndpointSliceMirroring,
// Conntrack, connectivity, and every sig-network [Conformance] spec) on the
// shared 3-node bed with draind's DaemonSet installed at its defaults and
// Ready. It fails if a spec that passes without draind (withoutDraindFile)
// does not pass with it.
func TestConformanceSigNetwork(t *testing.T) {
	requireRealNode(t)
	bins := e2eBinaries(t)
	b := sharedMultiBed(t)
	e2eDir := filepath.Join(b.m.Dir, "e2e-with-draind")
	t.Cleanup(func() {
		if t.Failed() {
			keepForDiagnosis(t, b.m, e2eDir)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Hour)
	defer cancel()
	// The suite runs in the mode the bed starts in, the mode
	// withoutDraindFile was measured in, whichever mode the rollout tests
	// before it left kube-proxy in.
	if err := b.m.SetProxyMode(ctx, realnode.ProxyIPTables); err != nil {
		t.Fatal(err)
	}
	prepareE2E(ctx, t, b.m, bins)
	cfg := realnode.E2EConfig{Bins: bins, Kubectl: kube.Binaries(t).Path(kubebin.Kubectl), Focus: conformanceFocus, Skip: conformanceSkip, Procs: conformanceProcs}
	times := readSpecTimes(t)
	cfg.Seed = conformanceSeed(ctx, t, b.m, cfg, times)
	if os.Getenv(EnvConformanceWithout) == "1" {
		if b.installed {
			t.Fatalf("draind is already installed on the shared bed; run TestConformanceSigNetwork alone to measure without it")
		}
		cfg.Dir = filepath.Join(b.m.Dir, "e2e-without-draind")
		res := runE2E(ctx, t, b.m, cfg, "without draind")
		if err := writeSpecList(withoutDraindFile, res.Passed); err != nil {
			t.Fatal(err)
		}
	}
	want, err := readSpecList(withoutDraindFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatalf("%s lists no spec: nothing to compare with (measure it with %s=1)", withoutDraindFile, EnvConformanceWithout)
	}
	b.install(ctx, t)
	cfg.Dir = e2eDir
	res := runE2E(ctx, t, b.m, cfg, "with draind")
	if os.Getenv(EnvConformanceTimes) == "1" {
		if err := realnode.WriteSpecTimes(specTimesFile, specTimesHeader, times.Fold(res.Specs)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range want {
		if !slices.Contains(res.Passed, s) {
			t.Errorf("passes without draind, not with it: %s (%s)", s, res.Why[s])
		}
	}
}

// keepForDiagnosis copies the suite's files (if it ran) and every node's
// logs out of the bed, which the package's last test removes, and says
// where.
func keepForDiagnosis(t *testing.T, m *realnode.Multi, e2eDir string) {
	t.Helper()
	dst, err := os.MkdirTemp("", "draind-conformance-failed-")
	if err != nil {
		t.Logf("keeping the logs: %v", err)
		return
	}
	err = m.KeepLogs(filepath.Join(dst, "nodes"))
	if _, serr := os.Stat(e2eDir); serr == nil {
		err = errors.Join(err, files.CopyTree(filepath.Join(dst, "e2e"), e2eDir))
	}
	if err != nil {
		t.Logf("keeping the logs (kept what could be): %v", err)
	}
	t.Logf("the suite's log and the nodes' logs (kube-proxy, kubelet, draind's pods) are kept in %s", dst)
}

// specTimesHeader heads specTimesFile.
var specTimesHeader = []string{
	"The longest each upstream spec that TestConformanceSigNetwork runs took, over",
	"runs alone on an idle 2-core machine with draind installed (6 processes). The",
	"test picks the seed whose order deals the long ones out first",
	"(realnode.PickSeed). " + EnvConformanceTimes + "=1 folds a run's times in.",
}

func readSpecTimes(t *testing.T) realnode.SpecTimes {
	t.Helper()
	st, err := realnode.ReadSpecTimesFile(specTimesFile)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// conformanceSeed returns the seed the suite runs with: the first whose
// order, by the spec times, leaves no long spec to the end (the same seed
// for one build of the suite), or EnvConformanceSeed's.
func conformanceSeed(ctx context.Context, t *testing.T, m *realnode.Multi, cfg realnode.E2EConfig, st realnode.SpecTimes) int64 {
	t.Helper()
	if v := os.Getenv(EnvConformanceSeed); v != "" {
		seed, err := strconv.ParseInt(v, 10, 64)
		if err != nil || seed == 0 {
			t.Fatalf("%s=%q: want a seed other than 0", EnvConformanceSeed, v)
		}
		t.Logf("conformance figures: seed %d, from %s", seed, EnvConformanceSeed)
		return seed
	}
	cfg.Dir = filepath.Join(m.Dir, "e2e-order")
	c, err := m.PickSeed(ctx, cfg, st, 40)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conformance figures: seed %d (of %d tried): %v by %s for its order, %v at best",
		c.Seed, c.Tried, c.Makespan.Round(time.Second), specTimesFile, c.Bound.Round(time.Second))
	return c.Seed
}

func e2eBinaries(t *testing.T) *e2ebin.Set {
	t.Helper()
	start := time.Now()
	set, err := e2ebin.Ensure(context.Background(), kube.TestLogger(t))
	if err != nil {
		t.Fatalf("building the e2e suite: %v", err)
	}
	t.Logf("e2e suite and agnhost %s ready in %v (%s)", set.Version, time.Since(start).Round(time.Millisecond), set.Dir)
	return set
}

// prepareE2E routes the bed for the suite, starts its cluster DNS and
// imports the suite's images on every node, once per bed.
func prepareE2E(ctx context.Context, t *testing.T, m *realnode.Multi, bins *e2ebin.Set) {
	t.Helper()
	if _, done := e2ePrepared.Load(m); done {
		return
	}
	start := time.Now()
	if err := m.RouteForE2E(ctx); err != nil {
		t.Fatal(err)
	}
	// The DNS serves as long as this process: the bed is shared, and it
	// outlives this test.
	if _, err := m.StartClusterDNS(context.Background(), bins.Path(e2ebin.CoreDNS)); err != nil {
		t.Fatal(err)
	}
	archive, err := realnode.BuildE2EImages(ctx, filepath.Join(m.Dir, "e2e-images"), bins)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range m.Nodes {
		if err := n.ImportImages(ctx, archive); err != nil {
			t.Fatal(err)
		}
	}
	e2ePrepared.Store(m, true)
	t.Logf("conformance figures: routes and e2e images (%s) on %d nodes in %v",
		strings.Join(realnode.E2EImages(), ", "), len(m.Nodes), time.Since(start).Round(time.Millisecond))
}

func runE2E(ctx context.Context, t *testing.T, m *realnode.Multi, cfg realnode.E2EConfig, what string) *realnode.E2EResult {
	t.Helper()
	res, err := m.RunE2E(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("conformance figures %s: ran %d, passed %d, failed %d, skipped %d in %v (log %s)",
		what, res.Ran(), len(res.Passed), len(res.Failed), len(res.Skipped), res.Took.Round(time.Second), res.Log)
	for _, s := range res.Failed {
		t.Logf("failed %s: %s %s", what, s, res.Detail[s])
	}
	logSlowestSpecs(t, what, res, 10)
	return res
}

// logSlowestSpecs shows the n specs that ran longest and what all of them
// took together: their sum over the run's length is how many of the
// suite's processes were busy on average, so a slow run shows whether a
// few specs or the whole machine held it up.
func logSlowestSpecs(t *testing.T, what string, res *realnode.E2EResult, n int) {
	t.Helper()
	var sum time.Duration
	for _, s := range res.Specs {
		sum += s.Took
	}
	if res.Took <= 0 || len(res.Specs) == 0 {
		return
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "conformance figures %s: specs ran %v in all, %.1f at a time on average; the slowest:",
		what, sum.Round(time.Second), sum.Seconds()/res.Took.Seconds())
	for _, s := range res.Specs[:min(n, len(res.Specs))] {
		fmt.Fprintf(&sb, "\n| %v | %s |", s.Took.Round(100*time.Millisecond), s.Name)
	}
	t.Log(sb.String())
}

func readSpecList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the specs that pass without draind (measure with %s=1): %w", EnvConformanceWithout, err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out, sc.Err()
}

func writeSpecList(path string, specs []string) error {
	var sb strings.Builder
	sb.WriteString("# Upstream sig-network e2e specs that pass on the 3-node bed without draind.\n")
	sb.WriteString("# TestConformanceSigNetwork fails if one of them does not pass with draind.\n")
	sb.WriteString("# Rewritten by running the test alone with " + EnvConformanceWithout + "=1.\n")
	for _, s := range specs {
		sb.WriteString(s + "\n")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}
