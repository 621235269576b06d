package conntrack

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/test/bed"
)

// BenchmarkExpire compares draind's expiry of one endpoint with
// `conntrack -D -r <ip>` (conntrack-tools) on the same table: 1,000,000
// flows, 10,000 of them with the endpoint as reply source.
//
// draind's side runs in a child process (this test binary re-executed), so
// its peak RSS is attributable to the expiry alone: the child reports its
// own VmHWM. (rusage maxrss would not do: Go starts children with
// CLONE_VM|CLONE_VFORK, so the child's maxrss includes the parent's
// high-water mark up to the exec, and the parent has just filled a table.)
// Both sides are timed as whole processes, start-up included.
// After each side the table is checked: exactly the endpoint's 10,000 flows
// are gone and the other 990,000 are still there.
//
//	PRIVILEGED_TESTS=1 go test ./conntrack -run '^$' -bench BenchmarkExpire
//
// -expire.flows makes the table smaller (CI runs a short form); the
// endpoint's share stays 10,000 flows.
func BenchmarkExpire(b *testing.B) {
	bed.RequirePrivileged(b)
	if _, err := exec.LookPath("conntrack"); err != nil {
		b.Skip("SKIP: conntrack-tools (the baseline) is not installed: " + err.Error())
	}
	total := *expireFlows
	const epN = 10_000
	if total <= epN {
		b.Fatalf("-expire.flows %d: the table needs more than the endpoint's %d", total, epN)
	}
	raiseConntrackLimits(b, 2*total, 1<<20)
	ns := testNS(b)

	start := time.Now()
	if err := createFlows(ns.Path(), total, 3600, benchFlow); err != nil {
		b.Fatal(err)
	}
	if got := tableCount(b, ns); got != total {
		b.Fatalf("table has %d flows after creating %d", got, total)
	}
	b.Logf("filled %d flows in %v", total, time.Since(start))

	check := func(side string) {
		b.Helper()
		if got := tableCount(b, ns); got != total-epN {
			b.Fatalf("after %s the table has %d flows, want %d", side, got, total-epN)
		}
		ct, err := Open(Options{NetNS: ns.Path()})
		if err != nil {
			b.Fatal(err)
		}
		defer ct.Close()
		c, err := ct.Count(context.Background(), benchEP)
		if err != nil {
			b.Fatal(err)
		}
		if c != (Counts{}) {
			b.Fatalf("after %s the endpoint still has flows: %+v", side, c)
		}
	}
	refill := func() {
		b.Helper()
		if err := createFlows(ns.Path(), epN, 3600, benchFlow); err != nil {
			b.Fatal(err)
		}
		if got := tableCount(b, ns); got != total {
			b.Fatalf("table has %d flows after the refill, want %d", got, total)
		}
	}

	var draindS, toolsS, inprocS float64
	var rssKB int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i > 0 {
			refill()
		}
		r := runBenchChild(b, ns)
		if r.Deleted != epN {
			b.Fatalf("draind deleted %d flows, want %d", r.Deleted, epN)
		}
		check("draind")
		draindS += r.wall.Seconds()
		inprocS += r.Seconds
		rssKB = max(rssKB, r.PeakRSSKB)

		refill()
		cmd := ns.Command("conntrack", "-D", "-r", benchEP.String())
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = nil, &stderr // stdout (one line per flow) to /dev/null
		t0 := time.Now()
		err := cmd.Run()
		toolsS += time.Since(t0).Seconds()
		if err != nil {
			b.Fatalf("conntrack -D: %v: %s", err, stderr.String())
		}
		if m := regexp.MustCompile(`(\d+) flow entries have been deleted`).FindStringSubmatch(stderr.String()); m == nil || m[1] != strconv.Itoa(epN) {
			b.Fatalf("conntrack -D said %q, want %d deleted", strings.TrimSpace(stderr.String()), epN)
		}
		check("conntrack-tools")
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(draindS/n, "draind-s")
	b.ReportMetric(inprocS/n, "draind-inproc-s")
	b.ReportMetric(toolsS/n, "conntrack-tools-s")
	b.ReportMetric(draindS/toolsS, "ratio")
	b.ReportMetric(float64(rssKB)/1024, "rss-MB")
}

var expireFlows = flag.Int("expire.flows", 1_000_000, "flows in BenchmarkExpire's table")

var (
	benchEP  = netip.MustParseAddr("10.244.0.77")
	benchVIP = netip.MustParseAddr("10.96.0.10")
)

// benchFlow is flow i of the benchmark table. Flows 0..9,999 belong to the
// endpoint (half TCP to :8080 via the VIP, half UDP to :5353); the rest are
// spread over 4096 other pods. Every flow has its own client address.
func benchFlow(i int) Flow {
	cl := netip.AddrFrom4([4]byte{10, byte(128 + i>>16), byte(i >> 8), byte(i)})
	sport := uint16(1024 + i%60000)
	ep, proto, vport, eport := benchEP, TCP, uint16(80), uint16(8080)
	if i%2 == 1 {
		proto, vport, eport = UDP, 53, 5353
	}
	if i >= 10_000 {
		ep = netip.AddrFrom4([4]byte{10, 200, byte(i >> 8 & 15), byte(i)})
	}
	return Flow{
		Proto: proto, State: TCPEstablished,
		Orig:  Tuple{Src: netip.AddrPortFrom(cl, sport), Dst: netip.AddrPortFrom(benchVIP, vport)},
		Reply: Tuple{Src: netip.AddrPortFrom(ep, eport), Dst: netip.AddrPortFrom(cl, sport)},
	}
}

// raiseConntrackLimits lifts the (global, init-namespace) table limit and
// hash size for the benchmark and restores them afterwards.
func raiseConntrackLimits(tb testing.TB, maxFlows, buckets int) {
	tb.Helper()
	for _, s := range []struct {
		path string
		want int
	}{
		{"/proc/sys/net/netfilter/nf_conntrack_max", maxFlows},
		{"/proc/sys/net/netfilter/nf_conntrack_buckets", buckets},
	} {
		old, err := os.ReadFile(s.path)
		if err != nil {
			tb.Fatal(err)
		}
		cur, err := strconv.Atoi(strings.TrimSpace(string(old)))
		if err != nil {
			tb.Fatal(err)
		}
		if cur >= s.want {
			continue
		}
		if err := os.WriteFile(s.path, []byte(strconv.Itoa(s.want)), 0); err != nil {
			tb.Fatalf("raising %s: %v", s.path, err)
		}
		tb.Cleanup(func() {
			if err := os.WriteFile(s.path, old, 0); err != nil {
				tb.Errorf("restoring %s: %v", s.path, err)
			}
		})
	}
}

const envBenchChild = "DRAIND_CT_BENCH_CHILD"

// benchChildResult is what the child reports; wall is measured by the
// parent.
type benchChildResult struct {
	Deleted   int     `json:"deleted"`
	Seconds   float64 `json:"seconds"`     // Open + Expire, inside the child
	PeakRSSKB int64   `json:"peak_rss_kb"` // the child's VmHWM
	wall      time.Duration
}

// runBenchChild re-executes the test binary to expire the endpoint in ns.
func runBenchChild(tb testing.TB, ns *bed.NetNS) benchChildResult {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), envBenchChild+"="+ns.Path())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	t0 := time.Now()
	if err := cmd.Run(); err != nil {
		tb.Fatalf("bench child: %v: %s", err, out.String())
	}
	var r benchChildResult
	r.wall = time.Since(t0)
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		tb.Fatalf("bench child output %q: %v", out.String(), err)
	}
	return r
}

// benchChildMain is the child's side: open the namespace, expire the
// endpoint (both protocols, any port, like `conntrack -D -r`), report.
func benchChildMain() {
	path := os.Getenv(envBenchChild)
	if path == "" {
		return
	}
	t0 := time.Now()
	ct, err := Open(Options{NetNS: path})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	res, err := ct.Expire(context.Background(), []Filter{
		{Proto: TCP, ReplySrc: netip.AddrPortFrom(benchEP, 0)},
		{Proto: UDP, ReplySrc: netip.AddrPortFrom(benchEP, 0)},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	elapsed := time.Since(t0)
	ct.Close()
	peak, err := peakRSSKB()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	json.NewEncoder(os.Stdout).Encode(benchChildResult{Deleted: res.Deleted, Seconds: elapsed.Seconds(), PeakRSSKB: peak})
	os.Exit(0)
}

// peakRSSKB is the calling process's peak resident set since its exec
// (VmHWM in /proc/self/status), in KiB.
func peakRSSKB() (int64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}
