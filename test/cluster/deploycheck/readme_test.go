package deploycheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/draind/draind/deploy/release"
	"github.com/draind/draind/test/cluster/files"
	"github.com/draind/draind/test/readme"
)

func daemonSetImage(t *testing.T, objs []*unstructured.Unstructured) string {
	t.Helper()
	ds := Find(objs, schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "draind")
	if ds == nil {
		t.Fatal("no DaemonSet draind")
	}
	cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(cs) == 0 {
		t.Fatal("DaemonSet without containers")
	}
	img, _ := cs[0].(map[string]any)["image"].(string)
	return img
}

// TestBaseImageIsTheRelease: the rendered base runs draind's release image
// (deploy/release.Version), never a moving tag.
func TestBaseImageIsTheRelease(t *testing.T) {
	if img := daemonSetImage(t, rendered(t)); img != "ghcr.io/draind/draind:"+release.Version {
		t.Errorf("the base runs %s, want ghcr.io/draind/draind:%s", img, release.Version)
	}
}

// TestREADMEOverlays renders every kustomize overlay the README prints (the
// yaml blocks starting with "# deploy/overlays/<name>/kustomization.yaml"),
// exactly as printed, at that path next to a copy of the base, decodes the
// result strictly and checks that each does what the README says.
func TestREADMEOverlays(t *testing.T) {
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	base, err := BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]func(t *testing.T, objs []*unstructured.Unstructured){
		"my-registry": func(t *testing.T, objs []*unstructured.Unstructured) {
			if img := daemonSetImage(t, objs); img != "registry.example.com/platform/draind:"+release.Version {
				t.Errorf("image %s, want the overlay's registry with the release tag", img)
			}
		},
		"no-prometheus-operator": func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, o := range objs {
				if o.GroupVersionKind().Group == "monitoring.coreos.com" {
					t.Errorf("%s is still rendered", Describe(o))
				}
			}
			if Find(objs, schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "draind") == nil {
				t.Error("the overlay lost the DaemonSet")
			}
		},
		"webhook": func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, want := range []schema.GroupKind{{Group: "apps", Kind: "DaemonSet"}, {Group: "apps", Kind: "Deployment"}, {Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}} {
				name := "draind-webhook"
				if want.Kind == "DaemonSet" {
					name = "draind"
				}
				if Find(objs, want, name) == nil {
					t.Errorf("no %s %s", want, name)
				}
			}
			if Find(objs, schema.GroupKind{Kind: "Secret"}, "draind-webhook-tls") == nil {
				t.Error("no Secret draind-webhook-tls for the self-managed certificates")
			}
		},
		"webhook-cert-manager": func(t *testing.T, objs []*unstructured.Unstructured) {
			if Find(objs, schema.GroupKind{Group: "cert-manager.io", Kind: "Certificate"}, "draind-webhook") == nil {
				t.Error("no cert-manager Certificate draind-webhook")
			}
			if Find(objs, schema.GroupKind{Kind: "Secret"}, "draind-webhook-tls") != nil {
				t.Error("the self-managed Secret is still rendered")
			}
			mwc := Find(objs, schema.GroupKind{Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}, "draind-webhook")
			if mwc == nil || mwc.GetAnnotations()["cert-manager.io/inject-ca-from"] == "" {
				t.Error("the webhook configuration is not annotated for cert-manager's cainjector")
			}
		},
		"kube-prometheus-stack": func(t *testing.T, objs []*unstructured.Unstructured) {
			for _, kind := range []string{"PodMonitor", "PrometheusRule"} {
				o := Find(objs, schema.GroupKind{Group: "monitoring.coreos.com", Kind: kind}, "draind")
				if o == nil {
					t.Fatalf("no %s", kind)
				}
				if o.GetLabels()["release"] != "kube-prometheus-stack" || o.GetLabels()["app.kubernetes.io/part-of"] != "draind" {
					t.Errorf("%s labels %v, want release=kube-prometheus-stack added", kind, o.GetLabels())
				}
			}
		},
	}
	seen := map[string]bool{}
	for _, b := range doc.Blocks {
		first, _, _ := strings.Cut(b.Text, "\n")
		path, ok := strings.CutPrefix(first, "# deploy/overlays/")
		if b.Lang != "yaml" || !ok {
			continue
		}
		name, file, _ := strings.Cut(path, "/")
		t.Run(name, func(t *testing.T) {
			if file != "kustomization.yaml" {
				t.Fatalf("%s: overlay file %q, want kustomization.yaml", b.Where(), file)
			}
			check, ok := checks[name]
			if !ok {
				t.Fatalf("%s: overlay %s has no check here: add one", b.Where(), name)
			}
			seen[name] = true
			root := t.TempDir()
			// All of deploy/: overlays may include its components too.
			if err := files.CopyTree(filepath.Join(root, "deploy"), filepath.Dir(base)); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(root, "deploy", "overlays", name)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.Text), 0o644); err != nil {
				t.Fatal(err)
			}
			objs, err := Render(dir)
			if err != nil {
				t.Fatalf("%s: %v", b.Where(), err)
			}
			for _, o := range objs {
				if o.GroupVersionKind().Group == "cert-manager.io" {
					continue // no cert-manager types in this module
				}
				if _, err := DecodeStrict(s, o); err != nil {
					t.Error(err)
				}
			}
			check(t, objs)
		})
	}
	for name := range checks {
		if !seen[name] {
			t.Errorf("the README no longer prints overlay %s", name)
		}
	}
}
