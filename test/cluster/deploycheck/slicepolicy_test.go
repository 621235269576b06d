package deploycheck

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/draind/draind/test/cluster/kube"
)

// testSlicePolicy: with the base's slice policy, a tenant allowed to write
// EndpointSlices in its namespace cannot write one with the EndpointSlice
// controller's managed-by value, may write others, and the controller
// still publishes its own slices. fault's TestHostileForgedSlice shows what
// draind does with a tenant's slices, with the policy and without it.
func testSlicePolicy(ctx context.Context, t *testing.T, c *kube.Cluster) {
	const ns = "tenant-slices"
	if _, err := c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "tenant"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "slices"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"create", "update", "delete", "get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "slices"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "slices"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "tenant", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secs := int64(3600)
	tr, err := c.Admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "tenant", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := kubernetes.NewForConfig(&rest.Config{Host: c.Host(), BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: c.CA.CertPEM}})
	if err != nil {
		t.Fatal(err)
	}
	api := tenant.DiscoveryV1().EndpointSlices(ns)
	slice := func(name string, labels map[string]string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.244.9.9"}}}}
	}
	forged := map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}
	var lastErr error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, lastErr = api.Create(ctx, slice("forged", forged), metav1.CreateOptions{})
		if lastErr == nil {
			api.Delete(ctx, "forged", metav1.DeleteOptions{}) // admitted before the policy took hold
			return false, nil
		}
		return apierrors.IsForbidden(lastErr) || apierrors.IsInvalid(lastErr), nil
	})
	if err != nil || !strings.Contains(lastErr.Error(), "reserved for the EndpointSlice controller") {
		t.Fatalf("a tenant's slice with the controller's label was not refused: %v (last: %v)", err, lastErr)
	}
	own, err := api.Create(ctx, slice("own", map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: "tenant.example.com"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a tenant's own slice was refused: %v", err)
	}
	own.Labels[discoveryv1.LabelManagedBy] = "endpointslice-controller.k8s.io"
	if _, err := api.Update(ctx, own, metav1.UpdateOptions{}); err == nil {
		t.Error("a tenant relabelled its slice with the controller's value")
	}
	// The controller still writes its slices.
	if _, err := c.Admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := c.Admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=endpointslice-controller.k8s.io"})
		return err == nil && len(l.Items) > 0, nil
	})
	if err != nil {
		t.Fatalf("the EndpointSlice controller's slice never appeared under the policy: %v", err)
	}
	// The tenant may not change the endpoints of the controller's slice in
	// its namespace; an update that leaves what the slice says alone (the
	// garbage collector orphaning it, an annotation) is not the policy's.
	l, err := c.Admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=endpointslice-controller.k8s.io"})
	if err != nil || len(l.Items) == 0 {
		t.Fatalf("listing the controller's slices: %v", err)
	}
	ctl := l.Items[0].DeepCopy()
	ctl.Endpoints = append(ctl.Endpoints, discoveryv1.Endpoint{Addresses: []string{"10.244.9.9"}})
	if _, err := api.Update(ctx, ctl, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "reserved for the EndpointSlice controller") {
		t.Errorf("a tenant added an endpoint to the controller's slice: %v", err)
	}
	ann := l.Items[0].DeepCopy()
	if ann.Annotations == nil {
		ann.Annotations = map[string]string{}
	}
	ann.Annotations["example.com/note"] = "x"
	if _, err := api.Update(ctx, ann, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
		t.Errorf("an annotation on the controller's slice was refused: %v", err)
	}
}
