// Package bed builds network test beds on one machine without containers:
// network namespaces as "nodes" and "pods", routed veths between them, cgroup
// v2 children so a pod's processes sit under its node's pods cgroup (where
// draind's hooks attach), and helper processes (servers, clients) placed in a
// pod's namespace and cgroup.
//
// The helper processes are the calling binary itself, re-executed: every
// binary that starts them (test binaries, draind for its demo) must call
// HelperMain first thing in main/TestMain.
//
// Everything a bed creates is removed by its Close (tests: t.Cleanup).
//
// Its files:
//
//   - topo.go: the Bed and its nodes; netns.go: network namespaces;
//     cgroup.go: cgroup v2 children; bpffs.go: a private BPF filesystem;
//   - pod.go: pods in a node (addresses, routes, processes); reroute.go:
//     routing addresses via another node; release.go: freeing a departed
//     pod's addresses for a new pod;
//   - clusterip.go and nat.go: Service ClusterIPs as nftables NAT in a
//     node, and a SYN counter;
//   - proc.go: helper processes in a pod; helper.go: what they run (the
//     requests, servers and clients); keepalive.go: a keep-alive client's
//     samples;
//   - priv.go: whether the root-only tests can run here, and why not.
//
// Words are defined in the repository's docs/glossary.md.
package bed
