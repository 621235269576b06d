// Package hosted is the drains of the pods this node hosts (hosted
// drains): the node that can see whether anything still reaches a pod
// measures its SYNs and live connections, settles it drained or timed
// out, tells the pod's Kubernetes Events, holds and writes its drain
// Lease, answers its offline and online calls, and publishes the claim
// Leases of its pods at reused IPs. Package daemon wires it: it runs the
// rounds (Drains.Reconcile), sends the Lease writes the drains decide
// (lease.Writer), reads the drains into the model (EachPodDrain) and shows
// their Progress. Its files:
//
//   - config.go: what it depends on (Config; State, the informers' drain
//     and claim Leases; Claims; Datapath, Sockets and Conntrack, where
//     SYNs and live connections are read; Publisher and LeaseWriter, how
//     Leases are written; Metrics);
//   - drains.go: Drains, the set of hosted drains, their Events, what the
//     Daemon reads of them (EachPodDrain, Progress) and tells them
//     (SetKeys, SawLease, ObserveLocalPods); LocalPods, this node's pods
//     as a snapshot;
//   - drain.go: one hosted drain, its states and Event reasons, and the
//     progress its Lease carries;
//   - reconcile.go: a round (Reconcile) and how a drain moves on; the one
//     place that decides that a deleting local pod drains (drainDeleting),
//     and the gone drains of pods that vanished without one;
//   - leases.go: this node's drain Leases: which it deletes (deletes, the
//     one place), what it publishes, and the writer's results
//     (LeaseWritten);
//   - claims.go: this node's claim Leases (an IP reused on another node);
//   - measure.go: measuring SYNs and live connections, settling drained
//     and timed out, answering waiters;
//   - live.go: live connections by source (the socket hooks, conntrack);
//   - offline.go: the offline and online calls (Offline, Online), the
//     caller's pod, and the wait slots (the HTTP API is package nodeapi).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package hosted
