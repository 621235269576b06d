package files

import (
	"os"
	"path/filepath"
	"testing"
)

// TestCopyTree: the regular files under a tree are copied with their
// directories; one that cannot be read is named in the error and the
// others are copied all the same.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	files := map[string]string{"kube-proxy.log": "synced", "pods/ns_web_1/app/0.log": "hello"}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("kube-proxy.log", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := CopyTree(dst, src); err != nil {
		t.Fatalf("copying a readable tree: %v", err)
	}
	for name, body := range files {
		got, err := os.ReadFile(filepath.Join(dst, name))
		if err != nil || string(got) != body {
			t.Errorf("%s copied as %q (%v), want %q", name, got, err, body)
		}
	}
	if _, err := os.Lstat(filepath.Join(dst, "link")); !os.IsNotExist(err) {
		t.Errorf("a symlink was copied (%v): only regular files are", err)
	}
	// A file that cannot be copied: its destination is a directory.
	other := t.TempDir()
	if err := os.MkdirAll(filepath.Join(other, "kube-proxy.log"), 0o755); err != nil {
		t.Fatal(err)
	}
	err := CopyTree(other, src)
	if err == nil {
		t.Fatal("a file that could not be copied gave no error")
	}
	if got, rerr := os.ReadFile(filepath.Join(other, "pods/ns_web_1/app/0.log")); rerr != nil || string(got) != "hello" {
		t.Errorf("after one failed file the others were not copied: %q (%v); the error: %v", got, rerr, err)
	}
}
