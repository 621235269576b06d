package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/bpf"
)

func newBPFCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "bpf", Short: "Inspect the datapath"}
	var dir, output string
	dump := &cobra.Command{
		Use:   "dump",
		Short: "Print the pinned maps (works while the daemon is down)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := bpf.OpenPinned(dir)
			if err != nil {
				return err
			}
			defer p.Close()
			d, err := p.Dump()
			if err != nil {
				return err
			}
			return printDump(cmd.OutOrStdout(), d, output, time.Now())
		},
	}
	dump.Flags().StringVar(&dir, "bpffs-dir", bpf.DefaultPinDir, "bpffs directory of the pinned maps")
	dump.Flags().StringVarP(&output, "output", "o", "", "output format: json (default: text)")
	withEnv(dump) // DRAIND_BPFFS_DIR, as the DaemonSet sets it for run
	var rmDir string
	remove := &cobra.Command{
		Use:   "remove",
		Short: "Detach the programs and delete the pins (uninstall; the daemon must be stopped)",
		Long: `Pinned links keep the hooks attached while draind restarts or upgrades, so
deleting the DaemonSet leaves them in place (passing everything through once
their entries expire). This detaches them and removes every pin.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bpf.Remove(rmDir); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed draind's programs and pins under %s\n", rmDir)
			return nil
		},
	}
	remove.Flags().StringVar(&rmDir, "bpffs-dir", bpf.DefaultPinDir, "bpffs directory of the pins")
	withEnv(remove)
	cmd.AddCommand(dump, remove)
	return cmd
}

// dumpJSON is the stable JSON form of a dump.
type dumpJSON struct {
	Frontends []bpf.Frontend               `json:"frontends"`
	Backends  []bpf.Backends               `json:"backends"`
	Drains    []bpf.Drain                  `json:"drains"`
	Stats     map[string]bpf.DrainStats    `json:"stats"`
	Counters  map[string]map[string]uint64 `json:"counters"`
}

func printDump(w io.Writer, d *bpf.Dump, output string, now time.Time) error {
	switch output {
	case "json":
		out := dumpJSON{Frontends: d.Frontends, Backends: d.Backends, Drains: d.Drains,
			Stats: map[string]bpf.DrainStats{}, Counters: map[string]map[string]uint64{}}
		for k, s := range d.Stats {
			out.Stats[k.String()] = s
		}
		for o := bpf.Outcome(0); int(o) < bpf.NumOutcomes; o++ {
			out.Counters[o.String()] = map[string]uint64{"ipv4": d.Counters.Get(o, bpf.IPv4), "ipv6": d.Counters.Get(o, bpf.IPv6)}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	case "":
	default:
		return fmt.Errorf("unknown output format %q (want json)", output)
	}
	return d.WriteText(w, now)
}
