// Package lease is the node's side of the drain and claim Lease protocol
// that needs nothing of the daemon's model: whether a Lease is believed,
// writing this node's Leases, and checking another node's Lease against
// its Pod object. Its files:
//
//   - believe.go: Judge, the one place that decides whether a drain or
//     claim Lease is believed (Judge.Believed): not expired, its holder
//     hosts the pod by the cluster's records (Record: this node's pods,
//     the trusted slices' listings as model.Claims keeps them, the Pod
//     object), only the pod's own IPs, one rule for every record
//     (hostedIPs);
//   - writer.go: Writer, this node's Lease writes (create, renew, delete)
//     off the loop that measures drains, the latest write per Lease, with
//     a transient and a refused backoff, and DeleteNow, a deletion its
//     caller waits for: the one code path that deletes a Lease; Permanent
//     and Gone classify a failed write;
//   - trust.go: Trust, the Pod-object read of a Lease whose pod no
//     trusted EndpointSlice lists, off the runner's path, judged by
//     believe.go's rule; its generation is the cache invariant the
//     daemon's memos rely on.
//
// "Believed" is decided here and nowhere else. Which of the pods that
// believed claims and the cluster's other records put at an IP owns it is
// a claim conflict, decided in package model (Claims.ClaimedByOther).
// Package hosted decides which Leases this node deletes (Drains.deletes,
// the one place); Writer deletes them. Terms are those of the daemon's
// glossary (package daemon's doc, docs/glossary.md).
package lease
