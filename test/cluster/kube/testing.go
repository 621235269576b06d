package kube

import (
	"context"
	"log/slog"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/draind/draind/test/cluster/kubebin"
)

// EnvPrivileged is the switch for the expensive tiers of tests (the same one
// test/bed uses for root-only tests): with it set, missing Kubernetes
// binaries are built instead of skipping.
const EnvPrivileged = "PRIVILEGED_TESTS"

// Binaries returns the Kubernetes binaries for a test. If they are not cached
// yet it builds them when PRIVILEGED_TESTS=1 (printing that this takes
// minutes) and otherwise skips the test, saying how to get them.
func Binaries(tb testing.TB) *kubebin.Set {
	tb.Helper()
	set, ok, err := kubebin.Cached()
	if err != nil {
		tb.Fatalf("looking for cached Kubernetes binaries: %v", err)
	}
	if ok {
		return set
	}
	if os.Getenv(EnvPrivileged) != "1" {
		tb.Skipf("SKIP: needs kube-apiserver, kube-controller-manager and kube-proxy %s built: "+
			"run `go run ./cmd/kubebuild` in test/cluster (cold build 7-15 min), or set %s=1 to build them here",
			kubebin.Version, EnvPrivileged)
	}
	tb.Logf("this test needs kube-apiserver, kube-controller-manager and kube-proxy %s; they are not cached, building them now (cold build 7-15 min on 2 cores, ~30 s with a warm Go build cache)", kubebin.Version)
	start := time.Now()
	set, err = kubebin.Ensure(context.Background(), TestLogger(tb))
	if err != nil {
		tb.Fatalf("building Kubernetes binaries: %v", err)
	}
	tb.Logf("built Kubernetes binaries in %v", time.Since(start).Round(time.Second))
	return set
}

// TestLogger is a slog logger writing to the test's output.
func TestLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// EnvKeepDir names a directory for StartT to keep the cluster's files in
// (component logs, certificates, etcd data) instead of a temporary directory
// removed at the end: for debugging a run.
const EnvKeepDir = "DRAIND_CLUSTER_DIR"

// StartT starts a cluster for a test (binaries from Binaries, logging to the
// test) and stops it when the test ends; if the test failed, the tails of
// the component logs are printed first.
func StartT(tb testing.TB, cfg Config) *Cluster {
	tb.Helper()
	if d := os.Getenv(EnvKeepDir); d != "" && cfg.Dir == "" {
		dir, err := os.MkdirTemp(d, tb.Name()+"-")
		if err != nil {
			tb.Fatalf("creating cluster directory under %s=%s: %v", EnvKeepDir, d, err)
		}
		tb.Logf("keeping cluster files in %s", dir)
		cfg.Dir = dir
	}
	if cfg.Binaries == nil {
		cfg.Binaries = Binaries(tb)
	}
	if cfg.Log == nil {
		cfg.Log = TestLogger(tb)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatalf("starting cluster: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			tails := c.LogTails(40)
			names := make([]string, 0, len(tails))
			for n := range tails {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				tb.Logf("--- last lines of %s:\n%s", n, tails[n])
			}
		}
		if err := c.Stop(); err != nil {
			tb.Errorf("stopping cluster: %v", err)
		}
	})
	return c
}
