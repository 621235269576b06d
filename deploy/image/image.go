// Package image builds draind's container image without Docker or a
// registry: a static build of cmd/draind in one layer, with the paths,
// entrypoint and user of the Dockerfile's final stage, written as an OCI
// image layout in a tar archive (`ctr images import`, `docker load`,
// `skopeo copy oci-archive:...` all read it). The test bed builds its own
// images (pause, test servers and clients) with the same code.
//
// The Dockerfile's base, distroless/static-debian12, cannot be fetched
// offline. What it has and these images do not: the Debian CA bundle
// (/etc/ssl/certs; draind talks only to the API server, whose CA comes from
// the ServiceAccount volume), tzdata (draind logs in UTC), /etc/os-release,
// /etc/nsswitch.conf and the nonroot home directory. What they share:
// /etc/passwd and /etc/group with root and nonroot, a world-writable /tmp,
// the same PATH and SSL_CERT_FILE, uid 0 and the ENTRYPOINT.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package image

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/draind/draind/deploy/release"
)

// DraindRepository is the image name the kustomize base refers to.
const DraindRepository = "ghcr.io/draind/draind"

// DraindBinary is where the draind binary lives in the image (the
// Dockerfile's COPY destination and ENTRYPOINT).
const DraindBinary = "/usr/local/bin/draind"

// Environment of distroless/static, which the Dockerfile's image inherits.
var baseEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
}

// File is one regular file of a layer, or a symbolic link when Link is set.
type File struct {
	Path string // absolute path in the image
	Mode fs.FileMode
	Data []byte
	Link string // the symbolic link's target; Data is then empty
}

// Spec describes a single-layer image.
type Spec struct {
	Files      []File
	Entrypoint []string
	Cmd        []string
	Env        []string // appended to the base environment
	Labels     map[string]string
	// Arch is the GOARCH of the binaries (default runtime.GOARCH).
	Arch string
}

// epoch is every file's and the image's timestamp: the same inputs give
// the same digests.
var epoch = time.Unix(0, 0).UTC()

// baseFiles are what the images keep of distroless/static's file system.
func baseFiles() []File {
	return []File{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
	}
}

// Build assembles the image: one OCI layer holding the base files, /tmp and
// spec's files (with their parent directories), and a config with spec's
// entrypoint, environment and labels, running as root like distroless
// static's root variant.
func Build(spec Spec) (v1.Image, error) {
	files := append(baseFiles(), spec.Files...)
	layerTar, err := layerTar(files)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("creating the image layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "github.com/draind/draind/deploy/image",
	}})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("reading the image config: %w", err)
	}
	cf = cf.DeepCopy()
	arch := spec.Arch
	if arch == "" {
		arch = runtime.GOARCH
	}
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.Env = append(append([]string{}, baseEnv...), spec.Env...)
	cf.Config.WorkingDir = "/"
	cf.Config.User = "0"
	cf.Config.Labels = spec.Labels
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("writing the image config: %w", err)
	}
	return img, nil
}

// layerTar writes files, their parent directories and /tmp as a tar
// stream in path order, owned by root, with fixed times.
func layerTar(files []File) ([]byte, error) {
	dirs := map[string]fs.FileMode{"/tmp": fs.ModeDir | fs.ModeSticky | 0o777}
	seen := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("image file path %q: want a clean absolute path", f.Path)
		}
		if seen[f.Path] {
			return nil, fmt.Errorf("image file %s given twice", f.Path)
		}
		seen[f.Path] = true
		for d := path.Dir(f.Path); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = fs.ModeDir | 0o755
			}
		}
	}
	type entry struct {
		name string
		hdr  *tar.Header
		data []byte
	}
	var entries []entry
	for d, mode := range dirs {
		if seen[d] {
			return nil, fmt.Errorf("image path %s is both a file and a directory", d)
		}
		name := strings.TrimPrefix(d, "/") + "/"
		entries = append(entries, entry{name: name, hdr: &tar.Header{
			Typeflag: tar.TypeDir, Name: name, Mode: int64(mode.Perm()) | modeBits(mode), ModTime: epoch, Format: tar.FormatPAX,
		}})
	}
	for _, f := range files {
		name := strings.TrimPrefix(f.Path, "/")
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: int64(f.Mode.Perm()), Size: int64(len(f.Data)), ModTime: epoch, Format: tar.FormatPAX}
		if f.Link != "" {
			if len(f.Data) > 0 {
				return nil, fmt.Errorf("image file %s is a link with data", f.Path)
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		}
		entries = append(entries, entry{name: name, data: f.Data, hdr: hdr})
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		if err := tw.WriteHeader(e.hdr); err != nil {
			return nil, fmt.Errorf("writing layer entry %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("writing layer entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing the layer: %w", err)
	}
	return buf.Bytes(), nil
}

// modeBits maps the sticky, setuid and setgid bits to tar's mode field.
func modeBits(m fs.FileMode) int64 {
	var b int64
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	return b
}

// Annotation names on the archive's index entries. containerd's importer
// (ctr images import) names an image by the first, OCI tools by the second.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// WriteArchive writes images, keyed by their full reference
// (registry/repository:tag), as one OCI image layout packed in a tar
// archive at dst.
func WriteArchive(dst string, images map[string]v1.Image) error {
	dir, err := os.MkdirTemp("", "draind-image-layout-")
	if err != nil {
		return fmt.Errorf("creating a layout directory: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("creating the OCI layout: %w", err)
	}
	refs := make([]string, 0, len(images))
	for ref := range images {
		refs = append(refs, ref)
	}
	sort.Strings(refs)
	for _, ref := range refs {
		if !strings.Contains(ref, "/") || !strings.Contains(path.Base(ref), ":") {
			return fmt.Errorf("image reference %q: want registry/repository:tag", ref)
		}
		_, tag, _ := strings.Cut(path.Base(ref), ":")
		if err := p.AppendImage(images[ref], layout.WithAnnotations(map[string]string{
			annotationContainerdName: ref,
			annotationRefName:        tag,
		})); err != nil {
			return fmt.Errorf("adding %s to the layout: %w", ref, err)
		}
	}
	return tarDir(dir, dst)
}

// tarDir packs the layout directory into dst (written next to it and
// renamed, so a reader never sees half an archive).
func tarDir(dir, dst string) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-")
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	tw := tar.NewWriter(tmp)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.ModTime, hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = epoch, 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return fmt.Errorf("packing the OCI layout into %s: %w", dst, err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("packing the OCI layout into %s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return fmt.Errorf("writing %s: %w", dst, err)
	}
	return nil
}

// LDFlags returns the linker flags of the image's draind build: the
// Dockerfile's (strip symbols, stamp version, commit and date as
// deploy/release says). Every build of the image takes them from here.
func LDFlags(s release.Stamp) string {
	return "-s -w " + release.LDFlags(s)
}

// GoBuild builds the main package pkg of the module in dir as a static
// binary for linux/arch at out: no cgo (no libc to match on the node),
// -trimpath, and ldflags.
func GoBuild(ctx context.Context, dir, pkg, arch, ldflags, out string) error {
	if arch == "" {
		arch = runtime.GOARCH
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+arch)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s in %s (CGO_ENABLED=0 go build -trimpath): %w: %s", pkg, dir, err, stderr.Bytes())
	}
	return nil
}

// DraindSpec is the image of the Dockerfile's final stage around a built
// draind binary.
func DraindSpec(binary []byte, version, arch string) Spec {
	return Spec{
		Files:      []File{{Path: DraindBinary, Mode: 0o755, Data: binary}},
		Entrypoint: []string{DraindBinary},
		Arch:       arch,
		Labels: map[string]string{
			"org.opencontainers.image.title":   "draind",
			"org.opencontainers.image.version": version,
			"org.opencontainers.image.source":  "https://github.com/draind/draind",
		},
	}
}

// Draind builds cmd/draind of the repository at root (static, version
// stamped) and returns its image.
func Draind(ctx context.Context, root string, stamp release.Stamp, arch string) (v1.Image, error) {
	version := stamp.Version
	if version == "" {
		version = release.Version
	}
	tmp, err := os.MkdirTemp("", "draind-image-build-")
	if err != nil {
		return nil, fmt.Errorf("creating a build directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "draind")
	if err := GoBuild(ctx, root, "./cmd/draind", arch, LDFlags(stamp), bin); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the built draind: %w", err)
	}
	return Build(DraindSpec(data, version, arch))
}
