// Package draindbin locates the draind module (the repository root, two
// levels above test/cluster) and builds the draind binary the beds run as a
// host process.
//
// Words are defined in the repository's docs/glossary.md.
package draindbin

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/draind/draind/test/srcroot"
)

// RepoRoot returns the root of the repository: the directory of the draind
// module, two levels above the test/cluster module.
func RepoRoot() (string, error) { return srcroot.Module("github.com/draind/draind") }

// Build builds cmd/draind of the main module into dir and returns the
// binary's path. -trimpath, as the image's build: a clone at another path
// reuses the Go build cache.
func Build(ctx context.Context, dir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building draind needs the go command on PATH: %w", err)
	}
	out := filepath.Join(dir, "draind")
	cmd := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-o", out, "./cmd/draind")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building draind (go build ./cmd/draind in %s): %w: %s", root, err, b)
	}
	return out, nil
}
