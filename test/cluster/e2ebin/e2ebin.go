// Package e2ebin builds the upstream Kubernetes e2e suite's sig-network test
// binary (package conformance/suite: the framework and test/e2e/network,
// compiled with `go test -c -vet=off -tags e2esuite`), agnhost, the suite's
// test server, the Conntrack spec's regression-issue-74839 and the ginkgo
// command that runs the suite in parallel, from the k8s.io/kubernetes module
// this Go module requires, and CoreDNS (package conformance/coredns, from
// the github.com/coredns/coredns module: the bed's cluster DNS and the DNS
// specs' own server), and caches them per Kubernetes version like package
// kubebin.
//
// The test binary shares most of its packages with the Kubernetes
// components: built after them (as kubebuild does) it takes a minute or
// two; alone, with the Go build cache cold, about half an hour on two
// cores; free once cached. The cache is
// ($XDG_CACHE_HOME or ~/.cache)/draind/e2e/<version>/, shared by every
// clone and worktree, unless DRAIND_E2E_BIN_DIR names another directory.
//
// Words are defined in the repository's docs/glossary.md.
package e2ebin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/draind/draind/test/cluster/kubebin"
)

// EnvDir overrides the cache directory.
const EnvDir = "DRAIND_E2E_BIN_DIR"

// Binary names in the cache directory.
const (
	// Suite is the e2e test binary (upstream's e2e.test, sig-network only).
	Suite = "e2e.test"
	// Agnhost is the suite's multi-purpose test server.
	Agnhost = "agnhost"
	// Regression74839 is the Conntrack spec's sender of out-of-window
	// packets.
	Regression74839 = "regression-issue-74839"
	// Ginkgo is the ginkgo command at the version the suite links, which
	// runs the suite's specs in parallel processes.
	Ginkgo = "ginkgo"
	// CoreDNS is the cluster DNS, also in the agnhost image as /coredns.
	CoreDNS = "coredns"
)

// binaries are what a complete cache directory holds.
var binaries = []string{Suite, Agnhost, Regression74839, Ginkgo, CoreDNS}

// SuitePackage is the package compiled into Suite, relative to the module,
// and SuiteTag the build tag that lets it compile.
const (
	SuitePackage = "./conformance/suite"
	SuiteTag     = "e2esuite"
	corednsPkg   = "./conformance/coredns"
	imagesPkg    = "k8s.io/kubernetes/test/images/"
	ginkgoPkg    = "github.com/onsi/ginkgo/v2/ginkgo"
)

// Set is a directory holding one built version of the binaries.
type Set struct {
	Dir     string
	Version string
}

// Path returns the path of one of the binaries (Suite, Agnhost, …).
func (s *Set) Path(name string) string { return filepath.Join(s.Dir, name) }

// CacheDir returns where the binaries of kubebin.Version are cached.
func CacheDir() (string, error) { return kubebin.UserCacheDir(EnvDir, "e2e") }

// Ensure returns the cached binaries, building them first if they are
// missing (see kubebin.Cache.Ensure). log receives progress; nil means
// slog.Default.
func Ensure(ctx context.Context, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.Default()
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	c := kubebin.Cache{Dir: dir, Files: binaries}
	if err := c.Ensure(ctx, func(ctx context.Context, out string) error { return build(ctx, log, out) }); err != nil {
		return nil, err
	}
	return &Set{Dir: dir, Version: kubebin.Version}, nil
}

// commands are the two builds, static (no cgo) with kubebin's flags, so
// that the Kubernetes packages they share with the components come from
// the Go build cache.
func commands(out string) [][]string {
	ld := kubebin.LDFlags()
	return [][]string{
		{"go", "build", "-trimpath", "-ldflags", ld, "-o", out + string(filepath.Separator), imagesPkg + Agnhost, imagesPkg + Regression74839, ginkgoPkg, corednsPkg},
		{"go", "test", "-c", "-vet=off", "-trimpath", "-tags", SuiteTag, "-ldflags", ld, "-o", filepath.Join(out, Suite), SuitePackage},
	}
}

func build(ctx context.Context, log *slog.Logger, out string) error {
	mod, err := kubebin.ModuleDir()
	if err != nil {
		return err
	}
	log.Info("building the e2e suite and agnhost (1-2 minutes after the components, about 30 alone with a cold Go build cache)",
		"version", kubebin.Version)
	start := time.Now()
	for _, args := range commands(out) {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%v in %s: %w", args, mod, err)
		}
	}
	log.Info("built the e2e suite and agnhost", "version", kubebin.Version, "took", time.Since(start).Round(time.Second))
	return nil
}
