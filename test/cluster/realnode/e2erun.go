package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/test/cluster/e2ebin"
)

// RouteForE2E adds what the upstream e2e suite needs of the network beyond
// the rollout tests': each node reaches the other nodes' addresses (their
// InternalIPs, which NodePort specs dial) over the fabric, from its own
// InternalIP (specs check the client address is preserved), and the host's
// namespace, where the apiserver runs, reaches every node's pods over the
// node's link (the apiserver's pod and service proxy, which the Proxy specs
// use). What kube-proxy masquerades towards another node leaves as the
// node's InternalIP too, as on a node with one interface (a node's own
// connection to its ExternalTrafficPolicy=Local NodePort must reach the
// endpoint from the node's address). Nothing of it leaves the machine.
// Calling it again is harmless.
func (m *Multi) RouteForE2E(ctx context.Context) error {
	var steps [][]string
	for i, n := range m.Nodes {
		steps = append(steps, []string{"ip", "route", "replace", nodePodCIDR(i), "via", n.NodeIP.String()})
		for j, o := range m.Nodes {
			if i != j {
				steps = append(steps, []string{"ip", "-n", filepath.Base(n.NetnsPath), "route", "replace", o.NodeIP.String() + "/32",
					"via", fabricIP(j).String(), "dev", "eth1", "src", n.NodeIP.String()})
			}
		}
	}
	if err := runSteps(ctx, "routing for the e2e suite", steps); err != nil {
		return err
	}
	for _, n := range m.Nodes {
		// Ahead of kube-proxy's MASQUERADE, which would take eth1's
		// fabric address: the first NAT rule that matches decides.
		rule := []string{"POSTROUTING", "-o", "eth1", "-m", "mark", "--mark", kubeProxyMasqMark + "/" + kubeProxyMasqMark,
			"-j", "SNAT", "--to-source", n.NodeIP.String()}
		ns := filepath.Base(n.NetnsPath)
		if _, err := run(ctx, ns, "iptables", append([]string{"-w", "-t", "nat", "-C"}, rule...)...); err == nil {
			continue
		}
		if _, err := run(ctx, ns, "iptables", append([]string{"-w", "-t", "nat", "-I", rule[0], "1"}, rule[1:]...)...); err != nil {
			return fmt.Errorf("masquerading to the node's address: %w", err)
		}
	}
	return nil
}

// kubeProxyMasqMark is the mark kube-proxy sets on connections it
// masquerades (its default masquerade bit, 14).
const kubeProxyMasqMark = "0x4000"

// E2EConfig is one run of the e2e suite against a Multi.
type E2EConfig struct {
	Bins    *e2ebin.Set
	Kubectl string // the bed's kubectl (--kubectl-path)
	Focus   string // ginkgo focus regular expression
	Skip    string // ginkgo skip regular expression
	Procs   int    // parallel ginkgo processes ([Serial] specs run alone at the end)
	Dir     string // where the report and the log go
	DryRun  bool   // list the specs only, in the order they are dealt (one process)
	Seed    int64  // ginkgo's --seed, which decides the order (0: a random one)
}

// E2EResult is what the suite's JSON report says of a run.
type E2EResult struct {
	Passed, Failed, Skipped []string // spec names, sorted
	// Why is what the report says of a failed or skipped spec (its
	// failure or skip message, cut short); Detail, of a failed spec, where
	// it failed and the end of what it logged, with its steps' times.
	Why    map[string]string
	Detail map[string]string
	// Specs is every spec that ran with its run time, slowest first: with
	// Took, it tells a run slowed by a few long specs from one slowed by
	// the machine.
	Specs []SpecTime
	// Order is the specs that ran, by when they started: in a dry run,
	// the order ginkgo deals them out. (The report does not list them in
	// that order.)
	Order []string
	Took  time.Duration
	Log   string // the suite's output
}

// SpecTime is how long one spec ran.
type SpecTime struct {
	Name string
	Took time.Duration
}

// Ran is the number of specs that ran (passed or failed).
func (r *E2EResult) Ran() int { return len(r.Passed) + len(r.Failed) }

// RunE2E runs the suite against m with the admin kubeconfig, through
// ginkgo, and returns its outcome. A failed spec is no error; a suite that
// did not report is.
func (m *Multi) RunE2E(ctx context.Context, cfg E2EConfig) (*E2EResult, error) {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(cfg.Dir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, cfg.Bins.Path(e2ebin.Ginkgo), m.e2eArgs(cfg)...)
	cmd.Dir = cfg.Dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// If this process dies, ginkgo is told to stop and stops the suite's
	// processes, which would otherwise go on against a dead bed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = time.Minute
	start := time.Now()
	runErr := cmd.Run()
	res, err := readE2EReport(filepath.Join(cfg.Dir, "report.json"))
	if err != nil {
		return nil, fmt.Errorf("the e2e suite (%v, log %s) left no report: %w", runErr, logPath, err)
	}
	res.Took, res.Log = time.Since(start), logPath
	// The report lists every spec of the binary; skipped are those the
	// focus selects that the skip expression or the spec itself skipped.
	if focus, err := regexp.Compile(cfg.Focus); err == nil {
		res.Skipped = slices.DeleteFunc(res.Skipped, func(s string) bool { return !focus.MatchString(s) })
	}
	return res, nil
}

// e2eArgs are ginkgo's arguments: its own, the suite binary, then the
// suite's (the framework's flags).
func (m *Multi) e2eArgs(cfg E2EConfig) []string {
	procs := max(cfg.Procs, 1)
	if cfg.DryRun {
		procs = 1 // ginkgo dry-runs in one process only
	}
	args := []string{
		fmt.Sprintf("--procs=%d", procs), "--focus=" + cfg.Focus, "--skip=" + cfg.Skip,
		"--output-dir=" + cfg.Dir, "--json-report=report.json", "--timeout=3h", "--no-color", "--silence-skips",
	}
	if cfg.DryRun {
		args = append(args, "--dry-run", "-v")
	}
	if cfg.Seed != 0 {
		args = append(args, fmt.Sprintf("--seed=%d", cfg.Seed))
	}
	return append(args, cfg.Bins.Path(e2ebin.Suite), "--",
		"--kubeconfig="+m.Kubeconfig, "--kubectl-path="+cfg.Kubectl,
		// The skeleton provider knows no node count, and specs that need
		// two or more nodes skip unless told.
		"--provider=skeleton", fmt.Sprintf("--num-nodes=%d", len(m.Nodes)), "--minStartupPods=0", "--allowed-not-ready-nodes=0",
		"--cluster-ip-range="+ClusterCIDR, "--e2e-output-dir="+cfg.Dir,
		"--disable-log-dump", "--dump-logs-on-failure=false", "--report-dir="+cfg.Dir)
}

// ginkgoReport is the part of ginkgo's JSON report read here.
type ginkgoReport struct {
	SpecReports []struct {
		ContainerHierarchyTexts []string
		LeafNodeText            string
		LeafNodeType            string
		State                   string
		StartTime               time.Time
		RunTime                 time.Duration // nanoseconds in the report
		Failure                 *struct {
			Message  string
			Location struct {
				FileName   string
				LineNumber int
			}
		}
		CapturedGinkgoWriterOutput string
	}
}

func readE2EReport(path string) (*E2EResult, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var reports []ginkgoReport
	if err := json.Unmarshal(b, &reports); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	res := &E2EResult{Why: map[string]string{}, Detail: map[string]string{}}
	type startedSpec struct {
		name string
		at   time.Time
	}
	var started []startedSpec
	for _, r := range reports {
		for _, s := range r.SpecReports {
			if s.LeafNodeType != "It" {
				continue
			}
			name := strings.Join(append(append([]string{}, s.ContainerHierarchyTexts...), s.LeafNodeText), " ")
			if s.Failure != nil {
				msg := s.Failure.Message
				if len(msg) > 300 {
					msg = msg[:300] + "…"
				}
				res.Why[name] = s.State + ": " + msg
			}
			switch s.State {
			case "skipped", "pending":
				res.Skipped = append(res.Skipped, name)
				continue
			case "passed":
				res.Passed = append(res.Passed, name)
			default:
				res.Failed = append(res.Failed, name)
				if s.Failure != nil {
					res.Detail[name] = fmt.Sprintf("at %s:%d: %s\n%s", filepath.Base(s.Failure.Location.FileName), s.Failure.Location.LineNumber,
						headLines(s.Failure.Message, 10), tailLines(s.CapturedGinkgoWriterOutput, 28))
				}
			}
			res.Specs = append(res.Specs, SpecTime{Name: name, Took: s.RunTime})
			started = append(started, startedSpec{name, s.StartTime})
		}
	}
	for _, l := range [][]string{res.Passed, res.Failed, res.Skipped} {
		sort.Strings(l)
	}
	sort.SliceStable(res.Specs, func(i, j int) bool { return res.Specs[i].Took > res.Specs[j].Took })
	sort.SliceStable(started, func(i, j int) bool { return started[i].at.Before(started[j].at) })
	for _, s := range started {
		res.Order = append(res.Order, s.name)
	}
	return res, nil
}

// headLines returns the first n lines of text.
func headLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// tailLines returns the last n lines of text.
func tailLines(text string, n int) string {
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
