package kubebin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

func writeFiles(out string, names ...string) error {
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(out, n), []byte(n), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// TestCacheBuildsOnce: concurrent callers share one build, and later ones
// find the stamped cache without building.
func TestCacheBuildsOnce(t *testing.T) {
	c := Cache{Dir: filepath.Join(t.TempDir(), "kube"), Files: []string{"a", "b"}}
	var builds atomic.Int32
	build := func(_ context.Context, out string) error {
		builds.Add(1)
		return writeFiles(out, "a", "b")
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := c.Ensure(context.Background(), build); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Fatalf("%d builds for 4 concurrent callers, want 1", n)
	}
	if ok, err := c.Complete(); err != nil || !ok {
		t.Fatalf("Complete() = %v, %v after a build", ok, err)
	}
	if err := c.Ensure(context.Background(), build); err != nil || builds.Load() != 1 {
		t.Fatalf("Ensure on a complete cache: err %v, builds %d", err, builds.Load())
	}
}

// TestCacheIncompleteBuilds: a failed build, a missing binary or a stamp of
// another version leaves the cache incomplete, so the next caller builds.
func TestCacheIncompleteBuilds(t *testing.T) {
	c := Cache{Dir: filepath.Join(t.TempDir(), "kube"), Files: []string{"a", "b"}}
	fail := errors.New("compile error")
	if err := c.Ensure(context.Background(), func(context.Context, string) error { return fail }); !errors.Is(err, fail) {
		t.Fatalf("Ensure with a failing build = %v, want %v", err, fail)
	}
	if ok, _ := c.Complete(); ok {
		t.Fatal("complete after a failed build")
	}
	if err := c.Ensure(context.Background(), func(_ context.Context, out string) error { return writeFiles(out, "a") }); err == nil {
		t.Fatal("Ensure with a build that left out a binary succeeded")
	}
	if ok, _ := c.Complete(); ok {
		t.Fatal("complete with a binary missing")
	}
	if err := c.Ensure(context.Background(), func(_ context.Context, out string) error { return writeFiles(out, "a", "b") }); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, stampFile), []byte(`{"version":"v0.0.1"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if ok, _ := c.Complete(); ok {
		t.Fatal("complete with another version's stamp")
	}
}

// TestCacheWaitEndsWithContext: a caller waiting for another process's
// build stops when its context ends, without building.
func TestCacheWaitEndsWithContext(t *testing.T) {
	c := Cache{Dir: filepath.Join(t.TempDir(), "kube"), Files: []string{"a"}}
	held := make(chan struct{})
	release := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- c.Ensure(context.Background(), func(_ context.Context, out string) error {
			close(held)
			<-release
			return writeFiles(out, "a")
		})
	}()
	<-held
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	built := false
	err := c.Ensure(ctx, func(context.Context, string) error { built = true; return nil })
	if !errors.Is(err, context.Canceled) || built {
		t.Errorf("a cancelled wait: err %v, built %v; want context.Canceled and no build", err, built)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
