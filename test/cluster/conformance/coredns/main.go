// Command coredns is CoreDNS built from its Go module with the plugins the
// bed's cluster DNS and the upstream DNS specs use, nothing else: the
// cluster DNS (package realnode's ClusterDNS: kubernetes, errors, cache,
// loadbalance, ready, bind) and the server the e2e suite runs from the
// agnhost image as /coredns (hosts, log). Package e2ebin builds it with
// the suite and caches it.
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"github.com/coredns/coredns/coremain"

	// The plugins this build registers (CoreDNS's own list orders them).
	_ "github.com/coredns/coredns/core/dnsserver"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
