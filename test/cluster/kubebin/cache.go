package kubebin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// Cache is a directory of binaries built together from the k8s.io/kubernetes
// module at Version. A build writes into a temporary directory, moves the
// binaries in, then writes a stamp: the stamp's presence means every binary is
// there. Package e2ebin keeps its binaries in a Cache too.
type Cache struct {
	Dir   string   // where the binaries are, once built
	Files []string // the binaries a finished build holds
}

// stamp is written last into a cache directory.
type stamp struct {
	Version   string        `json:"version"`
	GoVersion string        `json:"goVersion"`
	BuiltAt   time.Time     `json:"builtAt"`
	Took      time.Duration `json:"tookNanoseconds"`
}

const stampFile = "build.json"

// UserCacheDir returns the directory named by the environment variable env
// or, if it is unset, ($XDG_CACHE_HOME or ~/.cache)/draind/<kind>/<Version>:
// outside the checkout, so that every clone and worktree shares one build.
func UserCacheDir(env, kind string) (string, error) {
	if d := os.Getenv(env); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("locating the cache directory for the %s binaries (set %s): %w", kind, env, err)
	}
	return filepath.Join(base, "draind", kind, Version), nil
}

// Complete reports whether a finished build of Version is in c.Dir.
func (c Cache) Complete() (bool, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, stampFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading build stamp: %w", err)
	}
	var st stamp
	if err := json.Unmarshal(b, &st); err != nil || st.Version != Version {
		return false, nil
	}
	for _, f := range c.Files {
		if _, err := os.Stat(filepath.Join(c.Dir, f)); err != nil {
			return false, nil
		}
	}
	return true, nil
}

// Ensure returns once c is complete, first calling build to write every file
// of c.Files into a temporary directory if it is not. Concurrent callers
// (parallel test packages, CI's background build) serialise on a lock file,
// so the build runs once.
func (c Cache) Ensure(ctx context.Context, build func(ctx context.Context, out string) error) error {
	if ok, err := c.Complete(); err != nil || ok {
		return err
	}
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return fmt.Errorf("creating binary cache %s: %w", c.Dir, err)
	}
	lock, err := os.OpenFile(filepath.Join(c.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("opening build lock: %w", err)
	}
	defer lock.Close()
	if err := flock(ctx, lock); err != nil {
		return err
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	// Another process may have finished the build while we waited.
	if ok, err := c.Complete(); err != nil || ok {
		return err
	}
	tmp, err := os.MkdirTemp(c.Dir, ".build-")
	if err != nil {
		return fmt.Errorf("creating build output directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	start := time.Now()
	if err := build(ctx, tmp); err != nil {
		return err
	}
	took := time.Since(start)
	for _, f := range c.Files {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(c.Dir, f)); err != nil {
			return fmt.Errorf("moving %s into the cache: %w", f, err)
		}
	}
	st, err := json.MarshalIndent(stamp{Version: Version, GoVersion: runtime.Version(), BuiltAt: time.Now().UTC(), Took: took}, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding build stamp: %w", err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, stampFile), st, 0o644); err != nil {
		return fmt.Errorf("writing build stamp: %w", err)
	}
	return nil
}

// flock takes an exclusive lock on f, waiting for another build to finish
// until ctx ends (an interrupted kubebuild stops waiting).
func flock(ctx context.Context, f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("taking build lock: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for another build of %s: %w", f.Name(), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}
