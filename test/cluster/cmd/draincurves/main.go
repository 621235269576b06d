// Command draincurves renders a rollout's per-pod drain curves from
// Prometheus to a PNG: for each pod of a namespace that draind drained,
// its live connections, the new connections still reaching it and the
// connections steered away from it, with dashed lines where its drain
// began and where it was drained (no live connection left).
//
//	go run ./cmd/draincurves -prometheus http://127.0.0.1:9090 -namespace shop -since 15m -o rollout.png
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"gonum.org/v1/plot/vg"

	"github.com/draind/draind/test/cluster/draincurves"
)

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "draincurves:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "Prometheus base URL")
	ns := flag.String("namespace", "", "namespace of the rolled-out pods (required)")
	since := flag.Duration("since", 15*time.Minute, "start this long before -end")
	startFlag := flag.String("start", "", "start of the range, RFC 3339 (overrides -since)")
	endFlag := flag.String("end", "", "end of the range, RFC 3339 (default: now)")
	step := flag.Duration("step", time.Second, "resolution")
	rate := flag.Duration("rate", 0, "window of the rates, at least two scrape intervals (default: 4 steps, 10s at least)")
	out := flag.String("o", "drain-curves.png", "PNG file to write")
	width := flag.Float64("width", 10, "width in inches (96 dpi)")
	height := flag.Float64("height", 9, "height in inches")
	flag.Parse()
	if *ns == "" {
		return fmt.Errorf("-namespace is required")
	}
	end := time.Now()
	if *endFlag != "" {
		t, err := time.Parse(time.RFC3339, *endFlag)
		if err != nil {
			return fmt.Errorf("parsing -end: %w", err)
		}
		end = t
	}
	start := end.Add(-*since)
	if *startFlag != "" {
		t, err := time.Parse(time.RFC3339, *startFlag)
		if err != nil {
			return fmt.Errorf("parsing -start: %w", err)
		}
		start = t
	}
	if *rate == 0 {
		*rate = max(4**step, 10*time.Second)
	}
	c, err := draincurves.FetchRate(ctx, *prom, *ns, start, end, *step, *rate)
	if err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := draincurves.Render(c, f, vg.Length(*width)*vg.Inch, vg.Length(*height)*vg.Inch); err != nil {
		f.Close()
		return err
	}
	fmt.Printf("%s: %d pods of %s\n", *out, len(c.Pods()), *ns)
	return f.Close()
}
