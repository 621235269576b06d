// Command kubebuild builds (or finds cached) kube-apiserver,
// kube-controller-manager and kube-proxy for the cluster bed and prints the
// directory holding them. CI runs it before the privileged tests so that the
// build time shows up as its own step.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

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
	set, err := kubebin.Ensure(ctx, slog.Default())
	if err != nil {
		return err
	}
	fmt.Println(set.Dir)
	return nil
}
