package inject

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/draind/draind/deploy/release"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/files"
)

func render(t *testing.T, components []string, extra string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := RenderOverlay(components, extra)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func decode[T any](t *testing.T, objs []*unstructured.Unstructured, kind, name string) *T {
	t.Helper()
	u := find(objs, kind, name)
	if u == nil {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	var v T
	if err := fromUnstructured(u, &v); err != nil {
		t.Fatalf("decoding %s %s: %v", kind, name, err)
	}
	return &v
}

// TestInjectComponent renders deploy/webhook as an operator includes it
// (an overlay of the base with `components:`), decodes every object
// strictly, and checks what makes it safe to install: failurePolicy
// Ignore, a short timeout, only pod creations, kube-system and
// draind-system excluded, an unprivileged Deployment of two replicas with
// a PodDisruptionBudget, and RBAC of exactly one Secret and one webhook
// configuration. The base alone has none of it.
func TestInjectComponent(t *testing.T) {
	base := render(t, nil, "")
	objs := render(t, []string{ComponentWebhook}, "")
	added := Added(base, objs)
	for _, o := range base {
		if strings.HasPrefix(o.GetName(), "draind-webhook") {
			t.Errorf("the base without the component renders %s", deploycheck.Describe(o))
		}
	}
	s, err := deploycheck.Scheme()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range added {
		if _, err := deploycheck.DecodeStrict(s, o); err != nil {
			t.Error(err)
		}
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
		if o.GetKind() != "MutatingWebhookConfiguration" && o.GetKind() != "ClusterRole" && o.GetKind() != "ClusterRoleBinding" && o.GetNamespace() != systemNS {
			t.Errorf("%s is not in %s", deploycheck.Describe(o), systemNS)
		}
		if o.GetLabels()["app.kubernetes.io/part-of"] != "draind" {
			t.Errorf("%s lacks app.kubernetes.io/part-of=draind", deploycheck.Describe(o))
		}
	}
	slices.Sort(kinds)
	want := []string{
		"ClusterRole/draind-webhook", "ClusterRoleBinding/draind-webhook", "Deployment/draind-webhook",
		"MutatingWebhookConfiguration/draind-webhook", "PodDisruptionBudget/draind-webhook", "Role/draind-webhook-tls",
		"RoleBinding/draind-webhook-tls", "Secret/draind-webhook-tls", "Service/draind-webhook", "ServiceAccount/draind-webhook",
	}
	if !slices.Equal(kinds, want) {
		t.Errorf("the component adds\n %q\nwant\n %q", kinds, want)
	}

	t.Run("webhook configuration", func(t *testing.T) {
		mwc := decode[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration", webhookConfig)
		paths := map[string]string{"namespace.inject.draind.io": "/inject/namespace", "pod.inject.draind.io": "/inject/pod"}
		if len(mwc.Webhooks) != len(paths) {
			t.Fatalf("%d webhooks, want %d", len(mwc.Webhooks), len(paths))
		}
		for _, w := range mwc.Webhooks {
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("%s: failurePolicy %v, want Ignore (pods are created when the webhook is down)", w.Name, w.FailurePolicy)
			}
			if w.TimeoutSeconds == nil || *w.TimeoutSeconds > 5 {
				t.Errorf("%s: timeoutSeconds %v, want at most 5", w.Name, w.TimeoutSeconds)
			}
			if w.SideEffects == nil || *w.SideEffects != admissionregistrationv1.SideEffectClassNone {
				t.Errorf("%s: sideEffects %v", w.Name, w.SideEffects)
			}
			if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) ||
				!slices.Equal(w.Rules[0].Resources, []string{"pods"}) || !slices.Equal(w.Rules[0].APIGroups, []string{""}) {
				t.Errorf("%s: rules %+v, want CREATE of pods only", w.Name, w.Rules)
			}
			cc := w.ClientConfig.Service
			if cc == nil || cc.Name != "draind-webhook" || cc.Namespace != systemNS || cc.Path == nil || *cc.Path != paths[w.Name] {
				t.Errorf("%s: calls %+v, want Service draind-webhook path %s", w.Name, cc, paths[w.Name])
			}
			sel, err := metav1.LabelSelectorAsSelector(w.NamespaceSelector)
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				name, label string
				want        bool
			}{
				{"kube-system", "true", false}, {systemNS, "true", false}, {"kube-system", "", false}, {systemNS, "", false},
				{"shop", "true", w.Name == "namespace.inject.draind.io"},
				{"shop", "", w.Name == "pod.inject.draind.io"},
				{"shop", "false", false},
			} {
				l := labels.Set{"kubernetes.io/metadata.name": tc.name}
				if tc.label != "" {
					l["draind.io/inject"] = tc.label
				}
				if got := sel.Matches(l); got != tc.want {
					t.Errorf("%s selects namespace %s with draind.io/inject=%q: %v, want %v", w.Name, tc.name, tc.label, got, tc.want)
				}
			}
			if len(w.MatchConditions) == 0 {
				t.Errorf("%s has no matchConditions: every pod of the cluster would cost a call", w.Name)
			}
			if len(w.ClientConfig.CABundle) != 0 {
				t.Errorf("%s ships a caBundle: the webhook writes it", w.Name)
			}
		}
	})

	t.Run("deployment", func(t *testing.T) {
		d := decode[appsv1.Deployment](t, objs, "Deployment", "draind-webhook")
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("replicas %v, want 2", d.Spec.Replicas)
		}
		pod := d.Spec.Template.Spec
		if pod.HostNetwork || pod.HostPID || pod.HostIPC || pod.ServiceAccountName != webhookSA {
			t.Errorf("host namespaces or ServiceAccount %q", pod.ServiceAccountName)
		}
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				t.Errorf("hostPath volume %s", v.Name)
			}
		}
		if pod.Affinity == nil || pod.Affinity.PodAntiAffinity == nil || len(pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 {
			t.Error("no anti-affinity spreading the replicas over nodes")
		}
		psc := pod.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
			psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("pod security context %+v, want non-root with RuntimeDefault seccomp", psc)
		}
		if len(pod.Containers) != 1 {
			t.Fatalf("%d containers", len(pod.Containers))
		}
		c := pod.Containers[0]
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 ||
			(sc.Privileged != nil && *sc.Privileged) {
			t.Errorf("container security context %+v, want unprivileged, read-only, every capability dropped", sc)
		}
		if c.Image != "ghcr.io/draind/draind:"+release.Version || !slices.Equal(c.Args, []string{"webhook"}) {
			t.Errorf("runs %s %q, want the release image's webhook", c.Image, c.Args)
		}
		if env := envValue(c, "DRAIND_IMAGE"); env != c.Image {
			t.Errorf("DRAIND_IMAGE %q, want the container's (the DaemonSet's) image %s", env, c.Image)
		}
		if c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
			t.Errorf("readiness probe %+v", c.ReadinessProbe)
		}
		pdb := decode[policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", "draind-webhook")
		sel, _ := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
			t.Errorf("PodDisruptionBudget minAvailable %v selector %v: want 1 of the webhook's pods", pdb.Spec.MinAvailable, pdb.Spec.Selector)
		}
		svc := decode[corev1.Service](t, objs, "Service", "draind-webhook")
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(d.Spec.Template.Labels)) || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.StrVal != "https" {
			t.Errorf("Service %+v does not send 443 to the webhook's https port", svc.Spec)
		}
	})

	t.Run("rbac", func(t *testing.T) {
		role := decode[rbacv1.Role](t, objs, "Role", "draind-webhook-tls")
		wantRole := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, ResourceNames: []string{tlsSecret}, Verbs: []string{"get", "update"}}}
		if !reflect.DeepEqual(role.Rules, wantRole) {
			t.Errorf("Role rules %+v, want %+v", role.Rules, wantRole)
		}
		cr := decode[rbacv1.ClusterRole](t, objs, "ClusterRole", "draind-webhook")
		wantCR := []rbacv1.PolicyRule{{APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"}, ResourceNames: []string{webhookConfig}, Verbs: []string{"get", "patch"}}}
		if !reflect.DeepEqual(cr.Rules, wantCR) {
			t.Errorf("ClusterRole rules %+v, want %+v", cr.Rules, wantCR)
		}
		for _, b := range []struct{ kind, name string }{{"RoleBinding", "draind-webhook-tls"}, {"ClusterRoleBinding", "draind-webhook"}} {
			subs, _, _ := unstructured.NestedSlice(find(objs, b.kind, b.name).Object, "subjects")
			if len(subs) != 1 || subs[0].(map[string]any)["name"] != webhookSA || subs[0].(map[string]any)["namespace"] != systemNS {
				t.Errorf("%s %s binds %v, want only the webhook's ServiceAccount", b.kind, b.name, subs)
			}
		}
		sec := decode[corev1.Secret](t, objs, "Secret", tlsSecret)
		if len(sec.Data) != 0 || len(sec.StringData) != 0 {
			t.Error("the Secret ships with data: the webhook fills it")
		}
	})
}

func envValue(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// TestInjectComponentImage: one `images:` entry in the overlay moves the
// DaemonSet, the webhook and the injected init container's image
// (DRAIND_IMAGE) together, so injected pods use the image every node
// already runs.
func TestInjectComponentImage(t *testing.T) {
	objs := render(t, []string{ComponentWebhook}, "images:\n- name: ghcr.io/draind/draind\n  newName: registry.example.com/platform/draind\n  newTag: v9.9.9\n")
	const want = "registry.example.com/platform/draind:v9.9.9"
	ds := decode[appsv1.DaemonSet](t, objs, "DaemonSet", "draind")
	d := decode[appsv1.Deployment](t, objs, "Deployment", "draind-webhook")
	c := d.Spec.Template.Spec.Containers[0]
	if ds.Spec.Template.Spec.Containers[0].Image != want || c.Image != want || envValue(c, "DRAIND_IMAGE") != want {
		t.Errorf("DaemonSet %s, webhook %s, DRAIND_IMAGE %s: want all %s",
			ds.Spec.Template.Spec.Containers[0].Image, c.Image, envValue(c, "DRAIND_IMAGE"), want)
	}
}

// TestInjectComponentInBase: the base itself may list the component.
func TestInjectComponentInBase(t *testing.T) {
	root, err := draindbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	if err := files.CopyTree(filepath.Join(tmp, "deploy"), filepath.Join(root, "deploy")); err != nil {
		t.Fatal(err)
	}
	k := filepath.Join(tmp, "deploy", "daemonset", "kustomization.yaml")
	b, err := os.ReadFile(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(k, append(b, "\ncomponents:\n- ../webhook\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	objs, err := deploycheck.Render(filepath.Join(tmp, "deploy", "daemonset"))
	if err != nil {
		t.Fatal(err)
	}
	d := decode[appsv1.Deployment](t, objs, "Deployment", "draind-webhook")
	if got := d.Spec.Template.Spec.Containers[0].Image; got != "ghcr.io/draind/draind:"+release.Version {
		t.Errorf("webhook image %s", got)
	}
	if find(objs, "MutatingWebhookConfiguration", webhookConfig) == nil || find(objs, "DaemonSet", "draind") == nil {
		t.Error("the base with the component lacks the webhook configuration or the DaemonSet")
	}
}

// TestInjectComponentCertManager: with the cert-manager component the
// webhook serves cert-manager's certificate from a mounted Secret
// (--cert-dir), makes no API call (no token, no RBAC, no Secret of its
// own), and the cainjector fills the caBundle from a CA cert-manager
// keeps.
func TestInjectComponentCertManager(t *testing.T) {
	objs := render(t, []string{ComponentWebhook, ComponentCertManager}, "")
	for _, gone := range []struct{ kind, name string }{
		{"Secret", tlsSecret}, {"Role", "draind-webhook-tls"}, {"RoleBinding", "draind-webhook-tls"},
		{"ClusterRole", "draind-webhook"}, {"ClusterRoleBinding", "draind-webhook"},
	} {
		if find(objs, gone.kind, gone.name) != nil {
			t.Errorf("%s %s is still rendered", gone.kind, gone.name)
		}
	}
	d := decode[appsv1.Deployment](t, objs, "Deployment", "draind-webhook")
	pod := d.Spec.Template.Spec
	c := pod.Containers[0]
	if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
		t.Error("the ServiceAccount token is still mounted")
	}
	if !slices.Contains(c.Args, "--cert-dir=/tls") {
		t.Errorf("args %q lack --cert-dir=/tls", c.Args)
	}
	if !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == "draind-webhook-cert" }) ||
		!slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tls" && m.ReadOnly }) {
		t.Errorf("the certificate Secret is not mounted read-only at /tls: %+v %+v", pod.Volumes, c.VolumeMounts)
	}
	if envValue(c, "DRAIND_IMAGE") == "" || c.SecurityContext == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Error("the patch lost the container's environment or security context")
	}
	mwc := find(objs, "MutatingWebhookConfiguration", webhookConfig)
	if got := mwc.GetAnnotations()["cert-manager.io/inject-ca-from"]; got != systemNS+"/draind-webhook" {
		t.Errorf("inject-ca-from %q", got)
	}
	cert := find(objs, "Certificate", "draind-webhook")
	if cert == nil {
		t.Fatal("no Certificate draind-webhook")
	}
	secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
	dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
	issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
	if secret != "draind-webhook-cert" || !slices.Contains(dns, "draind-webhook.draind-system.svc") || issuer != "draind-webhook-ca" {
		t.Errorf("Certificate: secret %s, names %v, issuer %s", secret, dns, issuer)
	}
	if ca := find(objs, "Certificate", "draind-webhook-ca"); ca == nil {
		t.Error("no CA Certificate draind-webhook-ca")
	} else if isCA, _, _ := unstructured.NestedBool(ca.Object, "spec", "isCA"); !isCA {
		t.Error("Certificate draind-webhook-ca is not a CA")
	}
	if find(objs, "Issuer", "draind-webhook-ca") == nil || find(objs, "Issuer", "draind-webhook-selfsigned") == nil {
		t.Error("Issuers missing")
	}
}
