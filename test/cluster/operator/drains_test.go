// Package operator tests draind's operator commands (draind drains) as an
// operator runs them: the real binary, a kubeconfig, a real kube-apiserver,
// and only the RBAC rights the command documents.
package operator

import (
	"bufio"
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/kube"
)

const draindNS = "draind-system"

// drainsDoc is `draind drains -o json`.
type drainsDoc struct {
	Drains []struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
		UID       string `json:"uid"`
		Node      string `json:"node"`
		Reason    string `json:"reason"`
		State     string `json:"state"`
		Since     string `json:"since"`
		Endpoint  string `json:"endpoint"`
		Progress  *struct {
			SYNs        uint64  `json:"syns"`
			SYNsLast10s *uint64 `json:"syns_last_10s"`
			Live        int     `json:"live_connections"`
		} `json:"progress"`
	} `json:"drains"`
}

// operatorRBAC grants user what `draind drains` documents: list the drain
// Leases in draind's namespace, list EndpointSlices cluster-wide, get pods
// (the age of drains without a Lease). Nothing more.
func operatorRBAC(t *testing.T, ctx context.Context, c kubernetes.Interface, user string) {
	t.Helper()
	subj := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	if _, err := c.RbacV1().Roles(draindNS).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "drains-" + user},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"list"}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(draindNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "drains-" + user},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "drains-" + user}, Subjects: subj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "drains-" + user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"list"}},
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "drains-" + user},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "drains-" + user}, Subjects: subj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.WaitAllowed(ctx, c, user, nil,
		authorizationv1.ResourceAttributes{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: draindNS},
		authorizationv1.ResourceAttributes{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
		authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods", Namespace: "default"}); err != nil {
		t.Fatal(err)
	}
}

// TestDrainsAgainstAPIServer runs `draind drains` against a real
// kube-apiserver as an operator with only the documented rights: a pod
// drained through its Lease (progress from its node, SYNs of the last 10 s),
// a pod terminating without a Lease, a not-ready pod, a ready one that is no
// drain; then -o wide, and --watch -o json seeing the node report the pod
// drained. Without the rights it fails with the API's refusal, not an empty
// list.
func TestDrainsAgainstAPIServer(t *testing.T) {
	c := kube.StartT(t, kube.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bin, err := draindbin.Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{draindNS, "shop"} {
		if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Pods as the apiserver holds them (no kubelet needed for listing).
	mkPod := func(name, node string) *corev1.Pod {
		p, err := c.Admin.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", Finalizers: []string{"draind.io/test-keep"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "app", Image: "example.invalid/app"}},
				TerminationGracePeriodSeconds: ptr(int64(60))},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b, cc, e := mkPod("cart-a", "node-a"), mkPod("cart-b", "node-b"), mkPod("cart-c", "node-a"), mkPod("cart-e", "node-b")
	t.Cleanup(func() {
		for _, p := range []*corev1.Pod{a, b, cc, e} {
			cur, err := c.Admin.CoreV1().Pods("shop").Get(context.Background(), p.Name, metav1.GetOptions{})
			if err == nil {
				cur.Finalizers = nil
				c.Admin.CoreV1().Pods("shop").Update(context.Background(), cur, metav1.UpdateOptions{})
			}
		}
	})
	// cart-b is being deleted (the finalizer keeps it Terminating).
	if err := c.Admin.CoreV1().Pods("shop").Delete(ctx, "cart-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// cart-c turned unready.
	cc.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))}}
	if _, err := c.Admin.CoreV1().Pods("shop").UpdateStatus(ctx, cc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// One hand-made EndpointSlice of a selector-less Service, as the
	// EndpointSlice controller would write it.
	tr := true
	ep := func(ip string, p *corev1.Pod, ready, terminating bool) discoveryv1.Endpoint {
		n := p.Spec.NodeName
		return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: &n,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &tr, Terminating: &terminating},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: p.Name, UID: p.UID}}
	}
	port, proto, pname := int32(8080), corev1.ProtocolTCP, "http"
	if _, err := c.Admin.DiscoveryV1().EndpointSlices("shop").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "cart-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "cart"}},
		AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.244.0.11", a, false, true), ep("10.244.1.12", b, false, true),
			ep("10.244.0.13", cc, false, false), ep("10.244.1.14", e, true, false),
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// cart-a asked to go offline: its node published the Lease and progress.
	leases := &k8s.Leases{Client: c.Admin, Namespace: draindNS}
	lease, _, err := leases.Publish(ctx, k8s.DrainRequest{PodNamespace: "shop", PodName: "cart-a", PodUID: a.UID,
		IPs: []netip.Addr{netip.MustParseAddr("10.244.0.11")}, Node: "node-a", Reason: k8s.ReasonOffline, Duration: time.Minute}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	progress := k8s.Progress{SYNs: 9, SYNsLast10s: 4, HasLast10s: true, Live: 2, Steered: 30}
	if _, err := leases.Renew(ctx, lease.Name, time.Minute, time.Now(), map[string]string{k8s.AnnState: "draining", k8s.AnnProgress: progress.String()}); err != nil {
		t.Fatal(err)
	}

	// An operator with exactly the documented rights.
	operatorRBAC(t, ctx, c.Admin, "alice")
	alice, err := c.UserConfig("alice")
	if err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(dir, "alice.kubeconfig")
	if err := kube.WriteKubeconfig(kc, alice); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, bin, append([]string{"drains", "--kubeconfig", kc}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("draind drains %v: %v\n%s", args, err, out)
		}
		return string(out)
	}

	text := run()
	t.Logf("draind drains:\n%s", text)
	lines := strings.Split(strings.TrimSpace(text), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "POD") {
		t.Fatalf("want a header and 3 drains (cart-a, cart-b, cart-c; cart-e is ready), got:\n%s", text)
	}
	for i, want := range [][]string{
		{"shop/cart-a", "node-a", "offline", "draining", "4", "2"},
		{"shop/cart-b", "node-b", "terminating", "draining", "-", "-"},
		{"shop/cart-c", "node-a", "not-ready", "draining", "-", "-"},
	} {
		f := strings.Fields(lines[i+1])
		if len(f) != 7 || f[0] != want[0] || f[1] != want[1] || f[2] != want[2] || f[3] != want[3] || f[5] != want[4] || f[6] != want[5] || f[4] == "-" {
			t.Errorf("row %d = %q, want %v with an age", i+1, lines[i+1], want)
		}
	}
	wide := run("-o", "wide")
	t.Logf("draind drains -o wide:\n%s", wide)
	if !strings.Contains(wide, "10.244.0.11") || !strings.Contains(wide, "shop/cart") || !strings.Contains(wide, "ENDPOINT") {
		t.Errorf("wide output lacks IPs, endpoint or services:\n%s", wide)
	}
	var doc drainsDoc
	if err := json.Unmarshal([]byte(run("-o", "json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Drains) != 3 || doc.Drains[0].UID != string(a.UID) || doc.Drains[0].Progress == nil ||
		doc.Drains[0].Progress.SYNsLast10s == nil || *doc.Drains[0].Progress.SYNsLast10s != 4 || doc.Drains[0].Endpoint != "terminating" {
		t.Errorf("json: %+v", doc)
	}

	// --watch: the node reports cart-a drained; the watcher prints it.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	w := exec.CommandContext(wctx, bin, "drains", "--kubeconfig", kc, "--watch", "--interval", "200ms", "-o", "json")
	stdout, err := w.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { wcancel(); w.Wait() }()
	dec := json.NewDecoder(bufio.NewReader(stdout))
	var first drainsDoc
	if err := dec.Decode(&first); err != nil || len(first.Drains) != 3 || first.Drains[0].State != "draining" {
		t.Fatalf("first watch document: %+v, %v", first, err)
	}
	done := k8s.Progress{SYNs: 9, SYNsLast10s: 0, HasLast10s: true, Live: 0, Steered: 30}
	if _, err := leases.Renew(ctx, lease.Name, time.Minute, time.Now(), map[string]string{k8s.AnnState: "drained", k8s.AnnProgress: done.String()}); err != nil {
		t.Fatal(err)
	}
	var next drainsDoc
	if err := dec.Decode(&next); err != nil {
		t.Fatalf("no second watch document after the Lease changed: %v", err)
	}
	if next.Drains[0].State != "drained" || next.Drains[0].Progress.Live != 0 {
		t.Errorf("after the node reported drained, the watcher printed %+v", next.Drains[0])
	}

	// Without the rights: the API's refusal, not an empty list.
	bob, err := c.UserConfig("bob")
	if err != nil {
		t.Fatal(err)
	}
	bkc := filepath.Join(dir, "bob.kubeconfig")
	if err := kube.WriteKubeconfig(bkc, bob); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, bin, "drains", "--kubeconfig", bkc).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "forbidden") || !strings.Contains(string(out), "listing drain Leases") {
		t.Errorf("draind drains without rights: %v\n%s", err, out)
	}
}

func ptr[T any](v T) *T { return &v }
