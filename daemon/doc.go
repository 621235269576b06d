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
// Glossary (one name per concept):
//
//   - endpoint: an (address, port, protocol) of a pod, as an EndpointSlice
//     lists it (bpf.EndpointKey); port 0 means every port of the address.
//   - service-port: one port of one Service in one IP family; the unit that
//     owns a selectable backend set and a numeric id in the maps
//     (model's servicePortKey, bpf.ServicePortID).
//   - frontend: a ClusterIP:port of a service-port (bpf.Frontend).
//   - selectable: a ready, non-draining endpoint a connection may be sent to.
//   - pod drain: the cluster-wide fact that a pod takes no new connections,
//     from its drain Lease or from this node's own knowledge of a pod it
//     hosts (model.PodDrain). A draining endpoint is an endpoint of a drained pod
//     or one its slice marks terminating or not ready.
//   - drain Lease: the API object that carries a pod drain to every node
//     (k8s.DrainLease); its holder is the node that hosts the pod.
//   - hosted drain: this node's part of a drain of a pod it hosts: the
//     Lease, SYN and connection counts, the offline waiters, the Events
//     (package hosted).
//   - drain entry: one datapath entry for a draining endpoint, with its
//     policy (bpf.Drain); contributions are the reasons for it (a
//     service-port, a pod drain's all-ports entry, a linger), merged with the
//     most cautious policy winning.
//   - departure: a draining endpoint that left every slice; it lingers
//     (stays steered) for --linger unless another pod claims its IP.
//   - claim: a pod's ownership of an IP (a ready listing, or a pod on this
//     node); identity is the pod UID, never the IP.
//   - pod status: the status view of one drained pod (PodStatus).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package daemon
