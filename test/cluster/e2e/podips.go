package e2e

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/draind/draind/test/bed"
)

// StagedPod is a bed pod whose server runs but whose Pod object does not
// exist yet: a test can then time from the instant the Pod appears.
type StagedPod struct {
	node   *Node
	bed    *bed.Pod
	server *bed.Proc
	name   string
	port   uint16
}

// StagePodIPs creates a bed pod on n with the addresses the caller chooses
// (either may be invalid for a single-stack pod) — a new pod that reuses a
// departed pod's IP, as a CNI's IPAM hands a freed address out again — and
// starts its server. The departed pod's bed pod must have been deleted; the
// addresses are released from it first (bed.Node.ReleaseAddrs). Register
// creates the Pod object.
func (n *Node) StagePodIPs(ctx context.Context, name string, port uint16, ip4, ip6 netip.Addr) (*StagedPod, error) {
	if err := n.Bed.ReleaseAddrs(ctx, ip4, ip6); err != nil {
		return nil, err
	}
	bp, err := n.Bed.AddPodIPs(name, ip4, ip6)
	if err != nil {
		return nil, fmt.Errorf("creating bed pod %s with %s %s: %w", name, ip4, ip6, err)
	}
	srv, err := startServer(bp, name, port)
	if err != nil {
		return nil, err
	}
	return &StagedPod{node: n, bed: bp, server: srv, name: name, port: port}, nil
}

// Register creates the Pod object, running and ready with the pod's
// addresses.
func (s *StagedPod) Register(ctx context.Context, namespace string, labels map[string]string) (*Pod, error) {
	return s.node.registerPod(ctx, s.bed, s.server, namespace, s.name, labels, s.port)
}

// StartPodIPs is StartPod with the addresses chosen by the caller (see
// StagePodIPs).
func (n *Node) StartPodIPs(ctx context.Context, namespace, name string, labels map[string]string, port uint16, ip4, ip6 netip.Addr) (*Pod, error) {
	s, err := n.StagePodIPs(ctx, name, port, ip4, ip6)
	if err != nil {
		return nil, err
	}
	return s.Register(ctx, namespace, labels)
}
