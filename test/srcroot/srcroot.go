// Package srcroot finds a Go module's directory in the source tree, for the
// tests and test tools that read the repository's files (README.md, the
// deploy manifests, the test/cluster module's go.mod).
//
// The caller's source file names its directory when the package was built
// with full paths. Built with -trimpath (as the test/cluster module is, so
// that its packages share the Go build cache with the static Kubernetes and
// draind builds) a source file is named by its import path instead; the
// module is then found upward from the working directory, which go test
// sets to the package's directory and go run leaves where it was started.
//
// Words are defined in the repository's docs/glossary.md.
package srcroot

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Module returns the directory of the module whose go.mod declares path:
// the nearest such directory above the caller's source file, or else above
// the working directory.
func Module(path string) (string, error) {
	var starts []string
	if _, file, _, ok := runtime.Caller(1); ok && filepath.IsAbs(file) {
		starts = append(starts, filepath.Dir(file))
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("locating module %s: %w", path, err)
	}
	starts = append(starts, wd)
	for _, start := range starts {
		if dir, ok := above(start, path); ok {
			return dir, nil
		}
	}
	return "", fmt.Errorf("locating module %s: no go.mod declaring it above %s", path, strings.Join(starts, " or "))
}

// above walks from dir to the file system's root and returns the first
// directory whose go.mod declares module path.
func above(dir, path string) (string, bool) {
	for {
		if declares(filepath.Join(dir, "go.mod"), path) {
			return dir, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// declares reports whether the go.mod file at name declares module path.
func declares(name, path string) bool {
	f, err := os.Open(name)
	if err != nil {
		return false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		mod, ok := strings.CutPrefix(line, "module ")
		return ok && strings.Trim(strings.TrimSpace(mod), `"`) == path
	}
	return false
}
