// Package e2e joins test/bed's network-namespace nodes and pods to a real
// control plane (package kube): a bed node becomes a cluster Node with its
// own kube-proxy, a bed pod running a server becomes a running, ready Pod.
// The end-to-end scenarios are built from these pieces.
//
// Words are defined in the repository's docs/glossary.md.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

// Node is one bed node registered in the cluster, with kube-proxy running
// in it, and the stand-in kubelet that manages its pods.
type Node struct {
	Bed     *bed.Node
	Kube    *kube.Node
	Kubelet *kube.Kubelet
}

// AddNode creates a bed node (joined to the bed's other nodes) and registers
// it as a cluster Node with kube-proxy. The bed's Close removes the
// namespace; the cluster's Stop stops kube-proxy.
func AddNode(ctx context.Context, c *kube.Cluster, b *bed.Bed, name string) (*Node, error) {
	bn, err := b.AddNode(name)
	if err != nil {
		return nil, fmt.Errorf("creating bed node %s: %w", name, err)
	}
	kn, err := c.AddNode(ctx, kube.NodeConfig{
		Name:        name,
		NetnsPath:   bn.NS.Path(),
		InternalIPs: []netip.Addr{bn.IP4, bn.IP6},
		PodCIDRs:    []netip.Prefix{bn.PodCIDR4, bn.PodCIDR6},
	})
	if err != nil {
		return nil, err
	}
	return &Node{Bed: bn, Kube: kn, Kubelet: c.Kubelet(kn)}, nil
}

// Pod is a bed pod whose server answers on Port, registered as a running,
// ready Pod on its node.
type Pod struct {
	Node      *Node
	Bed       *bed.Pod
	Server    *bed.Proc
	Namespace string
	Name      string
	Port      uint16
}

// StartPod creates a bed pod on n, starts a server in it that greets every
// connection on port (both families) with the pod's name, and creates the
// Pod object (labels as given) reported running and ready with the pod's
// addresses.
func (n *Node) StartPod(ctx context.Context, namespace, name string, labels map[string]string, port uint16) (*Pod, error) {
	bp, err := n.Bed.AddPod(name)
	if err != nil {
		return nil, fmt.Errorf("creating bed pod %s: %w", name, err)
	}
	return n.runPod(ctx, bp, namespace, name, labels, port)
}

// runPod starts the server in bed pod bp and creates its Pod object.
func (n *Node) runPod(ctx context.Context, bp *bed.Pod, namespace, name string, labels map[string]string, port uint16) (*Pod, error) {
	srv, err := startServer(bp, name, port)
	if err != nil {
		return nil, err
	}
	return n.registerPod(ctx, bp, srv, namespace, name, labels, port)
}

// startServer starts the pod's server, greeting with the pod's name.
func startServer(bp *bed.Pod, name string, port uint16) (*bed.Proc, error) {
	srv, err := bp.Start("serve", name, "tcp:[::]:"+strconv.Itoa(int(port)))
	if err != nil {
		return nil, fmt.Errorf("starting server in pod %s: %w", name, err)
	}
	return srv, nil
}

// registerPod creates the Pod object of a bed pod whose server runs, running
// and ready with the pod's addresses.
func (n *Node) registerPod(ctx context.Context, bp *bed.Pod, srv *bed.Proc, namespace, name string, labels map[string]string, port uint16) (*Pod, error) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "server", Image: "draind.test/bed-server",
			Ports: []corev1.ContainerPort{{Name: "serve", ContainerPort: int32(port), Protocol: corev1.ProtocolTCP}},
		}}},
	}
	if _, err := n.Kubelet.RunPod(ctx, pod, bp.IP4, bp.IP6); err != nil {
		srv.Kill()
		return nil, err
	}
	return &Pod{Node: n, Bed: bp, Server: srv, Namespace: namespace, Name: name, Port: port}, nil
}

// Addr is the pod's endpoint address of the given family.
func (p *Pod) Addr(family corev1.IPFamily) netip.AddrPort {
	return netip.AddrPortFrom(p.Bed.Addr(family == corev1.IPv6Protocol), p.Port)
}

// StopServer makes the pod's server stop listening: new connections are
// refused from then on, as after the container exits.
func (p *Pod) StopServer(context.Context) error {
	if _, err := p.Server.Call(bed.Request{Op: "stop"}); err != nil {
		return fmt.Errorf("stopping server of pod %s: %w", p.Name, err)
	}
	return nil
}

// Terminate plays the kubelet's part after a graceful delete: preStop (may
// be nil), Ready=false, stop the server, delete the object with grace 0.
func (p *Pod) Terminate(ctx context.Context, preStop func(context.Context) error) error {
	return p.Node.Kubelet.Terminate(ctx, p.Namespace, p.Name, preStop, p.StopServer)
}

// Client is a helper process in a bed pod that opens connections on request.
type Client struct {
	Pod  *bed.Pod
	Proc *bed.Proc
}

// StartClient creates a bed pod on n (not registered in the cluster: a
// client needs no Pod object) running a client helper.
func (n *Node) StartClient(name string) (*Client, error) {
	bp, err := n.Bed.AddPod(name)
	if err != nil {
		return nil, fmt.Errorf("creating client pod %s: %w", name, err)
	}
	proc, err := bp.Start("client")
	if err != nil {
		return nil, fmt.Errorf("starting client in pod %s: %w", name, err)
	}
	return &Client{Pod: bp, Proc: proc}, nil
}

// Dial opens count fresh connections to addr one after another and returns
// how many each server answered, and failures by class.
func (c *Client) Dial(addr netip.AddrPort, count int) (bed.Response, error) {
	resp, err := c.Proc.Call(bed.Request{Op: "dial", Addr: addr.String(), N: count})
	if err != nil {
		return resp, fmt.Errorf("dialing %s %d times: %w", addr, count, err)
	}
	return resp, nil
}

// ClusterIPs returns a Service's ClusterIP of each family it has.
func ClusterIPs(svc *corev1.Service) (map[corev1.IPFamily]netip.Addr, error) {
	out := map[corev1.IPFamily]netip.Addr{}
	for _, s := range svc.Spec.ClusterIPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("parsing clusterIP of %s/%s: %w", svc.Namespace, svc.Name, err)
		}
		fam := corev1.IPv4Protocol
		if a.Is6() {
			fam = corev1.IPv6Protocol
		}
		out[fam] = a
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("reading clusterIPs of %s/%s: service has none", svc.Namespace, svc.Name)
	}
	return out, nil
}
