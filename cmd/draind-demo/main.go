// Command draind-demo builds a small test bed of network-namespace "nodes"
// and "pods" on this machine and shows a rolling update with preStop sleep
// and with draind, side by side, from real connections. It is its own
// command so that the daemon's binary carries no test bed, fake API server
// or demo.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/scenario"
	"github.com/draind/draind/test/scenario/embedded"
)

func main() {
	bed.HelperMain() // the demo's pods and clients run as re-executed helpers
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cmd := newDemoCmd()
	cmd.SetArgs(os.Args[1:])
	if err := cmd.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "draind-demo:", err)
		os.Exit(1)
	}
}

func newDemoCmd() *cobra.Command {
	var (
		opts     embedded.DemoOptions
		variants string
		verbose  bool
	)
	cmd := &cobra.Command{
		Use:           "draind-demo",
		SilenceUsage:  true,
		SilenceErrors: true,
		Short:         "Build a small test bed and show a rolling drain with and without draind",
		Long: `Build three network-namespace "nodes" on this machine, run a Service of 3 pods
on two of them and clients on the third (a ClusterIP client, a client that keeps
dialing an old pod IP from a stale registry cache, a keep-alive client), replace
the pods one by one, and print what the clients saw: once with preStop sleep 5,
once with draind (preStop calls /v1/offline?wait=30s).

The control plane is embedded (a fake API in this process, stand-ins for the
EndpointSlice controller, kube-proxy and the kubelet); draind is the real daemon
with the real BPF datapath and conntrack, one per node. Needs root and nothing
installed: network namespaces, links, NAT rules (nftables) and conntrack are all
programmed over netlink. Everything is removed at the end, also on Ctrl-C.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := scenario.ParseVariants(variants)
			if err != nil {
				return err
			}
			opts.Variants = vs
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			opts.Scenario.Log, opts.Cluster.Log = log, log
			start := time.Now()
			if _, err := embedded.Demo(cmd.Context(), opts, cmd.OutOrStdout()); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\n(demo took %v)\n", time.Since(start).Round(time.Second))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&variants, "variants", "sleep,draind", "variants to run: baseline, sleep, draind")
	f.DurationVar(&opts.Scenario.Tail, "tail", 30*time.Second, "keep the clients (and the stale-registry client's dials to an old pod IP) running this long after the rollout")
	f.DurationVar(&opts.Scenario.Warmup, "warmup", time.Second, "client traffic before the rollout")
	f.DurationVar(&opts.Scenario.Interval, "interval", 20*time.Millisecond, "new connection every interval (ClusterIP and stale-registry clients)")
	f.DurationVar(&opts.Scenario.KeepAliveMaxAge, "keepalive-max-age", time.Second, "the keep-alive client replaces its connection after this long (negative: never)")
	f.DurationVar(&opts.Scenario.SleepPreStop, "sleep", 5*time.Second, "preStop sleep of the sleep variant")
	f.DurationVar(&opts.Scenario.OfflineWait, "offline-wait", 30*time.Second, "?wait= of the draind variant's /v1/offline call")
	f.DurationVar(&opts.Scenario.Teardown, "teardown", 500*time.Millisecond, "a stopped pod's sandbox goes this long after its server")
	f.DurationVar(&opts.Cluster.SliceDelay, "slice-delay", 20*time.Millisecond, "EndpointSlice stand-in: pod change to slice update")
	f.DurationVar(&opts.Cluster.ProxySyncDelay, "proxy-sync-delay", 60*time.Millisecond, "kube-proxy stand-in: slice change to sync")
	f.DurationVar(&opts.Cluster.ProxyMinSyncPeriod, "proxy-min-sync-period", time.Second, "kube-proxy stand-in: at most one sync per period (--iptables-min-sync-period)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log more")
	return cmd
}
