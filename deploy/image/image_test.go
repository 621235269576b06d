package image

import (
	"archive/tar"
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/draind/draind/deploy/release"
)

// TestLDFlagsMatchDockerfile keeps the image's build line and the
// Dockerfile's in step: same flags, version from the same place.
func TestLDFlagsMatchDockerfile(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var build string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if strings.Contains(s.Text(), "go build") {
			build = s.Text()
		}
	}
	m := regexp.MustCompile(`-ldflags "([^"]*)"`).FindStringSubmatch(build)
	if m == nil {
		t.Fatalf("no -ldflags in the Dockerfile's go build line %q", build)
	}
	if want := LDFlags(release.Stamp{Version: "${VERSION}", Commit: "${COMMIT}", Date: "${DATE}"}); m[1] != want {
		t.Errorf("Dockerfile ldflags %q, LDFlags gives %q", m[1], want)
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath"} {
		if !strings.Contains(build, flag) {
			t.Errorf("the Dockerfile's build line lacks %s, which GoBuild sets: %q", flag, build)
		}
	}
}

func files(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = h
	}
}

func TestDraindImage(t *testing.T) {
	img, err := Build(DraindSpec([]byte("\x7fELF fake"), "v9.9.9", "amd64"))
	if err != nil {
		t.Fatal(err)
	}
	fs := files(t, img)
	bin := fs["usr/local/bin/draind"]
	if bin == nil || bin.Mode&0o777 != 0o755 || bin.Size != 9 {
		t.Fatalf("usr/local/bin/draind: %+v", bin)
	}
	if tmp := fs["tmp"]; tmp == nil || tmp.Typeflag != tar.TypeDir || tmp.Mode&0o1777 != 0o1777 {
		t.Errorf("tmp: %+v, want a world-writable sticky directory", tmp)
	}
	for _, p := range []string{"etc/passwd", "etc/group", "usr", "usr/local", "usr/local/bin"} {
		if fs[p] == nil {
			t.Errorf("%s missing from the image", p)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cf.Config.Entrypoint, " ") != DraindBinary || cf.Config.User != "0" || cf.OS != "linux" || cf.Architecture != "amd64" {
		t.Errorf("config: entrypoint %v user %q platform %s/%s", cf.Config.Entrypoint, cf.Config.User, cf.OS, cf.Architecture)
	}
	if cf.Config.Labels["org.opencontainers.image.version"] != "v9.9.9" {
		t.Errorf("labels %v", cf.Config.Labels)
	}
	mt, _ := img.MediaType()
	if !strings.Contains(string(mt), "oci") {
		t.Errorf("manifest media type %s, want OCI", mt)
	}
	// Reproducible: the same inputs, the same digest.
	img2, _ := Build(DraindSpec([]byte("\x7fELF fake"), "v9.9.9", "amd64"))
	d1, _ := img.Digest()
	d2, _ := img2.Digest()
	if d1 != d2 {
		t.Errorf("two builds of the same image differ: %s %s", d1, d2)
	}
}

func TestBuildRejectsBadPaths(t *testing.T) {
	for _, p := range []string{"relative/x", "/a/../b", "/tmp"} {
		if _, err := Build(Spec{Files: []File{{Path: p, Mode: 0o644}}}); err == nil {
			t.Errorf("Build accepted file path %q", p)
		}
	}
	if _, err := Build(Spec{Files: []File{{Path: "/a", Mode: 0o644}, {Path: "/a", Mode: 0o644}}}); err == nil {
		t.Error("Build accepted the same path twice")
	}
}

// TestBuildLinks checks a File with Link becomes a symbolic link.
func TestBuildLinks(t *testing.T) {
	img, err := Build(Spec{Files: []File{
		{Path: "/bin/busybox", Mode: 0o755, Data: []byte("bb")},
		{Path: "/bin/sh", Link: "busybox"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	sh := files(t, img)["bin/sh"]
	if sh == nil || sh.Typeflag != tar.TypeSymlink || sh.Linkname != "busybox" || sh.Size != 0 {
		t.Fatalf("bin/sh: %+v, want a symbolic link to busybox", sh)
	}
	if _, err := Build(Spec{Files: []File{{Path: "/x", Link: "y", Data: []byte("z")}}}); err == nil {
		t.Error("Build accepted a link with data")
	}
}

// TestWriteArchive checks the archive is an OCI layout whose index names
// each image the way containerd's importer and OCI tools read names.
func TestWriteArchive(t *testing.T) {
	img, err := Build(DraindSpec([]byte("x"), "dev", ""))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "a.tar")
	if err := WriteArchive(out, map[string]v1.Image{"ghcr.io/draind/draind:dev": img, "example.test/x:1": img}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var index v1.IndexManifest
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		seen[h.Name] = true
		if h.Name == "index.json" {
			if err := json.NewDecoder(tr).Decode(&index); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !seen["oci-layout"] || !seen["index.json"] {
		t.Fatalf("not an OCI layout: %v", seen)
	}
	names := map[string]string{}
	for _, m := range index.Manifests {
		names[m.Annotations["io.containerd.image.name"]] = m.Annotations["org.opencontainers.image.ref.name"]
		if !seen["blobs/sha256/"+m.Digest.Hex] {
			t.Errorf("manifest blob %s missing", m.Digest)
		}
	}
	if names["ghcr.io/draind/draind:dev"] != "dev" || names["example.test/x:1"] != "1" {
		t.Errorf("index names %v", names)
	}
	if err := WriteArchive(out, map[string]v1.Image{"notag": img}); err == nil {
		t.Error("WriteArchive accepted a reference without registry and tag")
	}
}
