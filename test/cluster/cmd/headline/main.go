// Command headline runs draind's headline scenario on real Kubernetes
// (kube-apiserver, the EndpointSlice controller and kube-proxy, built by
// kubebin on first use) and prints the side-by-side table:
//
//	cd test/cluster && sudo go run ./cmd/headline
//
// Variants baseline, sleep and draind, quiet and under load; -tail sets the
// traffic after each rollout (a minute by default). It exits non-zero when
// the results contradict draind's claims (see headline.Check).
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/scenario"
)

func main() {
	bed.HelperMain() // the scenario's pods and clients re-execute this binary
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "headline:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	tail := flag.Duration("tail", time.Minute, "traffic after each rollout (the stale-registry client keeps dialing its old pod IP)")
	variants := flag.String("variants", "baseline,sleep,draind,baseline+load,sleep+load,draind+load", "variants to run, in order")
	services := flag.Int("load-services", 2000, "extra Services of the +load variants")
	churn := flag.Int("load-churn", 20, "EndpointSlice updates per second during +load variants")
	keep := flag.String("keep", "", "keep the cluster's and draind's files (logs) in this directory")
	flag.Parse()
	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces, cgroups, BPF): sudo go run ./cmd/headline")
	}
	vs, err := scenario.ParseVariants(*variants)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	start := time.Now()
	kcfg := kube.Config{Log: log}
	var hdir string
	if *keep != "" {
		kcfg.Dir = *keep + "/cluster"
		hdir = *keep + "/headline"
		for _, d := range []string{kcfg.Dir, hdir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	kc, err := kube.Start(ctx, kcfg)
	if err != nil {
		return err
	}
	defer kc.Stop()
	c, err := headline.Start(ctx, kc, headline.Config{Log: log, LoadServices: *services, LoadChurn: *churn, Dir: hdir})
	if err != nil {
		return err
	}
	defer c.Close()
	results, err := headline.RunVariants(ctx, c, scenario.Config{Tail: *tail, Log: log}, vs)
	fmt.Println()
	if werr := scenario.WriteTable(os.Stdout, results); werr != nil {
		return werr
	}
	fmt.Printf("\n(%v in all)\n", time.Since(start).Round(time.Second))
	if err != nil {
		return err
	}
	problems := append(headline.Check(results), headline.CheckDraindLogs(c)...)
	if len(problems) > 0 {
		return fmt.Errorf("the results contradict draind's claims:\n  %s", strings.Join(problems, "\n  "))
	}
	fmt.Println("checks passed: draind variants without failures, baseline with failures, every draind preStop shorter than sleep's")
	return nil
}
