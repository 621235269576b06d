package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/kubebin"

	"github.com/draind/draind/deploy/release"
)

// The test images (testapp: pause, HTTP server, clients).
const (
	// PauseImage is containerd's sandbox_image.
	PauseImage = "draind.test/pause:1"
	// AppImage runs /testapp server|client.
	AppImage = "draind.test/testapp:1"
	// AppBinary is the test app's path in AppImage.
	AppBinary = "/testapp"
)

// BuildTestImages builds the test app (a static binary of this module) and
// writes the pause and app images to an OCI archive in dir.
func BuildTestImages(ctx context.Context, dir string) (string, error) {
	mod, err := kubebin.ModuleDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", dir, err)
	}
	bin := filepath.Join(dir, "testapp")
	if err := image.GoBuild(ctx, mod, "./realnode/testapp", "", "-s -w", bin); err != nil {
		return "", err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("reading the test app: %w", err)
	}
	files := []image.File{{Path: AppBinary, Mode: 0o755, Data: data}}
	pause, err := image.Build(image.Spec{Files: files, Entrypoint: []string{AppBinary, "pause"}})
	if err != nil {
		return "", err
	}
	app, err := image.Build(image.Spec{Files: files, Entrypoint: []string{AppBinary}})
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "test-images.tar")
	if err := image.WriteArchive(out, map[string]v1.Image{PauseImage: pause, AppImage: app}); err != nil {
		return "", err
	}
	return out, nil
}

// DraindImage is a built draind image: the archive holding it under every
// requested reference, and the static binary inside it (the same one
// `draind bpf remove` runs as on a node).
type DraindImage struct {
	Archive string
	Binary  string
	Refs    []string
}

// BuildDraindImage builds draind's image the way cmd/draind-image does
// (deploy/image: static, -trimpath, the Dockerfile's ldflags with version)
// and writes it to dir under each of refs.
func BuildDraindImage(ctx context.Context, dir, version string, refs ...string) (*DraindImage, error) {
	mod, err := kubebin.ModuleDir()
	if err != nil {
		return nil, err
	}
	root := filepath.Dir(filepath.Dir(mod))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", dir, err)
	}
	bin := filepath.Join(dir, "draind")
	if err := image.GoBuild(ctx, root, "./cmd/draind", "", image.LDFlags(release.Stamp{Version: version}), bin); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the built draind: %w", err)
	}
	img, err := image.Build(image.DraindSpec(data, version, ""))
	if err != nil {
		return nil, err
	}
	imgs := map[string]v1.Image{}
	for _, r := range refs {
		imgs[r] = img
	}
	out := filepath.Join(dir, "draind.tar")
	if err := image.WriteArchive(out, imgs); err != nil {
		return nil, err
	}
	return &DraindImage{Archive: out, Binary: bin, Refs: refs}, nil
}
