package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envPrefix names every flag's environment fallback: --entry-ttl reads
// DRAIND_ENTRY_TTL when the flag is not given.
const envPrefix = "DRAIND_"

func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// withEnv documents the environment fallback of every flag of cmd and
// applies it before the command runs. Explicit flags win.
func withEnv(cmd *cobra.Command) {
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		f.Usage = fmt.Sprintf("%s (env %s)", f.Usage, envName(f.Name))
	})
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		var err error
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if err != nil || f.Changed {
				return
			}
			if v, ok := os.LookupEnv(envName(f.Name)); ok {
				if e := c.Flags().Set(f.Name, v); e != nil {
					err = fmt.Errorf("environment %s=%q: %w", envName(f.Name), v, e)
				}
			}
		})
		if err == nil && prev != nil {
			err = prev(c, args)
		}
		return err
	}
}
