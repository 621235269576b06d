package headline

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/kube"
)

// DraindNamespace and DraindServiceAccount are what deploy/daemonset
// creates; the daemons run as that ServiceAccount.
const (
	DraindNamespace      = "draind-system"
	DraindServiceAccount = "draind"
)

// DraindUser is the ServiceAccount's user name, and DraindGroups the groups
// the apiserver gives its tokens.
var (
	DraindUser   = "system:serviceaccount:" + DraindNamespace + ":" + DraindServiceAccount
	DraindGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + DraindNamespace, "system:authenticated"}
)

// rbacFiles are the deploy/daemonset manifests that give draind its
// identity and rights; from namespace.yaml only the Namespace is taken.
var rbacFiles = []struct {
	path   string
	onlyNS bool
}{{"deploy/daemonset/namespace.yaml", true}, {"deploy/daemonset/rbac.yaml", false}}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// ApplyRBAC creates the namespace, ServiceAccount, (Cluster)Roles and
// bindings of deploy/daemonset, read from the repository.
func ApplyRBAC(ctx context.Context, client kubernetes.Interface) error {
	root, err := draindbin.RepoRoot()
	if err != nil {
		return err
	}
	for _, rf := range rbacFiles {
		f := rf.path
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return fmt.Errorf("reading draind's RBAC: %w", err)
		}
		for _, doc := range docSep.Split(string(b), -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
			if err != nil {
				return fmt.Errorf("decoding %s: %w", f, err)
			}
			if _, ok := obj.(*corev1.Namespace); rf.onlyNS && !ok {
				continue
			}
			if err := create(ctx, client, obj); err != nil {
				return fmt.Errorf("applying %s: %w", f, err)
			}
		}
	}
	attrs := make([]authorizationv1.ResourceAttributes, len(NeededAccess))
	for i, a := range NeededAccess {
		attrs[i] = a.attributes()
	}
	return kube.WaitAllowed(ctx, client, DraindUser, DraindGroups, attrs...)
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func create(ctx context.Context, c kubernetes.Interface, obj runtime.Object) error {
	var err error
	opts := metav1.CreateOptions{}
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = c.CoreV1().Namespaces().Create(ctx, o, opts)
	case *corev1.ServiceAccount:
		_, err = c.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.ClusterRole:
		_, err = c.RbacV1().ClusterRoles().Create(ctx, o, opts)
	case *rbacv1.ClusterRoleBinding:
		_, err = c.RbacV1().ClusterRoleBindings().Create(ctx, o, opts)
	case *rbacv1.Role:
		_, err = c.RbacV1().Roles(o.Namespace).Create(ctx, o, opts)
	case *rbacv1.RoleBinding:
		_, err = c.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, opts)
	default:
		return fmt.Errorf("unexpected object %T in the RBAC manifests", obj)
	}
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// Access is one question for a SubjectAccessReview.
type Access struct {
	Verb, Group, Resource, Subresource, Namespace string
}

func (a Access) String() string {
	r := a.Resource
	if a.Group != "" {
		r += "." + a.Group
	}
	if a.Subresource != "" {
		r += "/" + a.Subresource
	}
	ns := a.Namespace
	if ns == "" {
		ns = "all namespaces"
	}
	return fmt.Sprintf("%s %s in %s", a.Verb, r, ns)
}

func (a Access) attributes() authorizationv1.ResourceAttributes {
	return authorizationv1.ResourceAttributes{Verb: a.Verb, Group: a.Group, Resource: a.Resource, Subresource: a.Subresource, Namespace: a.Namespace}
}

// Allowed asks the apiserver whether draind's ServiceAccount may do a.
func Allowed(ctx context.Context, admin kubernetes.Interface, a Access) (bool, error) {
	r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: DraindUser, Groups: DraindGroups,
			ResourceAttributes: ptr(a.attributes()),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("reviewing %s: %w", a, err)
	}
	return r.Status.Allowed, nil
}

// NeededAccess is every call the daemon makes (k8s/informers.go,
// k8s/lease.go, daemon/local.go's event recorder, daemon/zone.go).
var NeededAccess = []Access{
	{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
	{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
	{Verb: "list", Resource: "services"},
	{Verb: "watch", Resource: "services"},
	{Verb: "list", Resource: "pods"},
	{Verb: "watch", Resource: "pods"},
	{Verb: "get", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "list", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "watch", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "delete", Group: "coordination.k8s.io", Resource: "leases", Namespace: DraindNamespace},
	{Verb: "create", Resource: "events", Namespace: "default"},
	{Verb: "patch", Resource: "events", Namespace: "default"},
	{Verb: "get", Resource: "nodes"}, // its Node's zone label (daemon/zone.go)
}

// ForbiddenAccess is what draind must not be able to do: write pods, read
// secrets, touch Leases outside its namespace (leader election of others),
// write the objects it only watches.
var ForbiddenAccess = []Access{
	{Verb: "patch", Resource: "pods", Namespace: "default"},
	{Verb: "patch", Resource: "pods"},
	{Verb: "update", Resource: "pods", Namespace: "default"},
	{Verb: "patch", Resource: "pods", Subresource: "status", Namespace: "default"},
	{Verb: "delete", Resource: "pods", Namespace: "default"},
	{Verb: "create", Resource: "pods", Subresource: "eviction", Namespace: "default"},
	{Verb: "get", Resource: "secrets", Namespace: "default"},
	{Verb: "get", Resource: "secrets", Namespace: DraindNamespace},
	{Verb: "list", Resource: "secrets"},
	{Verb: "watch", Resource: "secrets"},
	{Verb: "get", Resource: "configmaps", Namespace: "kube-system"},
	{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
	{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "default"},
	{Verb: "update", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "default"},
	{Verb: "patch", Resource: "nodes"},
	{Verb: "list", Resource: "nodes"},
	{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: DraindNamespace},
}
