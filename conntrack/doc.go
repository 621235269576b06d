// Package conntrack expires and counts connection-tracking flows by endpoint.
//
// Steering in bpf/ only governs new connections. Conntrack keeps old
// decisions alive: UDP flows stay pinned to a draining pod until they idle
// out, and TCP entries to a departed pod live for days, so clients send into
// a black hole instead of failing fast. This package is the mechanism that
// removes those entries; the policy (what to expire, when) lives in daemon/.
//
// The netlink implementation never dumps the whole table per event: dumps are
// filtered in the kernel (CTA_FILTER on the reply tuple, CTA_ZONE on the
// zone) and deletions are batched, so expiring many endpoints costs one pass
// each. The kernel filter only narrows the dump; every returned flow is
// re-checked in userspace with the exported rules (FilterSet.Classify,
// CountedFor) that the test double in conntrack/conntracktest applies too,
// so a kernel filter that mis-compares (the IPv6 address comparison is
// inverted up to at least 6.18; Netlink probes for it and then filters IPv6
// by protocol and port only) or that an older kernel ignores (zones before
// 6.8) costs speed, never correctness.
//
// Expiry and counting act in one conntrack zone only (Options.Zone, 0 by
// default): a flow with the same tuple in another zone belongs to someone
// else (another tenant's VRF, a CNI that separates pods by zone) and is
// neither deleted nor counted.
//
// The transport (sockets, sequence numbers, batched sends, multipart dumps,
// error replies) is github.com/mdlayher/netlink; github.com/ti-mo/conntrack
// creates and removes the throwaway flow of the IPv6 probe. What this
// package writes itself is what neither offers: the tuple-filtered dump
// request, a flow parser that allocates nothing per flow, and a delete
// encoder that reuses one buffer (msg.go).
//
// It needs CAP_NET_ADMIN only: without Options.NetNS it never enters a
// namespace (setns would need CAP_SYS_ADMIN, which the DaemonSet lacks).
//
// Its files:
//
//   - conntrack.go: what callers use: Interface, Filter (the flows of one
//     endpoint), Proto, ExpireResult, Counts and TCPState;
//   - netlink.go: Netlink, the real Interface over ctnetlink (Open, the two
//     connections, the filtered dumps and the batched deletes, the IPv6
//     filter probe); msg.go: the messages it builds and parses itself;
//   - match.go: Flow and Tuple, and the matching rules Netlink and
//     conntracktest.Fake both apply to a flow: FilterSet (validated
//     filters for a zone) and its Classify, which gives a Verdict;
//     CountedFor and Counts.Add;
//   - flows.go: FlowLister, the flows of one endpoint listed whole (the
//     gone peers' client flows).
//
// The in-memory Interface for tests of daemon/ is conntracktest.Fake, in
// conntrack/conntracktest.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package conntrack
