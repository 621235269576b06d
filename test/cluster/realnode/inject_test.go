package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draindbin"
	injectbed "github.com/draind/draind/test/cluster/inject"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/realnode"
)

// TestInjectRollout is the webhook's rollout: the shipped DaemonSet and the
// webhook component installed with `kubectl apply -k` of one overlay, a
// namespace labelled draind.io/inject=true, and the application's
// Deployment with no preStop at all. A `kubectl rollout restart` under the
// three clients (ClusterIP, a stale pod IP, keep-alive) has 0 failed
// requests: every old pod got the draind preStop from the webhook, waited
// until drained, and only then was sent SIGTERM.
//
// The webhook's Deployment runs in the node like any workload (two
// replicas, non-root, its ServiceAccount token, the Secret); the API
// server, on the host, cannot reach pod IPs (nothing routes there from the
// host namespace), so the webhook configuration calls the same binary with
// the same arguments, environment and ServiceAccount on the host's
// loopback instead of the Service (an overlay patch of clientConfig, the
// only change). Every replica keeps the same TLS material in the one
// Secret, so the in-node replicas' certificate names 127.0.0.1 too.
func TestInjectRollout(t *testing.T) {
	requireRealNode(t)
	bins := kube.Binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	start := time.Now()
	n := startNode(ctx, t, bins)
	root, err := draindbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	overlayImage := image.DraindRepository + ":" + overlayTag
	img, err := realnode.BuildDraindImage(ctx, filepath.Join(n.Dir, "draind-image"), overlayTag, overlayImage)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImages(ctx, img.Archive); err != nil {
		t.Fatal(err)
	}

	webhookAddr, err := kube.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	overlay := writeInjectOverlay(t, root, webhookAddr)
	installInject(ctx, t, n, overlay)
	if out, err := n.Kubectl(ctx, "-n", "draind-system", "rollout", "status", "deploy/draind-webhook", "--timeout=3m"); err != nil {
		t.Fatalf("the webhook Deployment did not become ready in the node: %v\n%s", err, out)
	}
	objs, err := deploycheck.Render(overlay)
	if err != nil {
		t.Fatal(err)
	}
	var dep appsv1.Deployment
	u := deploycheck.Find(objs, appsv1.SchemeGroupVersion.WithKind("Deployment").GroupKind(), "draind-webhook")
	if u == nil {
		t.Fatal("the overlay renders no webhook Deployment")
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &dep); err != nil {
		t.Fatal(err)
	}
	checkWebhookPods(ctx, t, n, &dep)

	sa, err := n.Cluster.ServiceAccountConfig(ctx, "draind-system", "draind-webhook", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(n.Dir, "draind-webhook.kubeconfig")
	if err := kube.WriteKubeconfig(kubeconfig, sa); err != nil {
		t.Fatal(err)
	}
	healthAddr, err := kube.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	args, env := injectbed.HostArgs(&dep, kubeconfig, webhookAddr, healthAddr)
	wh, err := injectbed.StartProcess(img.Binary, args, env, webhookAddr, healthAddr, n.LogPath("draind-webhook-host"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- the host webhook's log (last lines):\n%s", wh.Tail(40))
		}
		if err := wh.Stop(); err != nil {
			t.Errorf("stopping the webhook: %v", err)
		}
	})
	if err := wh.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	const ns = "inject"
	cs := n.Cluster.Admin
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{"draind.io/inject": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := injectbed.WaitInjecting(ctx, cs, ns); err != nil {
		t.Fatal(err)
	}

	// The application exactly as TestRealNode deploys it, minus any preStop.
	spec := realnode.SleepPodSpec(0)
	spec.Containers[0].Lifecycle = nil
	obs := &drainObserver{n: n, namespace: ns}
	res := runRollout(ctx, t, n, ns, spec, obs.run)
	for _, p := range res.oldPods {
		checkInjectedPod(t, &p, overlayImage)
	}
	for kind, st := range res.clients {
		if st.Failed() != 0 {
			t.Errorf("with the injected preStop the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		}
	}
	obs.check(ctx, t, res)
	adm, err := wh.Admissions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if adm["injected"] < float64(2*len(res.oldPods)) {
		t.Errorf("the webhook injected %v pods, want at least the 3 old and the 3 new ones", adm["injected"])
	}
	printTable(t, []*rolloutResult{res})
	t.Logf("TestInjectRollout wall time (node start, images, install, rollout): %v; webhook admissions %v", time.Since(start).Round(time.Second), adm)
}

// writeInjectOverlay writes the overlay: the base and the webhook
// component with the test's image tag; the webhook configuration calls
// addr on the host's loopback; the in-node replicas' certificate names
// 127.0.0.1 as well (they share the Secret with the host's process).
func writeInjectOverlay(t *testing.T, root, addr string) string {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, "deploy", p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
components:
- %s
images:
- name: %s
  newTag: %s
patches:
- target:
    kind: MutatingWebhookConfiguration
    name: draind-webhook
  patch: |-
    - op: replace
      path: /webhooks/0/clientConfig
      value: {url: "https://%[5]s/inject/namespace"}
    - op: replace
      path: /webhooks/1/clientConfig
      value: {url: "https://%[5]s/inject/pod"}
- target:
    kind: Deployment
    name: draind-webhook
  patch: |-
    - op: add
      path: /spec/template/spec/containers/0/args/-
      value: --tls-extra-san=127.0.0.1
`, rel("daemonset"), rel("webhook"), image.DraindRepository, overlayTag, addr)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// checkWebhookPods: the webhook's two replicas run in the node, Ready,
// with exactly the component's security context.
func checkWebhookPods(ctx context.Context, t *testing.T, n *realnode.Node, dep *appsv1.Deployment) {
	t.Helper()
	pods, err := n.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=draind-webhook"})
	if err != nil {
		t.Fatal(err)
	}
	ready := 0
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		if podReady(&p) {
			ready++
		}
		if got, want := js(p.Spec.Containers[0].SecurityContext), js(dep.Spec.Template.Spec.Containers[0].SecurityContext); got != want {
			t.Errorf("webhook pod %s container securityContext %s, want the component's %s", p.Name, got, want)
		}
		if slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == "draind-tools" }) {
			t.Errorf("webhook pod %s (draind-system) was injected", p.Name)
		}
	}
	if ready != 2 {
		t.Errorf("%d of the webhook's replicas are Ready in the node, want 2", ready)
	}
	t.Logf("the webhook Deployment runs in the node: %d replicas Ready, non-root, read-only, no capabilities", ready)
}

// checkInjectedPod: an old pod of the rollout had the webhook's preStop,
// HOST_IP, the init container from the overlay's image, and nothing the
// user wrote.
func checkInjectedPod(t *testing.T, p *corev1.Pod, image string) {
	t.Helper()
	app := p.Spec.Containers[0]
	want := []string{"/draind-tools/draind", "offline", "--wait=1m0s", "--fallback-sleep=20s"}
	if app.Lifecycle == nil || app.Lifecycle.PreStop == nil || app.Lifecycle.PreStop.Exec == nil || !slices.Equal(app.Lifecycle.PreStop.Exec.Command, want) {
		t.Errorf("pod %s: preStop %+v, want exec %q", p.Name, app.Lifecycle, want)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Image != image {
		t.Errorf("pod %s: init containers %+v, want draind-tools from %s", p.Name, p.Spec.InitContainers, image)
	}
	if !slices.ContainsFunc(app.Env, func(e corev1.EnvVar) bool { return e.Name == "HOST_IP" }) {
		t.Errorf("pod %s: no HOST_IP", p.Name)
	}
	if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != 30+80 {
		t.Errorf("pod %s: grace period %v, want 110", p.Name, g)
	}
	if !strings.Contains(p.Annotations[injectbed.InjectedAnnotation], "app") {
		t.Errorf("pod %s: annotations %v", p.Name, p.Annotations)
	}
}

// installInject applies the overlay with kubectl (the monitoring CRDs
// first) and waits for the DaemonSet's pod to be Running and Ready.
// TestRealNode checks the DaemonSet itself in depth.
func installInject(ctx context.Context, t *testing.T, n *realnode.Node, overlay string) {
	t.Helper()
	if err := deploycheck.InstallMonitoringCRDs(ctx, n.Cluster.AdminConfig); err != nil {
		t.Fatal(err)
	}
	if out, err := n.Kubectl(ctx, "apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k: %v\n%s", err, out)
	} else {
		t.Logf("kubectl apply -k overlay:\n%s", out)
	}
	waitDraindRolledOut(ctx, t, n)
}
