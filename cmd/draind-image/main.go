// Command draind-image builds draind's container image without Docker or a
// registry, as an OCI archive: the Dockerfile's static build and paths
// (/usr/local/bin/draind, the same ENTRYPOINT), on a minimal base instead of
// distroless (see package deploy/image for what differs). Run it from the
// repository root:
//
//	go run ./cmd/draind-image -o draind.tar --version "$(git describe --tags --always)"
//	ctr -n k8s.io images import draind.tar      # or: docker load -i draind.tar
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/draind/draind/deploy/image"

	"github.com/draind/draind/deploy/release"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "draind-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("draind-image", flag.ContinueOnError)
	out := fs.String("o", "", "write the OCI archive here (required)")
	version := fs.String("version", release.Version, "version stamped into the binary (the Dockerfile's VERSION build argument)")
	commit := fs.String("commit", "", "source revision stamped into the binary (the Dockerfile's COMMIT; default: the Go toolchain's VCS information)")
	date := fs.String("date", time.Now().UTC().Format(time.RFC3339), "build date stamped into the binary (the Dockerfile's DATE)")
	ref := fs.String("tag", "", "image reference inside the archive (default "+image.DraindRepository+":<version>)")
	arch := fs.String("arch", runtime.GOARCH, "GOARCH of the image")
	root := fs.String("C", ".", "the draind repository to build")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() != 0 {
		return errors.New("usage: draind-image -o FILE [--version V] [--tag REF] [--arch GOARCH]")
	}
	if *ref == "" {
		*ref = image.DraindRepository + ":" + *version
	}
	img, err := image.Draind(ctx, *root, release.Stamp{Version: *version, Commit: *commit, Date: *date}, *arch)
	if err != nil {
		return err
	}
	if err := image.WriteArchive(*out, map[string]v1.Image{*ref: img}); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("computing the image digest: %w", err)
	}
	fmt.Printf("%s %s (%s)\n", *out, *ref, digest)
	return nil
}
