package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/draind/draind/deploy/release"
)

// Set at link time by release.LDFlags (the Dockerfile, image builders):
// -X main.version=v0.2.0 -X main.commit=<sha> -X main.date=<RFC 3339>.
var (
	version = release.Version
	commit  = ""
	date    = ""
)

// buildInfo is what `draind version` prints.
type buildInfo struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	Date      string `json:"date"`
	GoVersion string `json:"go_version"`
	Platform  string `json:"platform"`
}

// currentBuild reads the stamp, falling back to what the Go toolchain
// recorded (vcs.revision and vcs.time of a build inside a git checkout).
func currentBuild() buildInfo {
	b := buildInfo{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		b.GoVersion = bi.GoVersion
		modified := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Commit == "" {
					b.Commit = s.Value
				}
			case "vcs.time":
				if b.Date == "" {
					b.Date = s.Value
				}
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if modified && commit == "" && b.Commit != "" {
			b.Commit += "-dirty"
		}
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	if b.Date == "" {
		b.Date = "unknown"
	}
	return b
}

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, build date and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd.OutOrStdout(), currentBuild(), output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json (default: text)")
	return cmd
}

func printVersion(w io.Writer, b buildInfo, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(b)
	case "":
	default:
		return fmt.Errorf("unknown output format %q (want json)", output)
	}
	fmt.Fprintf(w, "draind %s\n", b.Version)
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "  commit:\t%s\n", b.Commit)
	fmt.Fprintf(tw, "  built:\t%s\n", b.Date)
	fmt.Fprintf(tw, "  go:\t%s\n", b.GoVersion)
	fmt.Fprintf(tw, "  platform:\t%s\n", b.Platform)
	return tw.Flush()
}
