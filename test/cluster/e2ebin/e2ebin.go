// Package e2ebin builds the upstream Kubernetes e2e suite's sig-network test
// binary (package conformance/suite: the framework and test/e2e/network,
// compiled with `go test -c -vet=off -tags e2esuite`), agnhost, the suite's
// test server, the Conntrack spec's regression-issue-74839 and the ginkgo
// command that runs the suite in parallel, from the k8s.io/kubernetes module
// this Go module requires, and caches them per Kubernetes version like
// package kubebin.
//
// The test binary is the slow part: about half an hour cold on two cores,
// a re-link of a minute or two with the Go build cache warm, free once
// cached. The cache is ($XDG_CACHE_HOME or ~/.cache)/draind/e2e/<version>/,
// shared by every clone and worktree, unless DRAIND_E2E_BIN_DIR names
// another directory.
package e2ebin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
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
)

// binaries are what a complete cache directory holds.
var binaries = []string{Suite, Agnhost, Regression74839, Ginkgo}

// SuitePackage is the package compiled into Suite, relative to the module,
// and SuiteTag the build tag that lets it compile.
const (
	SuitePackage = "./conformance/suite"
	SuiteTag     = "e2esuite"
	imagesPkg    = "k8s.io/kubernetes/test/images/"
	ginkgoPkg    = "github.com/onsi/ginkgo/v2/ginkgo"
)

// Set is a directory holding one built version of the binaries.
type Set struct {
	Dir     string
	Version string
}

// Path returns the path of Suite or Agnhost.
func (s *Set) Path(name string) string { return filepath.Join(s.Dir, name) }

type stamp struct {
	Version   string        `json:"version"`
	GoVersion string        `json:"goVersion"`
	BuiltAt   time.Time     `json:"builtAt"`
	Took      time.Duration `json:"tookNanoseconds"`
}

const stampFile = "build.json"

// CacheDir returns where the binaries of kubebin.Version are cached.
func CacheDir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the cache directory for the e2e binaries (set %s): %w", EnvDir, err)
	}
	return filepath.Join(base, "draind", "e2e", kubebin.Version), nil
}

func complete(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, stampFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading build stamp: %w", err)
	}
	var st stamp
	if err := json.Unmarshal(b, &st); err != nil || st.Version != kubebin.Version {
		return false, nil
	}
	for _, n := range binaries {
		if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
			return false, nil
		}
	}
	return true, nil
}

// Ensure returns the cached binaries, building them first if they are
// missing; concurrent callers serialise on a lock file. log receives
// progress; nil means slog.Default.
func Ensure(ctx context.Context, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.Default()
	}
	dir, err := CacheDir()
	if err != nil {
		return nil, err
	}
	set := &Set{Dir: dir, Version: kubebin.Version}
	if ok, err := complete(dir); err != nil || ok {
		return set, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating binary cache %s: %w", dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening build lock: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("taking build lock: %w", err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if ok, err := complete(dir); err != nil || ok {
		return set, err
	}
	took, err := build(ctx, log, dir)
	if err != nil {
		return nil, err
	}
	st, err := json.MarshalIndent(stamp{Version: kubebin.Version, GoVersion: runtime.Version(), BuiltAt: time.Now().UTC(), Took: took}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding build stamp: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, stampFile), st, 0o644); err != nil {
		return nil, fmt.Errorf("writing build stamp: %w", err)
	}
	return set, nil
}

// commands are the two builds: static (no cgo), the version stamped in,
// with kubebin's flags otherwise (no -trimpath), so that the Kubernetes
// packages they share with the components come from the Go build cache.
func commands(out string) [][]string {
	ld := kubebin.LDFlags()
	return [][]string{
		{"go", "build", "-ldflags", "-s -w " + ld, "-o", out + string(filepath.Separator), imagesPkg + Agnhost, imagesPkg + Regression74839, ginkgoPkg},
		{"go", "test", "-c", "-vet=off", "-tags", SuiteTag, "-ldflags", ld, "-o", filepath.Join(out, Suite), SuitePackage},
	}
}

func build(ctx context.Context, log *slog.Logger, dir string) (time.Duration, error) {
	mod, err := kubebin.ModuleDir()
	if err != nil {
		return 0, err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return 0, fmt.Errorf("creating build output directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	log.Info("building the e2e suite and agnhost (a cold build takes about 30 minutes on 2 cores)",
		"version", kubebin.Version, "dir", dir)
	start := time.Now()
	for _, args := range commands(tmp) {
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir = mod
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return 0, fmt.Errorf("%v in %s: %w", args, mod, err)
		}
	}
	took := time.Since(start)
	for _, n := range binaries {
		if err := os.Rename(filepath.Join(tmp, n), filepath.Join(dir, n)); err != nil {
			return 0, fmt.Errorf("moving %s into the cache: %w", n, err)
		}
	}
	log.Info("built the e2e suite and agnhost", "version", kubebin.Version, "took", took.Round(time.Second))
	return took, nil
}
