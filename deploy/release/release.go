// Package release names draind's release version and says how a build of
// cmd/draind is stamped with it. The Dockerfile, the kustomize base's image
// tag and any image builder take the version from here (tests keep them in
// step), so a release is one edit of Version.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package release

import (
	"fmt"
	"strings"
)

// Version is the release this tree builds: the default of a build that is
// not stamped otherwise, the Dockerfile's VERSION default and the image tag
// the kustomize base deploys.
const Version = "v0.2.0"

// Stamp is what a build records about itself.
type Stamp struct {
	Version string // e.g. v0.2.0; empty: Version
	Commit  string // the source revision (git rev-parse HEAD)
	Date    string // the build time, RFC 3339 in UTC
}

// Variables of cmd/draind's package main that LDFlags sets.
const (
	VarVersion = "main.version"
	VarCommit  = "main.commit"
	VarDate    = "main.date"
)

// LDFlags returns the -ldflags -X arguments that stamp cmd/draind with s
// (without -s -w, which the caller adds for a release image). Empty fields
// are left out, so the binary falls back to its defaults (Version, and the
// Go toolchain's VCS information).
func LDFlags(s Stamp) string {
	if s.Version == "" {
		s.Version = Version
	}
	var parts []string
	for _, kv := range [][2]string{{VarVersion, s.Version}, {VarCommit, s.Commit}, {VarDate, s.Date}} {
		if kv[1] == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("-X %s=%s", kv[0], kv[1]))
	}
	return strings.Join(parts, " ")
}
