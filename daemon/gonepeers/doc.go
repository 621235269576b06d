// Package gonepeers ends client sockets to gone pods: it keeps the socket
// hooks' gone-peer and gone-flow maps in step with the pod drains. It
// reads the model only through View, a read-only view package model
// implements (Model.Gone), and never writes to it (see docs/glossary.md
// for its words). Its files:
//
//   - config.go: what it depends on (Config; View and Drain, the model's
//     read-only view; Sockets, the socket hooks' maps; State, the Services
//     and local pods);
//   - peers.go: Peers, the gone peers a pass computes from the view (the
//     Services noted for each pod drain, the desired set, what a pass's
//     changes touch) and writes as a difference;
//   - flows.go: the VIP client flows conntrack translated to a gone peer,
//     listed by their own goroutine.
//
// A pod is gone when the node hosting it says so: its pod object was
// deleted (after a graceful drain, or at once by a force delete, an
// eviction of a dead node's pod... any deletion) and that node's draind
// published its drain Lease with state gone (or, on that node itself, its
// hosted drain is gone). A pod that merely left a Service, or whose slice
// changed, is never gone. For every gone pod whose IP no other pod holds
// (claims, by pod UID) and whose Services do not opt out
// (draind.io/end-dead-connections: "false" on any Service that listed it:
// the most cautious wins), every node lists its IPs as gone peers: client
// sockets connected to them before that instant end at their next
// retransmission timeout (TCP) or send (connected UDP). Where the node's
// conntrack translated a client's flow to a Service VIP into the gone pod,
// the flow itself is listed (the socket only knows the VIP).
//
// Safety, in the order the kernel applies it: a socket whose peer answers
// never reaches the retransmission callback (a live pod is never touched,
// even one wrongly listed); a socket established after the pod's IP was
// listed (a new pod that reused the IP before its claim arrived) carries a
// timestamp and is spared; an IP claimed by another pod is unlisted at once.
package gonepeers
