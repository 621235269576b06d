package fault

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/e2e"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
)

// TestFaultIPReuseAcrossNodes: pod old on node a is deleted; its IPv4
// address goes to a new pod, reuse-0, on node b (routed to node b from the
// other nodes, as a VPC-native CNI or a borrowed IPAM block does). The
// base's Lease policy is in force: every draind's token is bound to a Pod
// on its node, so no draind may write a Lease its node does not hold.
// Clients on node a (the old pod's own node, the holder of its drain
// Lease) and node c open a connection to the IP every probeEvery. Within
// one second of reuse-0's Pod being created, connections from both reach
// reuse-0 and every later one does (none refused, none rewritten to a pod
// of the old pod's Service), no node keeps a drain entry for the IP, and
// the old pod's drain Lease is gone (only node a may delete it).
//
//   - service-less: old is in no Service (its gone IP is refused);
//   - other-service: old is in Service web (its gone IP is rewritten to
//     web-1), reuse-0 in Service other.
func TestFaultIPReuseAcrossNodes(t *testing.T) {
	bed.RequirePrivileged(t)
	t.Run("service-less", func(t *testing.T) { reuseAcrossNodes(t, false) })
	t.Run("other-service", func(t *testing.T) { reuseAcrossNodes(t, true) })
}

func reuseAcrossNodes(t *testing.T, inService bool) {
	tol := tolerance(t)
	bound := time.Second + tol
	const observe = 4 * time.Second

	f := newFixture(t, "reusex", "a", "b", "c")
	f.useLeasePolicy()
	app := "lonely"
	var old, web1 *e2e.Pod
	if inService {
		vip := f.service("web")
		f.service("other")
		old, web1 = f.pod("a", "old", "web"), f.pod("c", "web-1", "web")
		f.watchReady("web", old, web1)
		f.waitProgrammed(vip, old, web1)
		app = "other"
	} else {
		old = f.pod("a", "old", app)
	}
	args := []string{"--linger=60s"}
	for _, n := range []string{"a", "b", "c"} {
		f.startDraind(n, args...)
	}
	ip4 := old.Bed.IP4
	target := netip.AddrPortFrom(ip4, serverPort)
	clients := map[string]*e2e.Client{"a": f.client("a"), "c": f.client("c")}
	f.reaches(clients["c"], target, 3, "old")

	// old goes: graceful delete, the kubelet's part, its network namespace.
	oldObj, err := f.env.kc.Admin.CoreV1().Pods(f.ns).Get(f.ctx, "old", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.env.kc.Admin.CoreV1().Pods(f.ns).Delete(f.ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := old.Terminate(f.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := old.Bed.Delete(); err != nil {
		t.Fatal(err)
	}
	f.waitLiveDrain("a", ip4, 10*time.Second) // premise: the holder steers the gone IP
	wantBefore := "!refused"
	if inService {
		wantBefore = "web-1"
	}
	before := tally(probeFor(clients["a"], target, 300*time.Millisecond))
	t.Logf("old (%s) gone; node a's connections to it: %s (its linger: 60 s)", ip4, fmtTally(before))
	if before[wantBefore] == 0 {
		t.Fatalf("node a does not steer the gone IP (want %s): the test proves nothing", wantBefore)
	}

	// reuse-0 on node b with old's IPv4 address, routed there from a and c.
	staged, err := f.nodes["b"].StagePodIPs(f.ctx, "reuse-0", serverPort, ip4, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a", "c"} {
		if err := f.nodes[n].Bed.RouteVia(f.nodes["b"].Bed, ip4); err != nil {
			t.Fatal(err)
		}
	}
	probers := map[string]*prober{}
	for n, c := range clients {
		probers[n] = startProber("client-"+n, c, target)
		defer probers[n].Stop()
	}
	watches := map[string]*mapWatch{}
	for n, d := range f.daemons {
		watches[n] = watchMaps(d, target, ip4)
	}
	time.Sleep(200 * time.Millisecond)
	created := time.Now()
	if _, err := staged.Register(f.ctx, f.ns, map[string]string{"app": app}); err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	leaseGone := f.waitLeaseGone(k8s.LeaseName(oldObj.UID), created, observe)
	time.Sleep(time.Until(created.Add(observe)))
	end := time.Now()
	for n, p := range probers {
		if err := p.Stop(); err != nil {
			t.Fatalf("client %s: %v", n, err)
		}
	}
	for _, w := range watches {
		w.Stop()
	}
	t.Logf("figures (from the Pod create call; its create+status calls took %s; bound 1 s + %v):", ms(registered.Sub(created)), tol)
	for _, n := range []string{"a", "c"} {
		reportReuse(t, n, probers[n], created, end, bound)
	}
	for _, n := range []string{"a", "b", "c"} {
		g := drainGone(watches[n], created, end)
		t.Logf("  node %s: drain entries for %s gone %s after the Pod was created", n, ip4, fmtDur(g))
		if g < 0 || g > bound {
			t.Errorf("node %s's drain entries for %s gone %s after reuse-0 was created: want within %v", n, ip4, fmtDur(g), bound)
		}
	}
	t.Logf("  old's drain Lease deleted (by node a) %s after the Pod was created", fmtDur(leaseGone))
	if leaseGone < 0 || leaseGone > bound {
		t.Errorf("old's drain Lease gone %s after reuse-0 was created: want within %v", fmtDur(leaseGone), bound)
	}
	f.checkRefusedLeaseWrites()
}

// reportReuse logs and checks one client's probes after reuse-0's Pod was
// created: the first one reuse-0 answered, the last one it did not, and
// what the others got.
func reportReuse(t *testing.T, name string, p *prober, created, end time.Time, bound time.Duration) {
	t.Helper()
	probes := p.between(created, end)
	var first, lastWrong time.Time
	var wrong []probe
	for _, pr := range probes {
		if pr.server == "reuse-0" {
			if first.IsZero() {
				first = pr.at
			}
			continue
		}
		lastWrong = pr.at
		if !first.IsZero() {
			wrong = append(wrong, pr)
		}
	}
	window := time.Duration(0)
	if !lastWrong.IsZero() {
		window = lastWrong.Sub(created) + probeEvery
	}
	t.Logf("  client on node %s: first connection answered by reuse-0 %s after the Pod was created; window (last one not answered by it) %s; in the first %v: %s; after: %s",
		name, fmtDurOr(first, created), ms(window), bound,
		fmtTally(tally(p.between(created, created.Add(bound)))), fmtTally(tally(p.between(created.Add(bound), end))))
	if first.IsZero() || first.Sub(created) > bound {
		t.Errorf("client on node %s reaches reuse-0 %s after its Pod was created: want within %v", name, fmtDurOr(first, created), bound)
	}
	if window > bound {
		t.Errorf("client on node %s: connections not answered by reuse-0 until %s after its Pod was created: want within %v", name, ms(window), bound)
	}
	if len(wrong) > 0 {
		t.Errorf("client on node %s: %d connections after the first one reuse-0 answered went elsewhere or failed: %s", name, len(wrong), fmtTally(tally(wrong)))
	}
}

// drainGone returns when w last saw a drain entry (from created; 0: none
// after it, -1: one at the end).
func drainGone(w *mapWatch, created, end time.Time) time.Duration {
	ss := w.between(created, end)
	for i := len(ss) - 1; i >= 0; i-- {
		if ss[i].err != nil || hasDrain(ss[i]) {
			if i+1 < len(ss) {
				return ss[i+1].at.Sub(created)
			}
			return -1
		}
	}
	return 0
}

// probeFor opens connections from c to addr for d and returns them.
func probeFor(c *e2e.Client, addr netip.AddrPort, d time.Duration) []probe {
	p := startProber("premise", c, addr)
	time.Sleep(d)
	p.Stop()
	return p.between(time.Time{}, time.Now())
}

// waitLiveDrain waits until node's draind holds a live drain entry for ip.
func (f *fixture) waitLiveDrain(node string, ip netip.Addr, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for {
		dm, err := pinned(f.daemons[node])
		if err == nil && len(liveDrains(dm, ip, time.Now())) > 0 {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("node %s holds no drain entry for %s after %v (err %v): the test proves nothing", node, ip, within, err)
		}
		time.Sleep(mapPoll)
	}
}

// waitLeaseGone polls the API until Lease name is gone and returns when
// (from created), or -1 if it is still there after within.
func (f *fixture) waitLeaseGone(name string, created time.Time, within time.Duration) time.Duration {
	api := f.env.kc.Admin.CoordinationV1().Leases(headline.DraindNamespace)
	for time.Since(created) < within {
		if _, err := api.Get(f.ctx, name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return time.Since(created)
		}
		time.Sleep(mapPoll)
	}
	return -1
}

// checkRefusedLeaseWrites fails if a draind logged a Lease write the API
// server refused (the Lease policy denying it): no node needs one.
func (f *fixture) checkRefusedLeaseWrites() {
	f.t.Helper()
	for _, path := range f.logs {
		n, err := countLog(path, "drain lease write refused")
		if err != nil {
			f.t.Error(err)
		}
		if n > 0 {
			f.t.Errorf("%s: %d Lease writes refused", path, n)
		}
	}
}

// useLeasePolicy applies the base's Lease policy to the control plane for
// this test (removed after it), makes every draind of the fixture use a
// token bound to a Pod on its node, and waits until the policy is in
// force for such a token.
func (f *fixture) useLeasePolicy() {
	f.t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "daemonset", "lease-policy.yaml"))
	if err != nil {
		f.t.Fatal(err)
	}
	docs := strings.Split(string(data), "\n---\n")
	if len(docs) != 2 {
		f.t.Fatalf("lease-policy.yaml: %d documents, want the policy and its binding", len(docs))
	}
	var pol admissionregistrationv1.ValidatingAdmissionPolicy
	var bind admissionregistrationv1.ValidatingAdmissionPolicyBinding
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &pol); err != nil {
		f.t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &bind); err != nil {
		f.t.Fatal(err)
	}
	adm := f.env.kc.Admin.AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Create(f.ctx, &pol, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if err := adm.ValidatingAdmissionPolicies().Delete(context.Background(), pol.Name, metav1.DeleteOptions{}); err != nil {
			f.t.Errorf("deleting the Lease policy: %v", err)
		}
	})
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(f.ctx, &bind, metav1.CreateOptions{}); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() {
		if err := adm.ValidatingAdmissionPolicyBindings().Delete(context.Background(), bind.Name, metav1.DeleteOptions{}); err != nil {
			f.t.Errorf("deleting the Lease policy binding: %v", err)
		}
	})
	f.nodeBound = true
	f.waitPolicyInForce()
}

// waitPolicyInForce waits until a token bound to node a may not create a
// Lease node b holds (the policy is compiled and cached asynchronously).
func (f *fixture) waitPolicyInForce() {
	f.t.Helper()
	cfg, err := f.nodeBoundConfig(f.nodes["a"].Kube)
	if err != nil {
		f.t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	api := sa.CoordinationV1().Leases(headline.DraindNamespace)
	holder, secs, now := f.nodes["b"].Kube.Name, int32(30), metav1.NewMicroTime(time.Now())
	probe := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "policy-probe", Namespace: headline.DraindNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
	var last error
	err = wait.PollUntilContextTimeout(f.ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, last = api.Create(ctx, probe, metav1.CreateOptions{})
		if last == nil {
			f.env.kc.Admin.CoordinationV1().Leases(headline.DraindNamespace).Delete(ctx, probe.Name, metav1.DeleteOptions{})
			return false, nil
		}
		return apierrors.IsForbidden(last) || apierrors.IsInvalid(last), nil
	})
	if err != nil {
		f.t.Fatalf("the Lease policy never refused node a's write of node b's Lease (last: %v)", last)
	}
}

// writeNodeBoundKubeconfig writes a kubeconfig for draind on node n whose
// token is bound to a Pod on n (it carries the node-name claim the Lease
// policy checks). The Pod is deleted when the test ends.
func (f *fixture) writeNodeBoundKubeconfig(_ context.Context, _ *kube.Cluster, n *kube.Node, path string) error {
	cfg, err := f.nodeBoundConfig(n)
	if err != nil {
		return err
	}
	return kube.WriteKubeconfig(path, n.Config(cfg))
}

// nodeBoundConfig is a client config for draind's ServiceAccount with a
// token bound to a (host-network, never run) Pod on node n.
func (f *fixture) nodeBoundConfig(n *kube.Node) (*rest.Config, error) {
	admin := f.env.kc.Admin
	ns := headline.DraindNamespace
	name := "draind-" + n.Name
	pod, err := admin.CoreV1().Pods(ns).Get(f.ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = admin.CoreV1().Pods(ns).Create(f.ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n.Name, ServiceAccountName: headline.DraindServiceAccount, HostNetwork: true,
				Containers: []corev1.Container{{Name: "draind", Image: "draind:test"}}},
		}, metav1.CreateOptions{})
		if err == nil {
			zero := int64(0)
			f.t.Cleanup(func() {
				err := admin.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
				if err != nil && !apierrors.IsNotFound(err) {
					f.t.Errorf("deleting pod %s/%s: %v", ns, name, err)
				}
			})
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the Pod draind's token on %s is bound to: %w", n.Name, err)
	}
	secs := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(f.ctx, headline.DraindServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token bound to pod %s: %w", name, err)
	}
	return &rest.Config{Host: f.env.kc.Host(), BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: f.env.kc.CA.CertPEM}}, nil
}
