package main

import (
	"archive/tar"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/draind/draind/test/readme"
)

// TestREADMEImageCommand runs the README's offline image build exactly as
// printed (from the repository root, where it writes draind.tar) and checks
// the archive is an OCI layout holding an image.
func TestREADMEImageCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: builds draind (-short)")
	}
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	line, err := doc.CommandLine("go run ./cmd/draind-image")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(doc.Path)
	out := filepath.Join(root, "draind.tar")
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("%s exists already: the test will not overwrite it", out)
	}
	t.Cleanup(func() { os.Remove(out) })
	cmd := exec.Command("sh", "-c", line)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", line, err, b)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatalf("the command wrote no %s: %v", out, err)
	}
	defer f.Close()
	var names []string
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	joined := strings.Join(names, " ")
	for _, want := range []string{"oci-layout", "index.json", "blobs/sha256/"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the archive lacks %s: %v", want, names)
		}
	}
}
