// Package bpf is draind's datapath: the connect4/connect6 steering hooks,
// the sendmsg/recvmsg hooks that steer unconnected UDP datagram by datagram,
// the SYN observer, and (with Options.Sockets) the socket hooks that count
// live connections per pod address and end client sockets pinned to gone
// pods (C sources in this directory, compiled by bpf2go), and a small typed
// API to load them, attach them to the pods' cgroup and fill their maps.
//
// Maps and links are pinned under a bpffs directory, so a restart or an
// upgrade of draind keeps steering: Load adopts what is pinned, Attach swaps
// the programs of pinned links in place. Every steering entry carries an
// expiry the programs check, so if draind dies for good steering stops by
// itself at the deadline.
//
// Every hook first reads one flag, "something drains on this node"
// (draind_node): while no frontend or drain entry exists, a connect(), a
// datagram or a packet costs that one array lookup. The Datapath keeps the
// flag true from before the first entry is written until after the last one
// is deleted, and recomputes it from the maps when it adopts them. It assumes
// it is the only writer of its pin directory (as the backend generations of
// SetBackends do).
//
// Its files:
//
//   - datapath.go: Datapath (Load, Attach, the steering maps' writes,
//     Prune, counters, statistics and Dump), Pinned (the pinned maps read
//     without loading programs, for `draind bpf dump`), Remove (uninstall);
//   - sockets.go: the socket hooks (sockops.c, egress.c) and their maps:
//     live connections and gone peers and flows;
//   - types.go: the maps' Go types (EndpointKey, Frontend, Drain, Backends,
//     DrainStats, Counters, Dump) and the policies and outcomes;
//   - probe.go: Probe, what the running kernel offers (Features);
//     features.go: the features that depend on the kernel, and the
//     explanation of a failed load (missing capabilities, memlock);
//   - cgroup.go: finding the cgroup v2 mount and the pods' cgroup;
//     clock.go: the boot clock the programs compare expiries with;
//     dumptext.go: the text form of a dump and draind's short durations;
//   - gen.go: the go:generate lines of bpf2go; egress_bpfel.go,
//     observe_bpfel.go, sockops_bpfel.go, steer_bpfel.go, udp_bpfel.go:
//     what bpf2go generates from the C sources of the same names (the
//     programs' and maps' Go bindings, embedding the *_bpfel.o objects);
//     never edited by hand.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package bpf
