// Command e2ebuild builds (or finds cached) the upstream e2e suite's
// sig-network test binary and agnhost (package e2ebin) and prints the
// directory holding them. CI runs it in the background, beside the
// Kubernetes build, so that a warm cache makes it free.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/draind/draind/test/cluster/e2ebin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	set, err := e2ebin.Ensure(ctx, slog.Default())
	if err != nil {
		slog.Error("e2ebuild failed", "err", err)
		os.Exit(1)
	}
	fmt.Println(set.Dir)
}
