// Package model decides what is draining. It turns the cached Kubernetes
// state (Services, EndpointSlices, drain Leases, this node's pods, read
// through State) into the drain entries and service-ports the kernel
// should hold, incrementally, and makes no API call and no datapath write
// of its own: the daemon runs a pass on the goroutine that owns the model,
// the reconciler (package reconcile) reads what it wants through Desired,
// and what changed comes back as values (RecomputeService's changed,
// SetPodDrains's changed drains, TakeDepartures, TakeRevisit). Its files:
//
//   - categorize.go: one Service's endpoints, selectable or draining and
//     why (a pure function, like kube-proxy's CategorizeEndpoints);
//     topology.go: the backends kube-proxy's topology would pick here;
//   - model.go: the incremental model; contributions.go: what each
//     Service, pod drain and linger contributes to a drain entry; ids.go:
//     service-port ids (backend sets are packed by internal/backendset);
//   - poddrain.go: drains of whole pods (from Leases and this node);
//     lingering.go: departed endpoints still steered; vanish.go:
//     endpoints that left their slices without draining; claims.go: which
//     pods own an IP (identity is the pod UID, never the IP);
//   - desired.go: the entries the kernel should hold, merged per key;
//     goneview.go: the read-only view the gone peers read (package
//     gonepeers); servicestatus.go: the status view of the active
//     service-ports.
//
// Words are defined in the repository's docs/glossary.md.
package model
