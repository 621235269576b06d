package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "draind",
		Short:         "Node-level eBPF connection drainer for Kubernetes",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRunCmd(), newStatusCmd(), newDrainCmd(), newUndrainCmd(), newDrainsCmd(), newBPFCmd(), withThen(newOfflineCmd()), newCopySelfCmd(), newWebhookCmd(), newVersionCmd())
	return root
}
