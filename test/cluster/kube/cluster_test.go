package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/draind/draind/test/cluster/kubebin"
)

// TestControlPlaneCredentials needs no root: it starts the control plane and
// checks that the minted credentials authenticate as who they claim and get
// exactly the rights RBAC gives them.
func TestControlPlaneCredentials(t *testing.T) {
	c := StartT(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	v, err := c.Admin.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("reading server version: %v", err)
	}
	if v.GitVersion != kubebin.Version {
		t.Errorf("server version %q, want %q (ldflags not applied?)", v.GitVersion, kubebin.Version)
	}

	whoami := func(cfg *rest.Config) authenticationv1.UserInfo {
		t.Helper()
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("self subject review: %v", err)
		}
		return r.Status.UserInfo
	}

	// A client certificate for an arbitrary user: authenticated, no rights.
	ucfg, err := c.UserConfig("jane", "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if ui := whoami(ucfg); ui.Username != "jane" || !contains(ui.Groups, "team-a") {
		t.Errorf("user cert authenticates as %+v, want jane in team-a", ui)
	}
	jane, _ := kubernetes.NewForConfig(ucfg)
	if _, err := jane.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("jane listing pods: err = %v, want Forbidden", err)
	}

	// A ServiceAccount token from TokenRequest.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}}
	if _, err := c.Admin.CoreV1().ServiceAccounts("default").Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	scfg, err := c.ServiceAccountConfig(ctx, "default", "probe", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if ui := whoami(scfg); ui.Username != "system:serviceaccount:default:probe" {
		t.Errorf("token authenticates as %q", ui.Username)
	}
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:default:probe",
		ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "secrets", Namespace: "default"},
	}}
	got, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Allowed {
		t.Errorf("serviceaccount without bindings may read secrets")
	}

	// The kubeconfig writer round-trips through clientcmd.
	path := t.TempDir() + "/kubeconfig"
	if err := WriteKubeconfig(path, scfg); err != nil {
		t.Fatal(err)
	}
	back, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("loading written kubeconfig: %v", err)
	}
	if ui := whoami(back); ui.Username != "system:serviceaccount:default:probe" {
		t.Errorf("kubeconfig authenticates as %q", ui.Username)
	}

	// Stop is idempotent and takes everything down.
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Admin.Discovery().ServerVersion(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("apiserver still answering after Stop: %v", err)
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}
