package deploycheck

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/draind/draind/test/cluster/kube"
)

// testLeasePolicy: with the base's ValidatingAdmissionPolicy, a draind whose
// token is bound to its pod on node-a may write drain Leases node-a holds,
// and no other: one node cannot drain another node's pods.
func testLeasePolicy(ctx context.Context, t *testing.T, c *kube.Cluster) {
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := c.Admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	sa := nodeBoundClient(ctx, t, c, namespace)
	api := sa.CoordinationV1().Leases(namespace)
	// The policy is compiled and cached asynchronously: wait until the
	// other node's Lease is refused.
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, lastErr = api.Create(ctx, lease("drain-policy-probe-b", "node-b"), metav1.CreateOptions{})
		if lastErr == nil {
			api.Delete(ctx, "drain-policy-probe-b", metav1.DeleteOptions{}) // admitted before the policy took hold
			return false, nil
		}
		return apierrors.IsForbidden(lastErr) || apierrors.IsInvalid(lastErr), nil
	})
	if err != nil {
		t.Fatalf("a Lease held by another node was never refused (last: %v)", lastErr)
	}
	if !strings.Contains(lastErr.Error(), "its own node holds") {
		t.Errorf("refused for another reason: %v", lastErr)
	}
	own, err := api.Create(ctx, lease("drain-policy-probe-a", "node-a"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a Lease its own node holds: %v", err)
	}
	// Taking over another node's Lease is refused too.
	other := own.DeepCopy()
	other.Spec.HolderIdentity = ptr.To("node-b")
	if _, err := api.Update(ctx, other, metav1.UpdateOptions{}); err == nil {
		t.Error("a Lease was handed to another node")
	}
	if err := api.Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting its own Lease: %v", err)
	}
	// A Lease another node holds cannot be deleted by this one.
	if _, err := c.Admin.CoordinationV1().Leases(namespace).Create(ctx, lease("drain-policy-probe-c", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := api.Delete(ctx, "drain-policy-probe-c", metav1.DeleteOptions{}); err == nil {
		t.Error("deleted a Lease another node holds")
	}
	testLeasePolicyIgnoresOtherDrainds(ctx, t, c)
}

// testLeasePolicyIgnoresOtherDrainds: a ServiceAccount also named draind,
// in another namespace, with a node-bound token and the right to write
// Leases there, is not draind: the policy leaves its Leases alone.
func testLeasePolicyIgnoresOtherDrainds(ctx context.Context, t *testing.T, c *kube.Cluster) {
	const other = "not-draind"
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Admin.CoreV1().ServiceAccounts(other).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "draind"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().Roles(other).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "leases"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create", "delete"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().RoleBindings(other).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "leases"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "leases"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "draind", Namespace: other}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	api := nodeBoundClient(ctx, t, c, other).CoordinationV1().Leases(other)
	var err error
	// RBAC caches settle asynchronously too.
	werr := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l := lease("other-holder", "node-b")
		l.Namespace = other
		_, err = api.Create(ctx, l, metav1.CreateOptions{})
		return err == nil || (err != nil && strings.Contains(err.Error(), "its own node holds")), nil
	})
	if werr != nil || err != nil {
		t.Errorf("a Lease of another namespace's ServiceAccount named draind was refused: %v", err)
	}
}

// nodeBoundClient is a client for ServiceAccount draind of ns with a token
// bound to a pod on node-a (the node-name claim).
func nodeBoundClient(ctx context.Context, t *testing.T, c *kube.Cluster, ns string) kubernetes.Interface {
	t.Helper()
	pod, err := c.Admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "draind-node-a", Namespace: ns},
		Spec: corev1.PodSpec{NodeName: "node-a", ServiceAccountName: "draind",
			Containers: []corev1.Container{{Name: "draind", Image: "draind:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secs := int64(3600)
	tr, err := c.Admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "draind", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs,
			BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(&rest.Config{Host: c.Host(), BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM}})
	if err != nil {
		t.Fatal(err)
	}
	return sa
}

// lease is a Lease in the base's namespace that holder holds.
func lease(name, holder string) *coordinationv1.Lease {
	secs := int32(30)
	now := metav1.NewMicroTime(time.Now())
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
}
