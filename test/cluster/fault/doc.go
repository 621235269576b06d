// Package fault holds the real-bed tests of draind under the faults every
// real cluster has: its own restart at any instant (kill -9 in a
// loop), an API server outage longer than the drain Lease, and the reuse of
// a departed pod's IP by a pod in no Service; plus a headless Service's gone
// pod, whose IP must not be refused, and a tenant's forged EndpointSlices,
// which must not move another namespace's traffic.
//
// Everything is real except the kubelet: kube-apiserver with embedded etcd,
// the EndpointSlice controller, kube-proxy in iptables mode per node
// (network namespaces of test/bed), and `draind run` as a separate process
// per node with the RBAC of deploy/daemonset (package headline). Clients run
// inside bed pods; what reached which pod is what the pods' servers say
// (they greet every connection with the pod's name), and what draind
// steers is read from each daemon's pinned maps (bpf.OpenPinned).
//
// The tests are root-only (PRIVILEGED_TESTS=1) and share one control plane
// per test binary. Their durations are configurable through the
// environment (see the DRAIND_FAULT_* constants).
//
// Words are defined in the repository's docs/glossary.md.
package fault
