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
package bed
