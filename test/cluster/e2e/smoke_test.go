package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

const (
	svcPort    = 80
	serverPort = 8080
	// dialsPerCheck fresh connections make missing one of three equally
	// likely endpoints a 3·(2/3)^60 ≈ 1e-10 event.
	dialsPerCheck = 60
)

// newBed creates a bed removed when the test ends.
func newBed(t *testing.T) *bed.Bed {
	t.Helper()
	b, err := bed.New()
	if err != nil {
		t.Fatalf("creating bed: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing bed: %v", err)
		}
	})
	return b
}

// createService creates a dual-stack ClusterIP Service selecting app=name.
func createService(ctx context.Context, t *testing.T, c *kube.Cluster, name string) (*corev1.Service, map[corev1.IPFamily]netip.Addr) {
	t.Helper()
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := c.Admin.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.ServiceSpec{
			Selector:       map[string]string{"app": name},
			IPFamilyPolicy: &policy,
			Ports: []corev1.ServicePort{{
				Name: "http", Port: svcPort, TargetPort: intstr.FromInt32(serverPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating service %s: %v", name, err)
	}
	ips, err := ClusterIPs(svc)
	if err != nil {
		t.Fatal(err)
	}
	return svc, ips
}

var families = []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}

// waitProgrammed waits until kube-proxy on n balances the service port of
// each family over exactly the given pods.
func waitProgrammed(ctx context.Context, t *testing.T, n *Node, ips map[corev1.IPFamily]netip.Addr, pods []*Pod) {
	t.Helper()
	for _, fam := range families {
		sp := kube.ServicePort{IP: ips[fam], Port: svcPort, Protocol: corev1.ProtocolTCP}
		var want []netip.AddrPort
		for _, p := range pods {
			want = append(want, p.Addr(fam))
		}
		slices.SortFunc(want, netip.AddrPort.Compare)
		if _, err := n.Kube.WaitRules(ctx, fam, func(r *kube.Rules) bool {
			got := slices.Clone(r.Endpoints(sp))
			slices.SortFunc(got, netip.AddrPort.Compare)
			return slices.Equal(got, want)
		}); err != nil {
			t.Fatalf("waiting for kube-proxy on %s to program %s over %v: %v", n.Kube.Name, sp, want, err)
		}
	}
}

// checkReaches dials every ClusterIP of the service from client and fails
// unless every connection succeeded and exactly the given pods answered.
func checkReaches(t *testing.T, client *Client, ips map[corev1.IPFamily]netip.Addr, pods []*Pod) {
	t.Helper()
	var want []string
	for _, p := range pods {
		want = append(want, p.Name)
	}
	slices.Sort(want)
	for _, fam := range families {
		vip := netip.AddrPortFrom(ips[fam], svcPort)
		resp, err := client.Dial(vip, dialsPerCheck)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for name := range resp.By {
			got = append(got, name)
		}
		slices.Sort(got)
		if len(resp.Fails) > 0 || resp.OK != dialsPerCheck || !slices.Equal(got, want) {
			t.Fatalf("client %s → %s: %d ok, failures %v, answered by %v (%v); want all %d ok from %v",
				client.Pod.Name, vip, resp.OK, resp.Fails, got, resp.By, dialsPerCheck, want)
		}
		t.Logf("client %s → ClusterIP %s: %d/%d connections ok, spread %v", client.Pod.Name, vip, resp.OK, dialsPerCheck, resp.By)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// TestPrivilegedClusterSmoke brings up the control plane and one node with
// kube-proxy, serves a Service from three pods, and measures how long the
// real components take to stop sending new connections to a pod that is
// deleted gracefully.
func TestPrivilegedClusterSmoke(t *testing.T) {
	bed.RequirePrivileged(t)
	runGracefulDelete(t, []string{"node-a"}, []int{0, 0, 0})
}

// TestPrivilegedClusterTwoNodes is the same with two nodes joined by a link:
// web-0 and web-1 on node-a, web-2 on node-b, a client on each node. Both
// clients must reach all three pods across nodes through their own node's
// kube-proxy, and both kube-proxies must stop picking web-0 once it is
// deleted.
func TestPrivilegedClusterTwoNodes(t *testing.T) {
	bed.RequirePrivileged(t)
	runGracefulDelete(t, []string{"node-a", "node-b"}, []int{0, 0, 1})
}

// runGracefulDelete creates the nodes, one pod web-i on node podNodes[i]
// each, a dual-stack Service over them and a client per node; checks every
// client reaches every pod through both ClusterIPs; then deletes web-0
// gracefully, plays the kubelet, and logs how long each step took.
func runGracefulDelete(t *testing.T, nodeNames []string, podNodes []int) {
	c := kube.StartT(t, kube.Config{})
	b := newBed(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var nodes []*Node
	for _, name := range nodeNames {
		n, err := AddNode(ctx, c, b, name)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	svc, ips := createService(ctx, t, c, "web")
	watch, err := kube.WatchEndpoints(ctx, c.Admin, svc.Namespace, svc.Name)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Stop()

	var pods []*Pod
	var addrs []netip.Addr
	for i, ni := range podNodes {
		p, err := nodes[ni].StartPod(ctx, "default", fmt.Sprintf("web-%d", i), map[string]string{"app": "web"}, serverPort)
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
		addrs = append(addrs, p.Bed.IP4, p.Bed.IP6)
	}
	ready, err := watch.WaitReady(ctx, addrs...)
	if err != nil {
		t.Fatalf("waiting for %d ready endpoints: %v", len(pods), err)
	}
	for _, p := range pods {
		for _, fam := range families {
			if e, _ := ready.Find(p.Addr(fam).Addr()); e.Node != p.Node.Kube.Name || e.Pod != p.Name {
				t.Errorf("endpoint %s is published as pod %q on node %q, want %s on %s", p.Addr(fam), e.Pod, e.Node, p.Name, p.Node.Kube.Name)
			}
		}
	}
	var clients []*Client
	for _, n := range nodes {
		waitProgrammed(ctx, t, n, ips, pods)
		cl, err := n.StartClient("client-" + n.Kube.Name)
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, cl)
	}
	for _, cl := range clients {
		checkReaches(t, cl, ips, pods)
	}

	// Graceful delete of web-0, from quiet kube-proxies (last sync more than
	// --iptables-min-sync-period ago, so the figures are their reaction
	// time, not the rate limit). The endpoint turns terminating (ready=false,
	// serving=true: the pod still reports Ready) and every kube-proxy drops
	// it from the Service's chains.
	victim := pods[0]
	for _, n := range nodes {
		if err := n.Kube.WaitProxyQuiet(ctx, 1100*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	type key struct {
		node string
		fam  corev1.IPFamily
	}
	removals := map[key]*removal{}
	for _, n := range nodes {
		for _, fam := range families {
			sp := kube.ServicePort{IP: ips[fam], Port: svcPort, Protocol: corev1.ProtocolTCP}
			removals[key{n.Kube.Name, fam}] = watchRemoval(ctx, n, sp, victim.Addr(fam))
		}
	}
	deleted := time.Now()
	if err := c.Admin.CoreV1().Pods("default").Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting pod %s: %v", victim.Name, err)
	}
	ep4 := victim.Addr(corev1.IPv4Protocol)
	snap, err := watch.Wait(ctx, deleted, func(s kube.EndpointsSnapshot) bool {
		e, ok := s.Find(ep4.Addr())
		return ok && e.Terminating
	})
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := snap.Find(ep4.Addr()); e.Ready || !e.Serving {
		t.Errorf("terminating endpoint %+v: want ready=false serving=true while the pod still reports Ready", e)
	}
	for _, r := range removals {
		if err := r.waitUnbalanced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, cl := range clients {
		checkReaches(t, cl, ips, pods[1:])
	}

	// The kubelet's part: Ready=false, stop the server, delete with grace 0.
	terminated := time.Now()
	if err := victim.Terminate(ctx, nil); err != nil {
		t.Fatal(err)
	}
	gone, err := watch.Wait(ctx, deleted, func(s kube.EndpointsSnapshot) bool {
		_, ok := s.Find(ep4.Addr())
		return !ok
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range removals {
		if err := r.waitDNATGone(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, cl := range clients {
		checkReaches(t, cl, ips, pods[1:])
	}

	t.Logf("graceful delete of %s (on %s), real EndpointSlice controller and kube-proxy %s (iptables), %d pods, %d node(s), quiet:",
		victim.Name, victim.Node.Kube.Name, c.Binaries().Version, len(pods), len(nodes))
	t.Logf("  delete → EndpointSlice terminating=true (IPv4 slice): %s", ms(snap.At.Sub(deleted)))
	for _, n := range nodes {
		for _, fam := range families {
			r := removals[key{n.Kube.Name, fam}]
			t.Logf("  kube-proxy on %s, %s %-22s delete → Service chain stops picking it: %s; delete → its DNAT rule gone: %s",
				n.Kube.Name, fam, r.ep, ms(r.unbalanced.Sub(deleted)), ms(r.dnatGone.Sub(deleted)))
		}
	}
	t.Logf("  kubelet stand-in's grace-0 delete at %s; endpoint left the slice at %s (rules polled every %v)",
		ms(terminated.Sub(deleted)), ms(gone.At.Sub(deleted)), kube.RulesPollInterval)
}

// removal follows, in one poller per IP family, when kube-proxy stops
// balancing a Service port to an endpoint (its KUBE-SEP chain no longer
// jumped to from the service chain) and when the endpoint's DNAT rule is gone
// altogether.
type removal struct {
	ep                   netip.AddrPort
	unbalanced, dnatGone time.Time
	unbalancedCh, doneCh chan struct{}
	err                  error
}

func watchRemoval(ctx context.Context, n *Node, sp kube.ServicePort, ep netip.AddrPort) *removal {
	r := &removal{ep: ep, unbalancedCh: make(chan struct{}), doneCh: make(chan struct{})}
	go func() {
		defer close(r.doneCh)
		_, r.err = n.Kube.WaitRules(ctx, familyOf(sp.IP), func(rules *kube.Rules) bool {
			now := time.Now()
			if r.unbalanced.IsZero() && !slices.Contains(rules.Endpoints(sp), ep) {
				r.unbalanced = now
				close(r.unbalancedCh)
			}
			if r.dnatGone.IsZero() && !rules.HasDNAT(ep) {
				r.dnatGone = now
			}
			return !r.unbalanced.IsZero() && !r.dnatGone.IsZero()
		})
	}()
	return r
}

func (r *removal) waitUnbalanced(ctx context.Context) error {
	select {
	case <-r.unbalancedCh:
		return nil
	case <-r.doneCh:
		if !r.unbalanced.IsZero() {
			return nil
		}
		return fmt.Errorf("waiting for kube-proxy to stop balancing to %s: %w", r.ep, r.err)
	case <-ctx.Done():
		return fmt.Errorf("waiting for kube-proxy to stop balancing to %s: %w", r.ep, ctx.Err())
	}
}

func (r *removal) waitDNATGone(ctx context.Context) error {
	select {
	case <-r.doneCh:
		if r.err != nil {
			return fmt.Errorf("waiting for kube-proxy to remove the DNAT rule to %s: %w", r.ep, r.err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for kube-proxy to remove the DNAT rule to %s: %w", r.ep, ctx.Err())
	}
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}
