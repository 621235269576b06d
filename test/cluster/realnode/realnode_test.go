package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/draind/draind/daemon"
	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
	"github.com/draind/draind/test/cluster/realnode"
	"github.com/draind/draind/test/readme"
)

// recipeMarker introduces the README's curl-less preStop recipe.
const recipeMarker = "For images without any shell tool"

// overlayTag is the only thing the test's overlay changes: the image tag
// (the base says latest; the image is built here and imported as :dev, the
// tag cmd/draind-image and the Dockerfile's example give a local build).
const overlayTag = "dev"

// requireRealNode skips outside CI with the reason, and fails in CI
// (PRIVILEGED_TESTS=1) if something the node needs is missing.
func requireRealNode(t *testing.T) {
	t.Helper()
	if os.Getenv(kube.EnvPrivileged) != "1" {
		t.Skip("SKIP: a real node (containerd, kubelet, network namespaces, cgroups, bpffs) needs root and PRIVILEGED_TESTS=1")
	}
	if os.Geteuid() != 0 {
		t.Fatal("PRIVILEGED_TESTS=1 but not root: a real node needs root")
	}
	if missing := realnode.Tools(); len(missing) > 0 {
		t.Fatalf("a real node needs %s: apt-get install containerd runc containernetworking-plugins (.ci/run installs them)", strings.Join(missing, ", "))
	}
}

// TestRealNode runs the shipped DaemonSet on a real kubelet, containerd and
// runc, and the README's preStop recipe under a real rolling update: one
// node for the whole test, the scenarios as ordered subtests.
func TestRealNode(t *testing.T) {
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	start := time.Now()
	b := startDraindBed(ctx, t)
	n, root, overlay := b.n, b.root, b.overlay
	offlineSpec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		t.Fatal(err)
	}

	var results []*rolloutResult
	must := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	// The rollout with draind is checked through a real Prometheus: it
	// starts now, while the first rollout runs.
	promStart := time.Now()
	prom := startNodeProm(t, n)
	promCost := time.Since(promStart)
	must("WithoutDraind", func(t *testing.T) {
		res := runRollout(ctx, t, n, "without-draind", realnode.SleepPodSpec(5), nil)
		results = append(results, res)
		if res.clients[realnode.ClientStale].Failed() == 0 {
			t.Errorf("without draind the stale pod-IP client saw no failure: the scenario tests nothing")
		}
	})
	must("Install", func(t *testing.T) { install(ctx, t, n, root, overlay) })
	must("WithDraind", func(t *testing.T) {
		promStart := time.Now()
		prom.waitUp(ctx, t)
		promCost += time.Since(promStart)
		obs := &drainObserver{n: n, namespace: "with-draind"}
		var restarted time.Time
		res := runRollout(ctx, t, n, "with-draind", offlineSpec, func(ctx context.Context, t *testing.T, res *rolloutResult) {
			restarted = time.Now()
			obs.run(ctx, t, res)
		})
		results = append(results, res)
		for kind, st := range res.clients {
			if st.Failed() != 0 {
				t.Errorf("with draind the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
			}
		}
		obs.check(ctx, t, res)
		checkStart := time.Now()
		checkPrometheus(ctx, t, prom, n, res, restarted)
		t.Logf("real-node figures: the bed's Prometheus cost %v to start and %v to check", promCost.Round(time.Millisecond), time.Since(checkStart).Round(time.Millisecond))
	})
	must("Upgrade", func(t *testing.T) { results = append(results, upgrade(ctx, t, n, offlineSpec)) })
	printTable(t, results)
	must("Uninstall", func(t *testing.T) { uninstall(ctx, t, n, overlay, b.img.Binary) })
	t.Logf("real-node figures: TestRealNode wall time (node start, images, every scenario; Stop follows): %v", time.Since(start).Round(time.Second))
}

// draindBed is a started real node with draind's image imported and the
// README's curl-less recipe read: what the tests that install the shipped
// DaemonSet share.
type draindBed struct {
	n       *realnode.Node
	root    string // the repository
	recipe  []byte // the README's curl-less preStop recipe, as printed
	img     *realnode.DraindImage
	overlay string // the operator's overlay: the base with the image tag changed
}

// startDraindBed starts a real node (stopped, and the host checked clean,
// when the test ends), builds draind's image and imports it under the
// overlay's tag and the recipe's.
func startDraindBed(ctx context.Context, t *testing.T) *draindBed {
	t.Helper()
	n := startNode(ctx, t, kube.Binaries(t))
	b := &draindBed{n: n}
	var err error
	if b.root, err = draindbin.RepoRoot(); err != nil {
		t.Fatal(err)
	}
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	if b.recipe, err = realnode.READMEBlock([]byte(doc.Text), recipeMarker); err != nil {
		t.Fatal(err)
	}
	spec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.InitContainers) != 1 {
		t.Fatalf("the README's recipe has %d init containers, want 1 (the draind copy)", len(spec.InitContainers))
	}
	overlayImage := image.DraindRepository + ":" + overlayTag
	refs := []string{overlayImage}
	if r := spec.InitContainers[0].Image; r != overlayImage {
		refs = append(refs, r)
	}
	if b.img, err = realnode.BuildDraindImage(ctx, filepath.Join(n.Dir, "draind-image"), overlayTag, refs...); err != nil {
		t.Fatal(err)
	}
	if err := n.ImportImages(ctx, b.img.Archive); err != nil {
		t.Fatal(err)
	}
	t.Logf("draind image built and imported as %v (the README recipe's image: %s)", refs, spec.InitContainers[0].Image)
	b.overlay = writeOverlay(t, b.root)
	return b
}

// writeOverlay writes the overlay an operator would: the shipped base with
// only the image tag changed.
func writeOverlay(t *testing.T, root string) string {
	t.Helper()
	dir := t.TempDir()
	base, err := filepath.Rel(dir, filepath.Join(root, "deploy", "daemonset"))
	if err != nil {
		t.Fatal(err)
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: %s
  newTag: %s
`, base, image.DraindRepository, overlayTag)
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// install applies the overlay with kubectl and checks the pod: Running and
// Ready with exactly the shipped securityContext, its programs attached to
// the kubelet's kubepods cgroup, `draind status` healthy with conntrack on.
func install(ctx context.Context, t *testing.T, n *realnode.Node, root, overlay string) {
	if err := deploycheck.InstallMonitoringCRDs(ctx, n.Cluster.AdminConfig); err != nil {
		t.Fatal(err)
	}
	if out, err := n.Kubectl(ctx, "apply", "-k", overlay); err != nil {
		t.Fatalf("kubectl apply -k: %v", err)
	} else {
		t.Logf("kubectl apply -k overlay:\n%s", out)
	}
	pod := waitDraindRolledOut(ctx, t, n)

	// Exactly the shipped securityContext (pod and container).
	objs, err := deploycheck.Render(filepath.Join(root, "deploy", "daemonset"))
	if err != nil {
		t.Fatal(err)
	}
	u := deploycheck.Find(objs, appsv1.SchemeGroupVersion.WithKind("DaemonSet").GroupKind(), "draind")
	if u == nil {
		t.Fatal("the base renders no DaemonSet draind")
	}
	var ds appsv1.DaemonSet
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ds); err != nil {
		t.Fatal(err)
	}
	want, got := ds.Spec.Template.Spec.Containers[0], pod.Spec.Containers[0]
	if !reflect.DeepEqual(want.SecurityContext, got.SecurityContext) {
		t.Errorf("draind's container securityContext differs from the base:\n got %s\nwant %s", js(got.SecurityContext), js(want.SecurityContext))
	}
	if !reflect.DeepEqual(ds.Spec.Template.Spec.SecurityContext, pod.Spec.SecurityContext) {
		t.Errorf("draind's pod securityContext differs from the base:\n got %s\nwant %s", js(pod.Spec.SecurityContext), js(ds.Spec.Template.Spec.SecurityContext))
	}
	if got.Image != image.DraindRepository+":"+overlayTag {
		t.Errorf("draind runs image %s, want the overlay's %s:%s", got.Image, image.DraindRepository, overlayTag)
	}

	// The kernel's view: draind's programs on the kubelet's kubepods cgroup.
	kubepods := kubepodsCgroup(t)
	attached := attachedPrograms(t, kubepods)
	for _, name := range []string{"draind_connect4", "draind_connect6", "draind_sendmsg4", "draind_sendmsg6",
		"draind_recvmsg4", "draind_recvmsg6", "draind_observe"} {
		if _, ok := attached[name]; !ok {
			t.Errorf("program %s is not attached to %s (attached: %v)", name, kubepods, attached)
		}
	}
	logs, err := n.Kubectl(ctx, "-n", "draind-system", "logs", "ds/draind")
	if err != nil {
		t.Fatalf("kubectl logs: %v", err)
	}
	if !strings.Contains(string(logs), `"cgroup":"/sys/fs/cgroup/unified/kubepods"`) {
		t.Errorf("draind's log does not say it attached to /sys/fs/cgroup/unified/kubepods:\n%s", logs)
	}
	if strings.Contains(string(logs), "conntrack unavailable") {
		t.Errorf("draind runs without conntrack:\n%s", logs)
	}
	status, err := n.Kubectl(ctx, "-n", "draind-system", "exec", "ds/draind", "--", "draind", "status")
	t.Logf("kubectl -n draind-system exec ds/draind -- draind status:\n%s", status)
	if err != nil {
		t.Fatalf("draind status failed (unhealthy exits non-zero): %v", err)
	}
	st := draindStatus(ctx, t, n)
	if !st.Healthy {
		t.Errorf("draind status: unhealthy: %v", st.Problems)
	}
	var wantProgs []string
	for _, a := range shippedAttachments {
		wantProgs = append(wantProgs, a.name)
	}
	sort.Strings(st.Attached)
	sort.Strings(wantProgs)
	if !slices.Equal(st.Attached, wantProgs) {
		t.Errorf("draind status lists attached programs %v, want %v", st.Attached, wantProgs)
	}
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func tailLog(t *testing.T, path string, lines int) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Logf("reading %s: %v", path, err)
		return
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	t.Logf("--- last lines of %s:\n%s", path, strings.Join(ls, "\n"))
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// The DaemonSet controller labels each pod with the template generation
// the API server keeps in the DaemonSet's annotation.
const (
	dsTemplateGeneration  = "deprecated.daemonset.template.generation"
	podTemplateGeneration = "pod-template-generation"
)

// waitDraindRolledOut waits until the DaemonSet's rollout is done and its
// one pod of the current template is Ready as the API server shows it.
// `kubectl rollout status` alone is not enough: it trusts the DaemonSet's
// status, which can say "rolled out" before the pod's Ready condition
// reaches the API server (seen here: rollout status returned while the pod
// was still 0/1, its first readiness probe a second later).
func waitDraindRolledOut(ctx context.Context, t *testing.T, n *realnode.Node) *corev1.Pod {
	t.Helper()
	if out, err := n.Kubectl(ctx, "-n", "draind-system", "rollout", "status", "ds/draind", "--timeout=3m"); err != nil {
		t.Fatalf("waiting for the DaemonSet: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last string
	for {
		ds, err := n.Cluster.Admin.AppsV1().DaemonSets("draind-system").Get(ctx, "draind", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the DaemonSet: %v", err)
		}
		pods, err := n.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=draind"})
		if err != nil {
			t.Fatalf("listing draind's pods: %v", err)
		}
		var current []corev1.Pod
		last = ""
		for _, p := range pods.Items {
			last += fmt.Sprintf(" %s(phase %s, ready %v, deleting %v, template generation %s)", p.Name, p.Status.Phase, podReady(&p), p.DeletionTimestamp != nil, p.Labels[podTemplateGeneration])
			if p.DeletionTimestamp == nil && p.Labels[podTemplateGeneration] == ds.Annotations[dsTemplateGeneration] {
				current = append(current, p)
			}
		}
		if len(current) == 1 && current[0].Status.Phase == corev1.PodRunning && podReady(&current[0]) {
			return &current[0]
		}
		select {
		case <-ctx.Done():
			t.Fatalf("draind's DaemonSet rolled out (template generation %s) but no single pod of it is Ready:%s", ds.Annotations[dsTemplateGeneration], last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func draindPod(ctx context.Context, t *testing.T, n *realnode.Node) *corev1.Pod {
	t.Helper()
	pods, err := n.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=draind"})
	if err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	if len(live) != 1 {
		t.Fatalf("want one draind pod, found %d", len(live))
	}
	return &live[0]
}

// draindStatus runs `draind status -o json` in the DaemonSet's pod.
func draindStatus(ctx context.Context, t *testing.T, n *realnode.Node) daemon.Status {
	t.Helper()
	st, err := draindStatusErr(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func draindStatusErr(ctx context.Context, n *realnode.Node) (daemon.Status, error) {
	var st daemon.Status
	out, err := n.Kubectl(ctx, "-n", "draind-system", "exec", "ds/draind", "--", "draind", "status", "-o", "json")
	if len(out) == 0 && err != nil {
		return st, fmt.Errorf("draind status -o json: %w", err)
	}
	if jerr := json.Unmarshal(out, &st); jerr != nil {
		return st, fmt.Errorf("decoding draind status (%v): %w: %s", err, jerr, out)
	}
	return st, nil
}

// kubepodsCgroup is the kubelet's pods cgroup on the cgroup2 hierarchy.
func kubepodsCgroup(t *testing.T) string {
	t.Helper()
	p := "/sys/fs/cgroup/unified/kubepods"
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		p = "/sys/fs/cgroup/kubepods"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the kubelet's pods cgroup: %v", err)
	}
	return p
}

// attachedPrograms asks the kernel which programs are attached to cgroup
// at draind's hooks: program name → id.
func attachedPrograms(t *testing.T, cgroup string) map[string]ebpf.ProgramID {
	t.Helper()
	f, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]ebpf.ProgramID{}
	for _, a := range shippedAttachments {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: a.typ})
		if err != nil {
			t.Fatalf("querying %s programs on %s: %v", a.typ, cgroup, err)
		}
		for _, p := range res.Programs {
			prog, err := ebpf.NewProgramFromID(p.ID)
			if err != nil {
				t.Fatalf("opening program %d: %v", p.ID, err)
			}
			info, err := prog.Info()
			prog.Close()
			if err != nil {
				t.Fatal(err)
			}
			out[info.Name] = p.ID
		}
	}
	return out
}

// loadedPrograms returns those of ids the kernel still has loaded. Other
// tests on this machine may load draind's programs too (in their own
// cgroups): only the ids this node's draind attached count.
func loadedPrograms(ids map[string]ebpf.ProgramID) []string {
	var out []string
	for name, id := range ids {
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone
		}
		prog.Close()
		out = append(out, fmt.Sprintf("%s (id %d)", name, id))
	}
	sort.Strings(out)
	return out
}

// checkHostClean asserts that Stop left nothing of the node on the host.
func checkHostClean(t *testing.T, n *realnode.Node) {
	for _, p := range []string{n.Dir, n.NetnsPath, "/sys/fs/cgroup/unified/kubepods", "/sys/fs/cgroup/memory/kubepods", "/sys/fs/cgroup/cpu/kubepods", "/sys/fs/bpf/draind"} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("after Stop, %s still exists", p)
		}
	}
}

// runHost runs a command on the host (as an operator on the node would).
func runHost(ctx context.Context, bin string, args ...string) ([]byte, error) {
	return exec.CommandContext(ctx, bin, args...).CombinedOutput()
}

// shippedAttachments are the programs the shipped DaemonSet attaches,
// with the names draind status gives them and their cgroup attach points:
// draind run's defaults (--socket-hooks is on unless the manifest turns it
// off, adding sockops and egress).
var shippedAttachments = []struct {
	name string
	typ  ebpf.AttachType
}{
	{"connect4", ebpf.AttachCGroupInet4Connect},
	{"connect6", ebpf.AttachCGroupInet6Connect},
	{"sendmsg4", ebpf.AttachCGroupUDP4Sendmsg},
	{"sendmsg6", ebpf.AttachCGroupUDP6Sendmsg},
	{"recvmsg4", ebpf.AttachCGroupUDP4Recvmsg},
	{"recvmsg6", ebpf.AttachCGroupUDP6Recvmsg},
	{"observe_ingress", ebpf.AttachCGroupInetIngress},
	{"sockops", ebpf.AttachCGroupSockOps},
	{"egress", ebpf.AttachCGroupInetEgress},
}

// startNode stops the shared multi-node bed, starts one real node for the
// test and stops it when the test ends, with the kubelet's and
// containerd's logs and the pods shown if the test failed.
func startNode(ctx context.Context, t *testing.T, bins *kubebin.Set) *realnode.Node {
	t.Helper()
	if err := stopMultiBed(); err != nil {
		t.Errorf("stopping the multi-node bed: %v", err)
	}
	start := time.Now()
	n, err := realnode.Start(ctx, realnode.Config{Binaries: bins, Log: kube.TestLogger(t)})
	if err != nil {
		t.Fatalf("starting the real node: %v", err)
	}
	t.Logf("real node %s up in %v (node IP %s, files in %s)", n.Name, time.Since(start).Round(time.Millisecond), n.NodeIP, n.Dir)
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range []string{"kubelet", "containerd"} {
				tailLog(t, n.LogPath(c), 60)
			}
			if out, err := n.Kubectl(context.Background(), "get", "pods", "-A", "-o", "wide"); err == nil {
				t.Logf("pods:\n%s", out)
			}
		}
		if err := n.Stop(); err != nil {
			t.Errorf("stopping the real node: %v", err)
		}
		checkHostClean(t, n)
	})
	return n
}
