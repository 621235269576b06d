// Command draind is the node-level connection drainer: the daemon (run), its
// debugging tools (status, bpf dump) and operator drains (drain, undrain).
// The demo is its own command (cmd/draind-demo): this binary carries no
// test code.
//
// Its files, one per subcommand where it has its own:
//
//   - main.go: the entry point; root.go: the root command and its
//     subcommands; flags.go: every flag's DRAIND_ environment fallback;
//   - run.go: `draind run`, the DaemonSet's command: its flags (bound to
//     daemon.Config's settings, the one place defaults live), the kernel
//     check, the listeners, the datapath and conntrack, the daemon and its
//     servers;
//   - status.go: `draind status`, read from the daemon's status socket;
//     bpfdump.go: `draind bpf dump` and `draind bpf remove`, straight from
//     the pinned maps;
//   - drain.go: `draind drain` and `draind undrain`, an operator's drain
//     through the pod's drain Lease; drains.go: `draind drains`, every
//     drain of the cluster from its Leases and EndpointSlices;
//   - offline.go: `draind offline`, the preStop client of the node's
//     offline API; webhook_prestop.go: its --then-* flags, the preStop
//     handler a pod had before the webhook injected the call;
//     copyself.go: `draind copy-self`, which puts the binary into a
//     shared volume for images without a shell;
//   - webhook.go: `draind webhook`, the admission webhook's server (its
//     handler and certificates are package k8s/inject/webhook);
//   - version.go: `draind version` and the build's stamp.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package main
