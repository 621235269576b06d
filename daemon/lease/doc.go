// Package lease is the node's side of the drain and claim Lease protocol
// that needs nothing of the daemon's model: writing this node's Leases, and
// checking another node's Lease against its Pod object. Its files:
//
//   - writer.go: Writer, this node's Lease writes (create, renew, delete)
//     off the loop that measures drains, the latest write per Lease, with
//     a transient and a refused backoff; Permanent and Gone classify a
//     failed write;
//   - trust.go: Trust, the Pod-object check of a Lease whose pod no
//     trusted EndpointSlice lists (its holder must host the pod, only the
//     pod's own IPs count), off the runner's path; its generation is the
//     cache invariant the daemon's memos rely on.
//
// Package daemon decides whether a Lease is believed (honouredIPs, which
// asks Trust only for pods no trusted slice lists) and which Leases this
// node deletes (hostedDrains.deleteLease, the one place). Terms are those
// of the daemon's glossary (package daemon's doc, docs/glossary.md).
package lease
