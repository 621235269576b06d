package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/scenario"
)

// DemoOptions configure Demo.
type DemoOptions struct {
	Scenario scenario.Config
	Cluster  Config
	// Variants default to sleep and draind.
	Variants []scenario.Variant
}

// Demo runs the scenario once per variant, each on a fresh embedded
// cluster, and writes the side-by-side table to out. Everything it creates
// is removed before it returns, also when ctx is cancelled.
func Demo(ctx context.Context, opts DemoOptions, out io.Writer) ([]*scenario.Result, error) {
	if err := Preflight(); err != nil {
		return nil, err
	}
	variants := opts.Variants
	if len(variants) == 0 {
		variants = []scenario.Variant{scenario.Sleep, scenario.Draind}
	}
	var results []*scenario.Result
	for _, v := range variants {
		res, err := demoVariant(ctx, opts, v)
		if err != nil {
			return results, err
		}
		results = append(results, res)
	}
	fmt.Fprintln(out)
	return results, scenario.WriteTable(out, results)
}

func demoVariant(ctx context.Context, opts DemoOptions, v scenario.Variant) (_ *scenario.Result, err error) {
	c, err := New(ctx, opts.Cluster)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := c.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("removing the %s variant's test bed: %w", v.Label(), cerr))
		}
	}()
	return scenario.Run(ctx, c, opts.Scenario, v)
}

// Preflight says clearly what is missing for the demo: root, cgroup v2, the
// kernel features of the datapath. It needs no program on the PATH: links,
// addresses, NAT rules (nftables), conntrack and BPF all go over netlink or
// bpf(2).
func Preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("the demo must run as root: it creates network namespaces, cgroups, NAT rules and BPF programs (sudo -i, then go run ./cmd/draind-demo)")
	}
	if _, err := bpf.Cgroup2Mount(); err != nil {
		return fmt.Errorf("the demo needs cgroup v2: %w", err)
	}
	if _, err := bpf.Probe(); err != nil {
		return fmt.Errorf("this kernel cannot run draind's datapath: %w", err)
	}
	return nil
}
