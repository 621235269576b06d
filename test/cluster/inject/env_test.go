package inject

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	podinject "github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

const (
	systemNS      = "draind-system"
	webhookSA     = "draind-webhook"
	webhookConfig = "draind-webhook"
	tlsSecret     = "draind-webhook-tls"
	// probeNS is an opted-in namespace for readiness probes (dry-run pods).
	probeNS = "inject-probe"
)

// shared is the control plane every test of the package uses (one
// kube-apiserver, kube-controller-manager with the Deployment and ReplicaSet
// controllers), with the component installed once: namespace, RBAC,
// ServiceAccount, the empty Secret, Deployment, Service and
// PodDisruptionBudget exactly as rendered. Each test starts its own webhook
// processes and webhook configuration (startWebhooks).
var shared struct {
	once sync.Once
	skip string
	err  error

	c       *kube.Cluster
	dir     string
	bin     string
	comp    []*unstructured.Unstructured // what deploy/webhook adds to the base
	kubecfg string                       // the webhook ServiceAccount's kubeconfig
	dep     *appsv1.Deployment           // the rendered webhook Deployment
	image   string                       // its DRAIND_IMAGE: the injected init container's image
}

func closeShared() error {
	if shared.c == nil {
		return nil
	}
	err := shared.c.Stop()
	os.RemoveAll(shared.dir)
	return err
}

func setupShared() error {
	set, ok, err := kubebin.Cached()
	if err != nil {
		return err
	}
	if !ok {
		if os.Getenv(kube.EnvPrivileged) != "1" {
			shared.skip = fmt.Sprintf("SKIP: needs kube-apiserver and kube-controller-manager %s built: run `go run ./cmd/kubebuild` in test/cluster (cold build 7-15 min), or set %s=1 to build them here",
				kubebin.Version, kube.EnvPrivileged)
			return nil
		}
		if set, err = kubebin.Ensure(context.Background(), nil); err != nil {
			return fmt.Errorf("building Kubernetes binaries: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if shared.dir, err = os.MkdirTemp("", "draind-inject-"); err != nil {
		return err
	}
	var keep string
	if d := os.Getenv(kube.EnvKeepDir); d != "" {
		if keep, err = os.MkdirTemp(d, "inject-"); err != nil {
			return err
		}
	}
	shared.c, err = kube.Start(ctx, kube.Config{
		Binaries:              set,
		Dir:                   keep,
		ControllerManagerArgs: []string{"--controllers=" + kube.WorkloadControllers},
		Log:                   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		return err
	}
	if shared.bin, err = draindbin.Build(ctx, shared.dir); err != nil {
		return err
	}
	base, err := RenderOverlay(nil, "")
	if err != nil {
		return err
	}
	with, err := RenderOverlay([]string{ComponentWebhook}, "")
	if err != nil {
		return err
	}
	shared.comp = Added(base, with)
	var install []*unstructured.Unstructured
	for _, o := range base {
		if o.GetKind() == "Namespace" {
			install = append(install, o)
		}
	}
	for _, o := range shared.comp {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			install = append(install, o)
		}
	}
	if err := shared.c.CreateObjects(ctx, install); err != nil {
		return err
	}
	shared.dep = &appsv1.Deployment{}
	if err := fromUnstructured(find(shared.comp, "Deployment", "draind-webhook"), shared.dep); err != nil {
		return err
	}
	for _, e := range shared.dep.Spec.Template.Spec.Containers[0].Env {
		if e.Name == "DRAIND_IMAGE" {
			shared.image = e.Value
		}
	}
	if shared.image == "" {
		return fmt.Errorf("the rendered Deployment sets no DRAIND_IMAGE")
	}
	if err := shared.c.WaitServiceAccount(ctx, systemNS, webhookSA); err != nil {
		return err
	}
	sa, err := shared.c.ServiceAccountConfig(ctx, systemNS, webhookSA, 3*time.Hour)
	if err != nil {
		return err
	}
	shared.kubecfg = filepath.Join(shared.dir, "webhook.kubeconfig")
	if err := kube.WriteKubeconfig(shared.kubecfg, sa); err != nil {
		return err
	}
	return createNamespace(ctx, probeNS, map[string]string{podinject.Key: "true"})
}

// cluster returns the shared control plane, starting it on first use.
func cluster(t *testing.T) *kube.Cluster {
	t.Helper()
	shared.once.Do(func() { shared.err = setupShared() })
	if shared.err != nil {
		t.Fatalf("setting up the shared control plane: %v", shared.err)
	}
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for name, tail := range shared.c.LogTails(20) {
				t.Logf("--- last lines of %s:\n%s", name, tail)
			}
		}
	})
	return shared.c
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func fromUnstructured(u *unstructured.Unstructured, into any) error {
	if u == nil {
		return fmt.Errorf("object not rendered")
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true)
}

func createNamespace(ctx context.Context, name string, labels map[string]string) error {
	_, err := shared.c.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	return shared.c.WaitServiceAccount(ctx, name, "default")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := kube.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// webhooks is what startWebhooks started for one test.
type webhooks struct {
	procs []*Process
	relay *Relay // nil with one replica: the configuration calls it directly
	url   string // https://host:port the configuration calls
}

// startWebhooks starts n `draind webhook` processes with the rendered
// args and environment plus the bed's (loopback addresses, the
// ServiceAccount's kubeconfig, 127.0.0.1 in the certificate) and extra
// flags, and (re)creates the rendered MutatingWebhookConfiguration with its
// clientConfig pointing at them; emptySecret starts from no TLS material.
// It returns once the API server calls them: a dry-run pod in an opted-in
// namespace comes back injected.
func startWebhooks(t *testing.T, n int, emptySecret bool, flags ...string) *webhooks {
	t.Helper()
	c := cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if emptySecret {
		s, err := c.Admin.CoreV1().Secrets(systemNS).Get(ctx, tlsSecret, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data = nil
		if _, err := c.Admin.CoreV1().Secrets(systemNS).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	w := &webhooks{}
	var backends []string
	for i := 0; i < n; i++ {
		addr, health := freeAddr(t), freeAddr(t)
		args, env := HostArgs(shared.dep, shared.kubecfg, addr, health)
		p, err := StartProcess(shared.bin, append(args, flags...), env, addr, health, filepath.Join(logDir(t), fmt.Sprintf("webhook-%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := p.Stop(); err != nil {
				t.Errorf("stopping webhook %d: %v", i, err)
			}
			if t.Failed() {
				t.Logf("--- webhook %d log (last lines):\n%s", i, p.Tail(30))
			}
		})
		w.procs = append(w.procs, p)
		backends = append(backends, addr)
	}
	w.url = "https://" + backends[0]
	if n > 1 {
		r, err := NewRelay(backends...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Close)
		w.relay, w.url = r, "https://"+r.Addr
	}
	setWebhookConfig(ctx, t, w.url)
	for _, p := range w.procs {
		if err := p.WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitInjecting(ctx, t)
	return w
}

// setWebhookConfig replaces the webhook configuration with the rendered
// one, its clientConfig changed from the Service to url + the same path.
func setWebhookConfig(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	var mwc admissionregistrationv1.MutatingWebhookConfiguration
	if err := fromUnstructured(find(shared.comp, "MutatingWebhookConfiguration", webhookConfig), &mwc); err != nil {
		t.Fatal(err)
	}
	createWebhookConfig(ctx, t, &mwc, url)
}

// createWebhookConfig creates mwc (replacing any) with every entry's
// clientConfig changed from the Service to url + the same path, and
// deletes it when the test ends.
func createWebhookConfig(ctx context.Context, t *testing.T, mwc *admissionregistrationv1.MutatingWebhookConfiguration, url string) {
	t.Helper()
	for i := range mwc.Webhooks {
		cc := &mwc.Webhooks[i].ClientConfig
		if cc.Service == nil || cc.Service.Path == nil {
			t.Fatalf("rendered webhook %s calls no Service path", mwc.Webhooks[i].Name)
		}
		u := url + *cc.Service.Path
		cc.Service, cc.URL = nil, &u
	}
	api := shared.c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if err := api.Delete(ctx, webhookConfig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	if _, err := api.Create(ctx, mwc, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("creating the webhook configuration: %v", err)
	}
	t.Cleanup(func() {
		if err := api.Delete(context.Background(), webhookConfig, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting the webhook configuration: %v", err)
		}
	})
}

func probePod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: probeNS},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "registry.example/probe:1"}}},
	}
}

func waitInjecting(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := WaitInjecting(ctx, shared.c.Admin, probeNS); err != nil {
		t.Fatal(err)
	}
}

// waitPods waits until the ReplicaSet controller has created n pods
// matching selector in ns, and returns them.
func waitPods(ctx context.Context, t *testing.T, ns, selector string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := shared.c.Admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods = l.Items
		return len(pods) >= n, nil
	})
	if err != nil {
		t.Fatalf("waiting for %d pods %s in %s (have %d): %v", n, selector, ns, len(pods), err)
	}
	return pods
}

// deployment is a Deployment of replicas pods with label app=name.
func deployment(ns, name string, replicas int32, spec corev1.PodSpec, annotations map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(replicas),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels, Annotations: annotations},
				Spec:       spec,
			},
		},
	}
}

// deploy creates a Deployment and returns its pods once created.
func deploy(ctx context.Context, t *testing.T, d *appsv1.Deployment) []corev1.Pod {
	t.Helper()
	if _, err := shared.c.Admin.AppsV1().Deployments(d.Namespace).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Deployment %s/%s: %v", d.Namespace, d.Name, err)
	}
	return waitPods(ctx, t, d.Namespace, "app="+d.Name, int(*d.Spec.Replicas))
}

// offlineCmd is the preStop command the webhook writes with its default
// wait and fallback sleep, followed by the chain.
func offlineCmd(then ...string) []string {
	return append([]string{podinject.ToolsBinary, "offline", "--wait=1m0s", "--fallback-sleep=20s"}, then...)
}

// checkInjected asserts the pod as the webhook must mutate it: the init
// container copying draind from the DaemonSet's image into the tools
// emptyDir, and in each named container HOST_IP from status.hostIP, the
// tools mount and the preStop command; the grace period covers the wait.
func checkInjected(t *testing.T, p *corev1.Pod, want map[string][]string, grace int64) {
	t.Helper()
	name := p.Namespace + "/" + p.Name
	if len(p.Spec.InitContainers) == 0 || p.Spec.InitContainers[0].Name != podinject.InitContainer {
		t.Errorf("%s: no %s init container first: %+v", name, podinject.InitContainer, p.Spec.InitContainers)
		return
	}
	ic := p.Spec.InitContainers[0]
	if ic.Image != shared.image || !slices.Equal(ic.Command, []string{"/usr/local/bin/draind", "copy-self", podinject.ToolsBinary}) {
		t.Errorf("%s: init container runs %s %q, want %s copy-self", name, ic.Image, ic.Command, shared.image)
	}
	if sc := ic.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: init container security context %+v", name, ic.SecurityContext)
	}
	if !slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == podinject.ToolsVolume && v.EmptyDir != nil }) {
		t.Errorf("%s: no emptyDir %s", name, podinject.ToolsVolume)
	}
	for _, c := range p.Spec.Containers {
		cmd, selected := want[c.Name]
		if !selected {
			continue
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil || !slices.Equal(c.Lifecycle.PreStop.Exec.Command, cmd) {
			t.Errorf("%s container %s: preStop %+v\nwant exec %q", name, c.Name, c.Lifecycle, cmd)
		}
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == podinject.HostIPEnv && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.hostIP"
		}) {
			t.Errorf("%s container %s: no %s from status.hostIP in %+v", name, c.Name, podinject.HostIPEnv, c.Env)
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == podinject.ToolsVolume && m.MountPath == podinject.ToolsDir && m.ReadOnly
		}) {
			t.Errorf("%s container %s: tools volume not mounted read-only at %s", name, c.Name, podinject.ToolsDir)
		}
	}
	if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != grace {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want %d", name, g, grace)
	}
}

// checkUntouched asserts the webhook changed nothing.
func checkUntouched(t *testing.T, p *corev1.Pod, grace int64) {
	t.Helper()
	name := p.Namespace + "/" + p.Name
	if p.Annotations[podinject.KeyInjected] != "" || slices.ContainsFunc(p.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == podinject.InitContainer }) ||
		slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == podinject.ToolsVolume }) {
		t.Errorf("%s was injected: annotations %v, init containers %d", name, p.Annotations, len(p.Spec.InitContainers))
	}
	for _, c := range p.Spec.Containers {
		if c.Lifecycle != nil || slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == podinject.HostIPEnv }) {
			t.Errorf("%s container %s was changed: lifecycle %+v env %+v", name, c.Name, c.Lifecycle, c.Env)
		}
	}
	if g := p.Spec.TerminationGracePeriodSeconds; g == nil || *g != grace {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want %d", name, g, grace)
	}
}

// logDir is where a test's webhook logs go: a temporary directory, or
// under $DRAIND_CLUSTER_DIR when set (kept for debugging).
func logDir(t *testing.T) string {
	if d := os.Getenv(kube.EnvKeepDir); d != "" {
		dir, err := os.MkdirTemp(d, strings.ReplaceAll(t.Name(), "/", "_")+"-")
		if err == nil {
			return dir
		}
	}
	return t.TempDir()
}
