package kube

import (
	"context"
	"fmt"
	"strings"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// WaitAllowed waits (30 s at most) until the API server allows user (in
// groups) every one of attrs. Its authorizer reads RBAC objects from a
// cache of its own: a binding just created may not count yet, so a check
// right after creating one must wait for this first.
func WaitAllowed(ctx context.Context, admin kubernetes.Interface, user string, groups []string, attrs ...authorizationv1.ResourceAttributes) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var denied []string
		for _, a := range attrs {
			r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
				Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &a},
			}, metav1.CreateOptions{})
			if err != nil {
				return fmt.Errorf("reviewing the access of %s: %w", user, err)
			}
			if !r.Status.Allowed {
				denied = append(denied, fmt.Sprintf("%s %s/%s in %q", a.Verb, a.Resource, a.Subresource, a.Namespace))
			}
		}
		if len(denied) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after 30 s %s may still not: %s", user, strings.Join(denied, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
