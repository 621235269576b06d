// Command draind is the node-level connection drainer: the daemon (run), its
// debugging tools (status, bpf dump), operator drains (drain, undrain) and a
// self-contained demo.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/draind/draind/test/bed"
)

func main() {
	bed.HelperMain() // the demo's pods run as re-executed helpers
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "draind:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	cmd := newRootCmd()
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}
