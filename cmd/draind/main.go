// Command draind is the node-level connection drainer: the daemon (run), its
// debugging tools (status, bpf dump) and operator drains (drain, undrain).
// The demo is its own command (cmd/draind-demo): this binary carries no
// test code.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
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
