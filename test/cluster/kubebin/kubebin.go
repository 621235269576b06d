// Package kubebin builds the Kubernetes components the beds run
// (kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, the
// kubelet) and kubectl from the k8s.io/kubernetes module this Go module
// requires, and caches the binaries per Kubernetes version so that only the
// first run pays for the build. kubectl comes from the module too: the
// distribution's is too old for the apiserver, and a fresh CI machine has none.
//
// A cold build takes 10–15 minutes on two cores; with the Go build cache warm a
// rebuild is a re-link of about half a minute; with the binaries cached it is
// free. The cache (type Cache) lives outside the checkout, in
// ($XDG_CACHE_HOME or ~/.cache)/draind/kube/<version>/, so that every clone
// and worktree of the project shares one build, unless DRAIND_KUBE_BIN_DIR
// names another directory.
//
// Words are defined in the repository's docs/glossary.md.
package kubebin

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/draind/draind/test/srcroot"
)

// Version is the k8s.io/kubernetes release this module requires. It keys the
// cache and is stamped into the binaries; TestVersionMatchesGoMod keeps it in
// step with go.mod.
const Version = "v1.37.2"

// EnvDir overrides the cache directory for the binaries of Version.
const EnvDir = "DRAIND_KUBE_BIN_DIR"

// Component names, which are also the binary file names.
const (
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
	Proxy             = "kube-proxy"
	Kubelet           = "kubelet"
	Kubectl           = "kubectl"
)

// components are built together, in one go build: the packages they share
// compile once.
var components = []string{APIServer, ControllerManager, Scheduler, Proxy, Kubelet, Kubectl}

// Set is a directory holding one built version of the components.
type Set struct {
	Dir     string
	Version string
}

// Path returns the path of a component's binary.
func (s *Set) Path(component string) string { return filepath.Join(s.Dir, component) }

// ModulePath is the test/cluster module's path.
const ModulePath = "github.com/draind/draind/test/cluster"

// ModuleDir returns the directory of the test/cluster Go module, so that
// tests in any package of the module, and kubebuild, find it (see package
// srcroot: it works under -trimpath too).
func ModuleDir() (string, error) { return srcroot.Module(ModulePath) }

// CacheDir returns where the binaries of Version are (or will be) cached.
func CacheDir() (string, error) { return UserCacheDir(EnvDir, "kube") }

func cache() (Cache, error) {
	dir, err := CacheDir()
	return Cache{Dir: dir, Files: components}, err
}

// Cached returns the cached set if a finished build of Version is present.
func Cached() (*Set, bool, error) {
	c, err := cache()
	if err != nil {
		return nil, false, err
	}
	ok, err := c.Complete()
	if err != nil || !ok {
		return nil, false, err
	}
	return &Set{Dir: c.Dir, Version: Version}, true, nil
}

// Ensure returns the cached binaries of Version, building them first if they
// are missing (see Cache.Ensure). log receives progress; nil means
// slog.Default.
func Ensure(ctx context.Context, log *slog.Logger) (*Set, error) {
	if log == nil {
		log = slog.Default()
	}
	c, err := cache()
	if err != nil {
		return nil, err
	}
	if err := c.Ensure(ctx, func(ctx context.Context, out string) error { return build(ctx, log, out) }); err != nil {
		return nil, err
	}
	return &Set{Dir: c.Dir, Version: Version}, nil
}

// LDFlags returns the linker flags of every Kubernetes binary built here:
// Version stamped in (without it clients fail to parse the server
// version), and no symbol table or DWARF (as Kubernetes' own release
// builds: a third of the size, and a link of a few seconds, not a dozen).
func LDFlags() string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(Version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	flags := []string{
		"-s", "-w",
		"-X k8s.io/component-base/version.gitVersion=" + Version,
		"-X k8s.io/component-base/version.gitMajor=" + major,
		"-X k8s.io/component-base/version.gitMinor=" + minor,
		"-X k8s.io/component-base/version.gitTreeState=clean",
		"-X k8s.io/client-go/pkg/version.gitVersion=" + Version,
		"-X k8s.io/client-go/pkg/version.gitMajor=" + major,
		"-X k8s.io/client-go/pkg/version.gitMinor=" + minor,
		"-X k8s.io/client-go/pkg/version.gitTreeState=clean",
	}
	return strings.Join(flags, " ")
}

func build(ctx context.Context, log *slog.Logger, out string) error {
	mod, err := ModuleDir()
	if err != nil {
		return err
	}
	args := []string{"build", "-trimpath", "-o", out + string(filepath.Separator), "-ldflags", LDFlags()}
	for _, c := range components {
		args = append(args, "k8s.io/kubernetes/cmd/"+c)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = mod
	// Kubernetes ships its server binaries static; cgo would also make the
	// build depend on a C toolchain being installed. Static and -trimpath
	// are also how draind's image is built: the packages both use
	// (client-go, the API types) are compiled once, on a fresh machine.
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	log.Info("building Kubernetes components (a cold build takes 10-15 minutes on 2 cores)",
		"version", Version, "components", components)
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s %v in %s: %w", Version, components, mod, err)
	}
	log.Info("built Kubernetes components", "version", Version, "took", time.Since(start).Round(time.Second))
	return nil
}
