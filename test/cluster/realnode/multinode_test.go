package realnode_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/realnode"
)

// The multi-node tests share one bed (3 nodes: servers on the first two,
// clients on the third), started by the first of them and stopped by
// TestMain or by the next single-node test (one real-node bed per host).
var shared struct {
	mu  sync.Mutex
	bed *multiBed
	err error
}

// multiBed is the shared multi-node bed with draind's image on every node.
type multiBed struct {
	m         *realnode.Multi
	servers   []string // nodes the applications' pods may run on
	client    string   // the node the clients run on
	recipe    []byte   // the README's curl-less preStop recipe
	overlay   string
	installed bool
	crds      bool          // the monitoring CRDs (an uninstall keeps them)
	started   time.Duration // StartMulti → ready, images imported
}

func TestMain(m *testing.M) {
	code := m.Run()
	stopMultiBed()
	os.Exit(code)
}

// stopMultiBed stops the shared multi-node bed if one runs.
func stopMultiBed() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.bed == nil {
		return nil
	}
	err := shared.bed.m.Stop()
	shared.bed, shared.err = nil, nil
	return err
}

// sharedMultiBed returns the shared bed, starting it on first use.
func sharedMultiBed(t *testing.T) *multiBed {
	t.Helper()
	requireRealNode(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.bed != nil || shared.err != nil {
		if shared.err != nil {
			t.Fatalf("the shared multi-node bed failed to start earlier: %v", shared.err)
		}
		return shared.bed
	}
	b, err := startMultiBed(t)
	if err != nil {
		// Once, a kubelet exited while the bed started on a loaded
		// machine, after the single-node tests' beds; its log went with
		// the bed. The error carries the log's end now: show it, and try
		// once more.
		t.Logf("starting the multi-node bed failed, trying once more: %v", err)
		b, err = startMultiBed(t)
	}
	if err != nil {
		shared.err = err
		t.Fatalf("starting the multi-node bed: %v", err)
	}
	shared.bed = b
	return b
}

func startMultiBed(t *testing.T) (*multiBed, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bins := kube.Binaries(t)
	start := time.Now()
	// The bed outlives this test: its log goes to standard error.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := realnode.StartMulti(ctx, realnode.MultiConfig{Nodes: 3, ProxyMode: realnode.ProxyIPTables, Binaries: bins, Log: log})
	if err != nil {
		return nil, err
	}
	b := &multiBed{m: m, client: m.Nodes[2].Name}
	for _, n := range m.Nodes[:2] {
		b.servers = append(b.servers, n.Name)
	}
	fail := func(err error) (*multiBed, error) { return nil, errors.Join(err, m.Stop()) }
	t.Logf("multi-node figures: %d nodes up in %v (control plane, kubelets Ready, kube-proxy %s synced, test images imported)",
		len(m.Nodes), time.Since(start).Round(time.Millisecond), m.ProxyMode())
	root, err := draindbin.RepoRoot()
	if err != nil {
		return fail(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		return fail(err)
	}
	if b.recipe, err = realnode.READMEBlock(readme, recipeMarker); err != nil {
		return fail(err)
	}
	spec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		return fail(err)
	}
	refs := []string{image.DraindRepository + ":" + overlayTag}
	if r := spec.InitContainers[0].Image; r != refs[0] {
		refs = append(refs, r)
	}
	img, err := realnode.BuildDraindImage(ctx, filepath.Join(m.Dir, "draind-image"), overlayTag, refs...)
	if err != nil {
		return fail(err)
	}
	for _, n := range m.Nodes {
		if err := n.ImportImages(ctx, img.Archive); err != nil {
			return fail(err)
		}
	}
	if b.overlay, err = writeMultiOverlay(root, m.Dir); err != nil {
		return fail(err)
	}
	b.started = time.Since(start)
	t.Logf("multi-node figures: bed ready with draind's image on every node in %v", b.started.Round(time.Millisecond))
	return b, nil
}

// writeMultiOverlay writes the overlay for nodes that share one host: the
// shipped base with the image tag changed and, per node, its own pin
// directory and kubepods cgroup (the kubelets' cgroup roots are
// /<node name>). On a cluster of real machines neither is needed. A JSON
// patch keeps the order of the environment: $(DRAIND_NODE_NAME) expands
// only in variables listed after it.
func writeMultiOverlay(root, dir string) (string, error) {
	dir = filepath.Join(dir, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	base, err := filepath.Rel(dir, filepath.Join(root, "deploy", "daemonset"))
	if err != nil {
		return "", err
	}
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
images:
- name: %s
  newTag: %s
patches:
- target:
    kind: DaemonSet
    name: draind
  patch: |-
    - op: test
      path: /spec/template/spec/containers/0/env/0/name
      value: DRAIND_NODE_NAME
    - op: test
      path: /spec/template/spec/containers/0/env/2/name
      value: DRAIND_BPFFS_DIR
    - op: replace
      path: /spec/template/spec/containers/0/env/2/value
      value: /host%s
    - op: add
      path: /spec/template/spec/containers/0/env/-
      value:
        name: DRAIND_CGROUP_PATH
        value: /sys/fs/cgroup/unified/$(DRAIND_NODE_NAME)/kubepods
`, base, image.DraindRepository, overlayTag, realnode.PinDir("$(DRAIND_NODE_NAME)"))
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644)
}

// install applies the overlay and waits until draind runs Ready on every
// node, attached to that node's kubepods cgroup.
func (b *multiBed) install(ctx context.Context, t *testing.T) {
	t.Helper()
	if b.installed {
		return
	}
	n := b.m.Nodes[0]
	if !b.crds {
		if err := deploycheck.InstallMonitoringCRDs(ctx, b.m.Cluster.AdminConfig); err != nil {
			t.Fatal(err)
		}
		b.crds = true
	}
	kubectl(ctx, t, n, "apply", "-k", b.overlay)
	b.waitDraindReady(ctx, t)
	for _, node := range b.m.Nodes {
		p := b.draindPodOn(ctx, t, node.Name)
		logs := kubectl(ctx, t, n, "-n", "draind-system", "logs", p.Name)
		want := fmt.Sprintf(`"cgroup":"/sys/fs/cgroup/unified/%s/kubepods"`, node.Name)
		if !strings.Contains(string(logs), want) {
			t.Errorf("draind on %s did not attach to its node's kubepods (%s):\n%s", node.Name, want, logs)
		}
	}
	b.installed = true
}

// waitDraindReady waits until every node runs a Ready draind pod of the
// DaemonSet's current template.
func (b *multiBed) waitDraindReady(ctx context.Context, t *testing.T) {
	t.Helper()
	kubectl(ctx, t, b.m.Nodes[0], "-n", "draind-system", "rollout", "status", "ds/draind", "--timeout=3m")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		pods, err := b.m.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=draind"})
		if err != nil {
			t.Fatal(err)
		}
		ready := map[string]bool{}
		for i := range pods.Items {
			p := &pods.Items[i]
			if p.DeletionTimestamp == nil && podReady(p) {
				ready[p.Spec.NodeName] = true
			}
		}
		if len(ready) == len(b.m.Nodes) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("draind Ready on %d of %d nodes after 2 minutes", len(ready), len(b.m.Nodes))
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (b *multiBed) draindPodOn(ctx context.Context, t *testing.T, node string) *corev1.Pod {
	t.Helper()
	pods, err := b.m.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=draind", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil {
			return &pods.Items[i]
		}
	}
	t.Fatalf("no draind pod on %s", node)
	return nil
}

func (b *multiBed) uninstall(ctx context.Context, t *testing.T) {
	t.Helper()
	if !b.installed {
		return
	}
	kubectl(ctx, t, b.m.Nodes[0], "delete", "-k", b.overlay, "--timeout=3m")
	b.installed = false
}

// onServers pins an application's pods to the server nodes.
func (b *multiBed) onServers(spec corev1.PodSpec) corev1.PodSpec {
	spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: b.servers}},
		}}},
	}}
	return spec
}

// checkPlacement fails unless no old pod ran on the client node.
func (b *multiBed) checkPlacement(t *testing.T, pods []corev1.Pod) {
	t.Helper()
	for _, p := range pods {
		if !slices.Contains(b.servers, p.Spec.NodeName) {
			t.Errorf("server pod %s ran on %s, not on a server node %v", p.Name, p.Spec.NodeName, b.servers)
		}
	}
}

// lastAccepted returns, per client kind, the latest time after an old
// pod's deletion at which a connection from that client reached the old
// pod (conntrack of the client's node: flows the pod accepted), over all
// old pods (flows rec recorded during the rollout and holds now); and
// whether any did at all after its deletion.
func (b *multiBed) lastAccepted(ctx context.Context, t *testing.T, res *rolloutResult, rec *flowRecorder) map[string]time.Duration {
	t.Helper()
	if err := rec.read(ctx, b.m.Node(b.client), res.oldPods); err != nil {
		t.Fatalf("listing conntrack flows on %s: %v", b.client, err)
	}
	kindOf := map[netip.Addr]string{}
	for kind, ip := range res.clientIPs {
		kindOf[netip.MustParseAddr(ip)] = kind
	}
	out := map[string]time.Duration{}
	for _, p := range res.oldPods {
		del, ok := res.deleted[p.Name]
		if !ok {
			t.Errorf("no deletion seen for old pod %s", p.Name)
			continue
		}
		for _, f := range rec.of(p.Status.PodIP) {
			kind, ok := kindOf[f.Orig.Src.Addr()]
			if !ok || f.Start.IsZero() || !f.Start.After(del) {
				continue
			}
			out[kind] = max(out[kind], f.Start.Sub(del))
		}
	}
	return out
}

// multiRow is one line of the multi-node tables.
type multiRow struct {
	mode, variant string
	http          *rolloutResult
	last          map[string]time.Duration
	dns           *dnsRollout
}

// TestMultiNode runs the rollouts with the clients on a node that hosts
// none of the servers, with kube-proxy in iptables and in nftables mode,
// without draind and with the shipped DaemonSet and the README's preStop:
// the HTTP rollout (ClusterIP, stale pod-IP and keep-alive clients) and
// the DNS rollout (Go resolver and sendto clients). With draind no request
// or lookup may fail in either mode. DRAIND_MULTINODE_MODES (a comma-
// separated list; both by default) limits the modes run.
func TestMultiNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	start := time.Now()
	b := sharedMultiBed(t)
	offlineSpec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	dnsOffline, err := realnode.MergeRecipe(realnode.DNSPodSpec(), b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	var rows []*multiRow
	t.Cleanup(func() { printMultiTables(t, rows) })
	must := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	// One install: both modes without draind, then both with it.
	b.uninstall(ctx, t)
	plan := []struct {
		mode   string
		draind bool
	}{
		{realnode.ProxyIPTables, false}, {realnode.ProxyNFTables, false},
		{realnode.ProxyNFTables, true}, {realnode.ProxyIPTables, true},
	}
	modes := strings.Split(os.Getenv("DRAIND_MULTINODE_MODES"), ",")
	for _, m := range modes {
		if m != "" && m != realnode.ProxyIPTables && m != realnode.ProxyNFTables {
			t.Fatalf("DRAIND_MULTINODE_MODES=%q: %q is not a kube-proxy mode this bed runs (%s, %s)",
				os.Getenv("DRAIND_MULTINODE_MODES"), m, realnode.ProxyIPTables, realnode.ProxyNFTables)
		}
	}
	for _, step := range plan {
		if modes[0] != "" && !slices.Contains(modes, step.mode) {
			continue
		}
		variant := "without-draind"
		http, dns := realnode.SleepPodSpec(5), realnode.DNSSleepPodSpec(dnsSleepSeconds)
		if step.draind {
			variant, http, dns = "with-draind", offlineSpec, dnsOffline
		}
		must(step.mode+"/"+variant, func(t *testing.T) {
			modeStart := time.Now()
			if err := b.m.SetProxyMode(ctx, step.mode); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(modeStart); d > time.Second {
				t.Logf("multi-node figures: kube-proxy switched to %s on every node in %v", step.mode, d.Round(time.Millisecond))
			}
			if step.draind {
				b.install(ctx, t)
			}
			rows = append(rows, b.runBoth(ctx, t, step.mode, variant, b.onServers(http), b.onServers(dns), step.draind))
		})
	}
	t.Logf("multi-node figures: TestMultiNode wall time (bed shared; its start %v counted here if this test started it): %v",
		b.started.Round(time.Second), time.Since(start).Round(time.Second))
}

// runBoth runs the HTTP and the DNS rollout of one variant in one mode,
// each in a namespace of its own that is deleted afterwards (without
// waiting: its pods are gone within seconds, long before the next
// rollout's clients have warmed up and its restart begins).
func (b *multiBed) runBoth(ctx context.Context, t *testing.T, mode, variant string, http, dns corev1.PodSpec, draind bool) *multiRow {
	n := b.m.Nodes[0]
	row := &multiRow{mode: mode, variant: variant}
	ns := fmt.Sprintf("http-%s-%s", mode, variant)
	rec := &flowRecorder{}
	row.http = runRolloutOn(ctx, t, n, ns, http, b.client, b.recording(rec, nil))
	b.checkPlacement(t, row.http.oldPods)
	row.last = b.lastAccepted(ctx, t, row.http, rec)
	for _, kind := range clientKinds {
		st := row.http.clients[kind]
		if draind && st.Failed() != 0 {
			t.Errorf("%s with draind: the %s client saw %d failed requests (%s): %v", mode, kind, st.Failed(), st.FailKinds(), st.Errors)
		}
	}
	if !draind && row.http.clients[realnode.ClientStale].Failed() == 0 {
		t.Errorf("%s without draind: the stale pod-IP client saw no failure: the scenario tests nothing", mode)
	}
	kubectl(ctx, t, n, "delete", "namespace", ns, "--wait=false")

	ns = fmt.Sprintf("dns-%s-%s", mode, variant)
	row.dns = runDNSRollout(ctx, t, n, dnsVariant{namespace: ns, spec: dns, clientNode: b.client})
	b.checkPlacement(t, row.dns.oldPods)
	for _, kind := range dnsClientKinds {
		f := failures(row.dns.lookups[kind])
		if draind && len(f) > 0 {
			t.Errorf("%s with draind: the %s DNS client had %d failed lookups (%s): %v", mode, kind, len(f), failKinds(f), row.dns.errors[kind])
		}
	}
	kubectl(ctx, t, n, "delete", "namespace", ns, "--wait=false")
	return row
}

func printMultiTables(t *testing.T, rows []*multiRow) {
	var h strings.Builder
	fmt.Fprintf(&h, "\n| mode | variant | rollout | %s failed | %s failed | %s failed | requests ok | delete→last accepted connection (%s / %s / %s) |\n",
		clientKinds[0], clientKinds[1], clientKinds[2], clientKinds[0], clientKinds[1], clientKinds[2])
	h.WriteString("|---|---|---|---|---|---|---|---|\n")
	var d strings.Builder
	fmt.Fprintf(&d, "\n| mode | variant | rollout | %s failed | %s failed | lookups | delete→last answer (%s / %s) |\n",
		dnsClientKinds[0], dnsClientKinds[1], dnsClientKinds[0], dnsClientKinds[1])
	d.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.http != nil {
			ok := 0
			var cells, lasts []string
			for _, k := range clientKinds {
				st := r.http.clients[k]
				ok += st.OK
				cells = append(cells, fmt.Sprintf("%d (%s)", st.Failed(), st.FailKinds()))
				if l, seen := r.last[k]; seen {
					lasts = append(lasts, l.Round(time.Millisecond).String())
				} else {
					lasts = append(lasts, "none")
				}
			}
			fmt.Fprintf(&h, "| %s | %s | %v | %s | %d | %s |\n", r.mode, r.variant, r.http.took.Round(100*time.Millisecond),
				strings.Join(cells, " | "), ok, strings.Join(lasts, " / "))
		}
		if r.dns != nil {
			total := 0
			var cells, stops []string
			for _, k := range dnsClientKinds {
				ls := r.dns.lookups[k]
				total += len(ls)
				f := failures(ls)
				cells = append(cells, fmt.Sprintf("%d (%s)", len(f), failKinds(f)))
				s, _ := stopTimes(r.dns, k)
				stops = append(stops, durRange(s))
			}
			fmt.Fprintf(&d, "| %s | %s | %v | %s | %d | %s |\n", r.mode, r.variant, r.dns.took.Round(100*time.Millisecond),
				strings.Join(cells, " | "), total, strings.Join(stops, " / "))
		}
	}
	t.Logf("multi-node figures: HTTP rollout, servers on 2 nodes, clients on a third (3 replicas, kubectl rollout restart, a request every 20 ms):%s", h.String())
	t.Logf("multi-node figures: DNS rollout, servers on 2 nodes, clients on a third (3 replicas, 50 lookups/s per client):%s", d.String())
}
