package kube

import (
	"context"
	"fmt"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Tenant returns a client for user (a client certificate, as UserConfig
// mints) whose only rights beyond system:authenticated are rules, granted
// by a Role and RoleBinding in namespace: a tenant that may write what the
// rules say there and nothing anywhere else. It waits until the API
// server's authorizer allows every verb of the rules.
func (c *Cluster) Tenant(ctx context.Context, user, namespace string, rules []rbacv1.PolicyRule) (kubernetes.Interface, error) {
	name := "tenant-" + user
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: rules}
	if _, err := c.Admin.RbacV1().Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating role %s/%s: %w", namespace, name, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}
	if _, err := c.Admin.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating rolebinding %s/%s: %w", namespace, name, err)
	}
	var attrs []authorizationv1.ResourceAttributes
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					attrs = append(attrs, authorizationv1.ResourceAttributes{Namespace: namespace, Verb: v, Group: g, Resource: res})
				}
			}
		}
	}
	if err := WaitAllowed(ctx, c.Admin, user, nil, attrs...); err != nil {
		return nil, err
	}
	cfg, err := c.UserConfig(user)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
