// Command benchtable reads the output of `go test -bench` (several runs of
// the same benchmarks, from files or stdin) and prints, per benchmark and
// metric, the number of runs, the median and the range, so that a figure
// is never one run's; with -get it prints one statistic for a script to
// compare (test/bench.sh, .ci/run).
//
//	benchtable run1.txt run2.txt ...
//	benchtable -get 'BenchmarkClusterScale/endpoints=150k' p99-ms max run*.txt
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// results are the runs' values by benchmark and metric, in the order they
// first appear.
type results struct {
	names   []string
	metrics map[string][]string
	values  map[string]map[string][]float64
}

// procSuffix is the -GOMAXPROCS suffix of a benchmark name.
var procSuffix = regexp.MustCompile(`-\d+$`)

func (r *results) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// BenchmarkX-2  <iterations>  <value> <unit>  <value> <unit> ...
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procSuffix.ReplaceAllString(f[0], "")
		if r.values[name] == nil {
			r.names = append(r.names, name)
			r.values[name] = map[string][]float64{}
		}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("reading %s: value %q of %s: %w", name, f[i], f[i+1], err)
			}
			unit := f[i+1]
			if unit == "ns/op" {
				continue // the benchmarks' own figures say what was timed
			}
			if _, ok := r.values[name][unit]; !ok {
				r.metrics[name] = append(r.metrics[name], unit)
			}
			r.values[name][unit] = append(r.values[name][unit], v)
		}
	}
	return sc.Err()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func stat(v []float64, which string) (float64, error) {
	switch which {
	case "median":
		return median(v), nil
	case "max":
		return slices.Max(v), nil
	case "min":
		return slices.Min(v), nil
	}
	return 0, fmt.Errorf("unknown statistic %q (median, min, max)", which)
}

func format(v float64) string {
	switch a := max(v, -v); {
	case a >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func (r *results) print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "benchmark\tmetric\truns\tmedian\trange")
	for _, name := range r.names {
		for i, m := range r.metrics[name] {
			v := r.values[name][m]
			label := ""
			if i == 0 {
				label = strings.TrimPrefix(name, "Benchmark")
			}
			rng := format(v[0])
			if len(v) > 1 {
				rng = format(slices.Min(v)) + " – " + format(slices.Max(v))
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", label, m, len(v), format(median(v)), rng)
		}
	}
	return tw.Flush()
}

func run() error {
	get := flag.Bool("get", false, "print one statistic: -get <benchmark> <metric> <median|min|max> files...")
	flag.Parse()
	args := flag.Args()
	var query []string
	if *get {
		if len(args) < 3 {
			return errors.New("-get needs a benchmark, a metric and a statistic")
		}
		query, args = args[:3], args[3:]
	}
	r := &results{metrics: map[string][]string{}, values: map[string]map[string][]float64{}}
	if len(args) == 0 {
		if err := r.read(os.Stdin); err != nil {
			return err
		}
	}
	for _, path := range args {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("reading benchmark output: %w", err)
		}
		err = r.read(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
	}
	if query == nil {
		return r.print(os.Stdout)
	}
	v := r.values[query[0]][query[1]]
	if len(v) == 0 {
		return fmt.Errorf("no %s figure of %s in the output", query[1], query[0])
	}
	s, err := stat(v, query[2])
	if err != nil {
		return err
	}
	fmt.Println(strconv.FormatFloat(s, 'f', -1, 64))
	return nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}
