package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time (-X main.version=...).
var version = "dev"

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "draind",
		Short:         "Node-level eBPF connection drainer for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newStatusCmd(), newDrainCmd(), newUndrainCmd(), newBPFCmd(), newOfflineCmd(), newCopySelfCmd(), newVersionCmd())
	return root
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		RunE: func(cmd *cobra.Command, _ []string) error {
			rev := ""
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						rev = " " + s.Value
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "draind %s%s\n", version, rev)
			return nil
		},
	}
}
