// Package k8s is draind's view of the Kubernetes API: informers that cache
// slim objects (only what the drain model reads, so that a node watching
// every EndpointSlice of a 100,000-endpoint cluster stays small), and the
// drain Lease protocol by which any node tells every other node that a pod
// is going offline.
//
// Its files:
//
//   - types.go: the slim objects (Service, Slice, Endpoint, Pod), the
//     annotations draind reads, SliceFrom and the node-name table
//     (NodeTable) slices number their nodes in;
//   - hints.go: the topology hints of a slice's endpoints, packed;
//   - slicewire.go: SliceFromProto, an EndpointSlice's protobuf decoded
//     straight into a Slice; slicecodec.go: the watch's serializer and
//     decoder that use it;
//   - sliceinformer.go: SliceInformer, the EndpointSlice watch that calls
//     its handlers in the reflector's own goroutine; informers.go:
//     Informers, draind's four watches and their transforms;
//     reconnect.go: list and watch calls retried while the API server is
//     unreachable;
//   - meta.go: Meta, the metadata kept of a cached object, and Receipt,
//     when it was received;
//   - lease.go: the drain and claim Lease protocol (DrainLease and
//     ParseLease; Leases: publish, renew, delete; the progress the hosting
//     node writes).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package k8s
