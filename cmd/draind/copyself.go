package main

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// newCopySelfCmd copies the binary into a shared volume, so images without
// a shell can run `draind offline` from their preStop hook (the draind image
// has no cp either).
func newCopySelfCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "copy-self DEST",
		Short: "Copy this binary to DEST (an init container's way to hand it to the app container)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			self, err := os.Executable()
			if err != nil {
				return fmt.Errorf("finding own executable: %w", err)
			}
			src, err := os.Open(self)
			if err != nil {
				return fmt.Errorf("reading %s: %w", self, err)
			}
			defer src.Close()
			tmp := args[0] + ".tmp"
			dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
			if err != nil {
				return fmt.Errorf("creating %s: %w", tmp, err)
			}
			if _, err := io.Copy(dst, src); err != nil {
				dst.Close()
				return fmt.Errorf("copying to %s: %w", tmp, err)
			}
			if err := dst.Close(); err != nil {
				return err
			}
			return os.Rename(tmp, args[0])
		},
	}
}
