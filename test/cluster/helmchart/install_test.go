package helmchart

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	helmkube "helm.sh/helm/v4/pkg/kube"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// installBed is a real control plane (no nodes needed: nothing here waits
// for pods) with the prometheus-operator CRDs, and a Helm SDK
// configuration for the release namespace.
type installBed struct {
	cluster *kube.Cluster
	helm    *action.Configuration
	dyn     dynamic.Interface
	mapper  meta.RESTMapper
}

func startInstallBed(ctx context.Context, t *testing.T) *installBed {
	t.Helper()
	set, ok, err := kubebin.Cached()
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		if set, err = kubebin.Ensure(ctx, kube.TestLogger(t)); err != nil {
			t.Fatalf("building Kubernetes binaries: %v", err)
		}
	}
	c := kube.StartT(t, kube.Config{Binaries: set, Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := deploycheck.InstallMonitoringCRDs(ctx, c.AdminConfig); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := kube.WriteKubeconfig(kubeconfig, c.AdminConfig); err != nil {
		t.Fatal(err)
	}
	ns := namespace
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := action.NewConfiguration()
	if err := cfg.Init(flags, namespace, "secret"); err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	return &installBed{cluster: c, helm: cfg, dyn: dyn,
		mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Admin.Discovery()))}
}

// get returns o's live object, nil if it does not exist.
func (b *installBed) get(ctx context.Context, t *testing.T, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	gvk := o.GroupVersionKind()
	m, err := b.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", Key(o), err)
	}
	var ri dynamic.ResourceInterface = b.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = b.dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	live, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatalf("getting %s: %v", Key(o), err)
	}
	return live
}

// TestHelmInstall installs the chart into a real kube-apiserver with the
// Helm SDK as `helm install --create-namespace` does, upgrades it (webhook
// on, a flag changed), upgrades back and uninstalls it, checking after each
// step that the cluster holds exactly what the chart renders.
func TestHelmInstall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b := startInstallBed(ctx, t)
	dir, err := ChartDir()
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}

	in := action.NewInstall(b.helm)
	in.ReleaseName, in.Namespace, in.CreateNamespace = ReleaseName, namespace, true
	in.WaitStrategy = helmkube.HookOnlyStrategy
	if _, err := in.RunWithContext(ctx, ch, nil); err != nil {
		t.Fatalf("helm install --create-namespace: %v", err)
	}
	defaults := render(t, namespace, nil)
	for _, o := range defaults {
		live := b.get(ctx, t, o)
		if live == nil {
			t.Errorf("installed release lacks %s", Key(o))
			continue
		}
		for k, v := range o.GetLabels() {
			if live.GetLabels()[k] != v {
				t.Errorf("%s: label %s=%q, want %q", Key(o), k, live.GetLabels()[k], v)
			}
		}
	}

	withWebhook := map[string]any{"webhook": map[string]any{"enabled": true}, "runFlags": map[string]any{"log-format": "json", "linger": "3m"}}
	up := action.NewUpgrade(b.helm)
	up.Namespace, up.WaitStrategy = namespace, helmkube.HookOnlyStrategy
	if _, err := up.RunWithContext(ctx, ReleaseName, ch, withWebhook); err != nil {
		t.Fatalf("helm upgrade (webhook on): %v", err)
	}
	for _, o := range render(t, namespace, withWebhook) {
		if b.get(ctx, t, o) == nil {
			t.Errorf("upgraded release lacks %s", Key(o))
		}
	}
	ds, err := b.cluster.Admin.AppsV1().DaemonSets(namespace).Get(ctx, "draind", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--linger=3m") {
		t.Errorf("after the upgrade the DaemonSet runs %q, want --linger=3m", args)
	}

	up = action.NewUpgrade(b.helm)
	// --reset-values: an upgrade given no values otherwise reuses the last.
	up.Namespace, up.WaitStrategy, up.ResetValues = namespace, helmkube.HookOnlyStrategy, true
	if _, err := up.RunWithContext(ctx, ReleaseName, ch, nil); err != nil {
		t.Fatalf("helm upgrade (defaults again): %v", err)
	}
	for _, o := range render(t, namespace, withWebhook) {
		inDefaults := slices.ContainsFunc(defaults, func(d *unstructured.Unstructured) bool { return Key(d) == Key(o) })
		if live := b.get(ctx, t, o); (live != nil) != inDefaults {
			t.Errorf("after upgrading back to the defaults %s exists: %v, want %v", Key(o), live != nil, inDefaults)
		}
	}
	checkDaemonSetUnchanged(ctx, t, b, ds)

	un := action.NewUninstall(b.helm)
	un.WaitStrategy = helmkube.HookOnlyStrategy
	if _, err := un.Run(ReleaseName); err != nil {
		t.Fatalf("helm uninstall: %v", err)
	}
	for _, o := range defaults {
		// The bed runs no namespace controller: the Namespace stays
		// Terminating, its objects gone.
		if live := b.get(ctx, t, o); live != nil && live.GetDeletionTimestamp() == nil {
			t.Errorf("after helm uninstall %s is still there", Key(o))
		}
	}
}

// checkDaemonSetUnchanged: upgrades keep the DaemonSet's selector (it is
// immutable: a chart that changed it could not be upgraded).
func checkDaemonSetUnchanged(ctx context.Context, t *testing.T, b *installBed, before *appsv1.DaemonSet) {
	t.Helper()
	ds, err := b.cluster.Admin.AppsV1().DaemonSets(namespace).Get(ctx, "draind", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(mapKeys(ds.Spec.Selector.MatchLabels), mapKeys(before.Spec.Selector.MatchLabels)) {
		t.Errorf("selector changed: %v -> %v", before.Spec.Selector.MatchLabels, ds.Spec.Selector.MatchLabels)
	}
	if slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, "--linger=3m") {
		t.Errorf("upgrading back to the defaults kept --linger=3m")
	}
}

func mapKeys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
