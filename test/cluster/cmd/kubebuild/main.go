// Command kubebuild builds (or finds cached) the binaries the test/cluster
// module's tests run: the Kubernetes components (package kubebin), then the
// upstream e2e suite's sig-network test binary, agnhost and ginkgo (package
// e2ebin). It prints the two directories holding them. test/run calls it
// before the module's tests so that the build time shows as its own step; CI
// starts it in the background, early, and a warm cache makes it free.
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/draind/draind/test/cluster/e2ebin"
	"github.com/draind/draind/test/cluster/kubebin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		slog.Error("kubebuild failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	kube, err := kubebin.Ensure(ctx, slog.Default())
	if err != nil {
		return err
	}
	fmt.Println(kube.Dir)
	e2e, err := e2ebin.Ensure(ctx, slog.Default())
	if err != nil {
		return err
	}
	fmt.Println(e2e.Dir)
	return nil
}
