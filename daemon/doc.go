// Package daemon is draind's node agent. Its files, by the data they own:
//
//   - what is draining: package model (pure, no API calls: categorize,
//     topology, contributions, ids, lingering, claims, pod drains, the
//     entries the kernel should hold; see its doc), zone.go (this node's
//     zone label), poddrains.go (the pod drains a pass hands the model,
//     from Leases and this node);
//   - which Leases are believed, and who writes them: package lease
//     decides whether a drain or claim Lease is believed (lease.Judge,
//     the one place; poddrains.go and claimleases.go hand it every Lease
//     they read), writes this node's Leases off the loop (lease.Writer)
//     and checks a Lease against its Pod object (lease.Trust);
//     claimleases.go (the believed claim Leases: an IP reused on another
//     node);
//   - what the kernel gets: package reconcile (the minimal, ordered diff,
//     reading the model through model.Desired), datapath.go
//     (the interface; its fake is package datapathtest),
//     kernelfeatures.go;
//   - drains hosted here: package hosted (measure, settle, Events, their
//     drain Leases and this node's claim Leases, the offline and online
//     calls; local pods that vanished without draining; see its doc);
//     hosted.go wires it (the loop of its rounds, the Lease writer, the
//     offline API's calls; the HTTP API is package nodeapi);
//   - what is expired: conntrackpolicy.go;
//   - the socket hooks: sockets.go (their part of the datapath; package
//     hosted counts live connections from them), sockets_gone.go
//     (the gone peers' wiring, reading model.Gone;
//     ending client sockets to gone peers is package gonepeers),
//     sockets_vanish.go (collecting endpoints that left without draining;
//     the model decides),
//     sockets_status.go;
//   - wiring: config.go (the one place defaults live), daemon.go
//     (construction; each part's goroutine is a runloop.Loop, package
//     internal/runloop), intake.go (informer events), pass.go
//     (one reconciler pass), runner.go, restart.go (what a restart keeps
//     steering); status.go, statusserver.go (the
//     root-only status socket), metrics.go, programming.go
//     (network-programming latency).
//
// Who runs a pass: the loop (runner.go) on a signal, at a deadline, for a
// refresh round; and the EndpointSlice watch's own goroutine right after an
// update's handler, when no pass is running (pass.go, passNow), so that a
// burst of updates on a busy node is written as it is read. Either holds
// modelMu, which owns the model and the reconciler.
//
// Incremental caches: a pass redoes only what changed, so each cache says
// at its declaration what it holds, what invalidates it and its invariant
// ("checked by FuzzSequenceDifferential", the test that compares, after
// every pass of random event sequences, the datapath with a fresh
// daemon's): the model (package model: Model.podDrainsGen, notesGen), the pod drains'
// memos (poddrains.go: podDrainsState.modelGen, leaseDrainsMemo), the
// Lease answers (lease.Trust's gen; model.Claims' gen), the gone
// peers (package gonepeers: noted, wantYet), the vanished endpoints
// (package model: vanishState.markedGen), the deleting pods' drains
// (package hosted: Drains.looked), the informer snapshots (daemon.go: local, leases) and the
// reconciler's view of the datapath (package reconcile). Turned off one at a
// time in BenchmarkClusterScale (150k endpoints, rollout churn), the gone
// peers' cache saves 3.5x the CPU per update and leaseDrainsMemo 1.8x;
// markedGen guards a slice rebalance the benchmark does not make, and
// looked also keeps a pod's Lease from being renewed on every pass. The
// hosts of each Lease are not memoized: such a memo shows no gain in the
// benchmark.
//
// The words of docs/glossary.md name these types: endpoint
// (bpf.EndpointKey; port 0 is every port of the address), service-port
// (bpf.ServicePortID), frontend (bpf.Frontend), pod drain
// (model.PodDrain), drain Lease (k8s.DrainLease), hosted drain (package
// hosted), drain entry (bpf.Drain; the model's contributions are the
// reasons for one, merged with the most cautious policy winning), pod
// status (PodStatus).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package daemon
