package realnode_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/test/cluster/deploycheck"
	"github.com/draind/draind/test/cluster/realnode"
)

const appName = "web"

var clientKinds = []string{realnode.ClientClusterIP, realnode.ClientStale, realnode.ClientKeepAlive}

// rolloutResult is one `kubectl rollout restart` of the application.
type rolloutResult struct {
	namespace string
	clients   map[string]realnode.ClientStats // during the rollout and its tail
	took      time.Duration                   // restart → last old pod gone
	// terminations: each old pod's deletion → removal, as the kubelet
	// logged them (SyncLoop DELETE → SyncLoop REMOVE).
	terminations []time.Duration
	oldPods      []corev1.Pod
	newPods      []string
	deleted      map[string]time.Time // old pod → its deletion, as a watch saw it
	clientIPs    map[string]string    // client kind → pod IP
}

// runRollout deploys the application (3 replicas of spec behind a
// ClusterIP Service) in namespace, starts the three clients, runs
// `kubectl rollout restart`, waits for the last old pod to be gone, keeps
// the clients running 5 s longer (the stale client keeps dialing its old
// pod's IP) and returns what the clients saw from the restart on. during,
// if set, runs from the restart until the rollout is over.
func runRollout(ctx context.Context, t *testing.T, n *realnode.Node, namespace string, spec corev1.PodSpec, during func(ctx context.Context, t *testing.T, res *rolloutResult)) *rolloutResult {
	t.Helper()
	return runRolloutOn(ctx, t, n, namespace, spec, "", during)
}

// deploy creates namespace (a namespace the caller created, with labels,
// is used as it is), waits for its default ServiceAccount, creates svc and
// dep, waits for the rollout and returns the Service as created.
func deploy(ctx context.Context, t *testing.T, n *realnode.Node, namespace string, dep *appsv1.Deployment, svc *corev1.Service) *corev1.Service {
	t.Helper()
	cs := n.Cluster.Admin
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := n.Cluster.WaitServiceAccount(ctx, namespace, "default"); err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.AppsV1().Deployments(namespace).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubectl(ctx, t, n, "-n", namespace, "rollout", "status", "deploy/"+dep.Name, "--timeout=3m")
	return svc
}

// runRolloutOn is runRollout with the clients on the node named clientNode
// ("" lets the scheduler choose).
func runRolloutOn(ctx context.Context, t *testing.T, n *realnode.Node, namespace string, spec corev1.PodSpec, clientNode string, during func(ctx context.Context, t *testing.T, res *rolloutResult)) *rolloutResult {
	t.Helper()
	cs := n.Cluster.Admin
	dep, svc := realnode.AppObjects(namespace, appName, 3, spec)
	svc = deploy(ctx, t, n, namespace, dep, svc)
	res := &rolloutResult{namespace: namespace, clients: map[string]realnode.ClientStats{}}
	res.oldPods = appPods(ctx, t, n, namespace)
	if len(res.oldPods) != 3 {
		t.Fatalf("want 3 pods before the rollout, have %d", len(res.oldPods))
	}
	vip := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(realnode.ServicePort))
	stale := net.JoinHostPort(res.oldPods[0].Status.PodIP, fmt.Sprint(realnode.AppPort))
	targets := map[string]string{realnode.ClientClusterIP: vip, realnode.ClientStale: stale, realnode.ClientKeepAlive: vip}
	for _, kind := range clientKinds {
		cp := realnode.ClientPod(namespace, kind, targets[kind])
		cp.Spec.NodeName = clientNode
		if _, err := cs.CoreV1().Pods(namespace).Create(ctx, cp, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubectl(ctx, t, n, "-n", namespace, "wait", "pod", "-l", "role=client", "--for=condition=Ready", "--timeout=2m")
	clientIP := map[string]string{}
	for _, kind := range clientKinds {
		p, err := cs.CoreV1().Pods(namespace).Get(ctx, "client-"+kind, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clientIP[kind] = p.Status.PodIP
	}
	readAll := func() map[string]realnode.ClientStats {
		out := map[string]realnode.ClientStats{}
		for _, kind := range clientKinds {
			st, err := n.ReadClientStats(ctx, clientIP[kind])
			if err != nil {
				t.Fatal(err)
			}
			out[kind] = st
		}
		return out
	}
	// Warm: every client has been answered 10 times since its last failure.
	// A client may start before kube-proxy has the new Service's rules
	// (refused): those failures precede the scenario; every failure after
	// the warm-up counts.
	deadline := time.Now().Add(time.Minute)
	var before map[string]realnode.ClientStats
	okSinceFail := map[string]int{} // OK count at the last failure seen
	failed := map[string]int{}
	for {
		before = readAll()
		ok := true
		for kind, st := range before {
			if st.Failed() != failed[kind] {
				failed[kind], okSinceFail[kind] = st.Failed(), st.OK
			}
			ok = ok && st.OK-okSinceFail[kind] >= 10
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("clients not answered 10 times in a row within a minute: %+v", before)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for kind, st := range before {
		if st.Failed() != 0 {
			t.Logf("the %s client failed during its warm-up (before the Service answered steadily): %s", kind, st.FailKinds())
		}
	}

	deletions := watchDeletions(ctx, t, n, namespace, appName)
	start := time.Now()
	kubectl(ctx, t, n, "-n", namespace, "rollout", "restart", "deploy/"+appName)
	dctx, stopDuring := context.WithCancel(ctx)
	var wg sync.WaitGroup
	if during != nil {
		wg.Add(1)
		go func() { defer wg.Done(); during(dctx, t, res) }()
	}
	waitRolledOut(ctx, t, n, namespace, appName, 4*time.Minute)
	old := map[string]bool{}
	for _, p := range res.oldPods {
		old[p.Name] = true
	}
	for {
		left := 0
		res.newPods = nil
		for _, p := range appPods(ctx, t, n, namespace) {
			if old[p.Name] {
				left++
			} else {
				res.newPods = append(res.newPods, p.Name)
			}
		}
		if left == 0 {
			break
		}
		if time.Since(start) > 4*time.Minute {
			t.Fatalf("old pods still there 4 minutes after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.took = time.Since(start)
	res.deleted = deletions()
	res.clientIPs = clientIP
	time.Sleep(5 * time.Second)
	for _, p := range res.oldPods {
		var del, rem time.Time
		kl, err := n.On(p.Spec.NodeName).KubeletLog(namespace + "/" + p.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range kl {
			switch {
			case e.Msg == "SyncLoop DELETE" && del.IsZero():
				del = e.Time
			case e.Msg == "SyncLoop REMOVE" && rem.IsZero():
				rem = e.Time
			}
		}
		if del.IsZero() || rem.IsZero() {
			t.Errorf("the kubelet's log lacks the deletion or removal of %s", p.Name)
			continue
		}
		res.terminations = append(res.terminations, rem.Sub(del))
	}
	slices.Sort(res.terminations)
	stopDuring()
	wg.Wait()
	after := readAll()
	for kind := range after {
		res.clients[kind] = after[kind].Sub(before[kind])
		if res.clients[kind].OK == 0 {
			t.Errorf("the %s client had no answer during the rollout", kind)
		}
	}
	t.Logf("%s: rollout took %v; clients: %s", namespace, res.took.Round(time.Millisecond), summary(res))
	return res
}

// waitRolledOut waits for `kubectl rollout status` to succeed, running it
// again when it fails before the deadline (it exits when its watch breaks,
// as in an apiserver outage).
func waitRolledOut(ctx context.Context, t *testing.T, n *realnode.Node, namespace, name string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		out, err := n.Kubectl(ctx, "-n", namespace, "rollout", "status", "deploy/"+name, fmt.Sprintf("--timeout=%ds", int(time.Until(deadline).Seconds())+1))
		if err == nil {
			return
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("kubectl rollout status deploy/%s: %v\n%s", name, err, out)
		}
		sleepCtx(ctx, time.Second)
	}
}

func summary(res *rolloutResult) string {
	var parts []string
	for _, k := range clientKinds {
		st := res.clients[k]
		parts = append(parts, fmt.Sprintf("%s ok=%d failed=%d (%s)", k, st.OK, st.Failed(), st.FailKinds()))
	}
	return strings.Join(parts, "; ")
}

func kubectl(ctx context.Context, t *testing.T, n *realnode.Node, args ...string) []byte {
	t.Helper()
	out, err := n.Kubectl(ctx, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// appPods lists the application's pods (terminating ones included).
func appPods(ctx context.Context, t *testing.T, n *realnode.Node, namespace string) []corev1.Pod {
	t.Helper()
	pods, err := n.Cluster.Admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + appName})
	for tries := 0; err != nil && tries < 60 && ctx.Err() == nil; tries++ {
		sleepCtx(ctx, time.Second) // an apiserver outage of a fault test
		pods, err = n.Cluster.Admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + appName})
	}
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items
}

func printTable(t *testing.T, results []*rolloutResult) {
	var b strings.Builder
	fmt.Fprintf(&b, "\n| variant | rollout | pod delete→removed (min–max) | %s failed | %s failed | %s failed | requests ok |\n", clientKinds[0], clientKinds[1], clientKinds[2])
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		ok := 0
		var cells []string
		for _, k := range clientKinds {
			st := r.clients[k]
			ok += st.OK
			cells = append(cells, fmt.Sprintf("%d (%s)", st.Failed(), st.FailKinds()))
		}
		term := "-"
		if k := len(r.terminations); k > 0 {
			term = fmt.Sprintf("%v–%v", r.terminations[0].Round(100*time.Millisecond), r.terminations[k-1].Round(100*time.Millisecond))
		}
		fmt.Fprintf(&b, "| %s | %v | %s | %s | %d |\n", r.namespace, r.took.Round(100*time.Millisecond), term, strings.Join(cells, " | "), ok)
	}
	t.Logf("real-node rollout figures (3 replicas, kubectl rollout restart, clients every 20 ms):%s", b.String())
}

// drainObserver watches a draind rollout from the outside: draind's
// metrics on :9461 and `draind status`, sampled while the rollout runs.
type drainObserver struct {
	n         *realnode.Node
	namespace string

	mu       sync.Mutex
	series   map[string]map[string]float64 // pod → series name → max value
	statuses map[string]string             // pod → last state seen in draind status
	text     string                        // one `draind status` listing a draining pod
}

func (o *drainObserver) run(ctx context.Context, t *testing.T, _ *rolloutResult) {
	o.series = map[string]map[string]float64{}
	o.statuses = map[string]string{}
	metricsURL := fmt.Sprintf("http://%s:9461/metrics", o.n.NodeIP)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			body, err := o.n.HTTPGet(ctx, metricsURL)
			if err == nil {
				o.scrape(string(body))
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
	}()
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			st, err := draindStatusErr(ctx, o.n)
			if err == nil {
				draining := false
				o.mu.Lock()
				for _, p := range st.Pods {
					if p.Namespace == o.namespace && p.Local {
						o.statuses[p.Name] = p.State
						draining = draining || p.State == daemon.StateDraining
					}
				}
				needText := o.text == ""
				o.mu.Unlock()
				if draining && needText {
					if out, err := o.n.Kubectl(ctx, "-n", "draind-system", "exec", "ds/draind", "--", "draind", "status"); err == nil && strings.Contains(string(out), o.namespace+"/") {
						o.mu.Lock()
						o.text = string(out)
						o.mu.Unlock()
					}
				}
			}
			sleepCtx(ctx, 500*time.Millisecond)
		}
	}()
	wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// scrape records draind's per-pod series of the observed namespace.
func (o *drainObserver) scrape(body string) {
	mfs, _, err := deploycheck.ParseExposition(strings.NewReader(body))
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "draind_draining_pod_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ns, pod string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					ns = l.GetValue()
				case "pod":
					pod = l.GetValue()
				}
			}
			if ns != o.namespace {
				continue
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			if o.series[pod] == nil {
				o.series[pod] = map[string]float64{}
			}
			o.series[pod][name] = max(o.series[pod][name], v)
		}
	}
}

// check asserts what the observer and the API saw: every old pod drained
// (DrainStarted and Drained Events, per-pod series on :9461, listed by
// draind status), and prints one pod's timeline.
func (o *drainObserver) check(ctx context.Context, t *testing.T, res *rolloutResult) {
	o.mu.Lock()
	defer o.mu.Unlock()
	evs, err := o.n.Cluster.Admin.CoreV1().Events(o.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]map[string]corev1.Event{}
	for _, e := range evs.Items {
		if e.Source.Component != "draind" && e.ReportingController != "draind" {
			continue
		}
		if reasons[e.InvolvedObject.Name] == nil {
			reasons[e.InvolvedObject.Name] = map[string]corev1.Event{}
		}
		reasons[e.InvolvedObject.Name][e.Reason] = e
	}
	var rows []string
	for _, p := range res.oldPods {
		for _, r := range []string{hosted.EventDrainStarted, hosted.EventDrained} {
			if _, ok := reasons[p.Name][r]; !ok {
				t.Errorf("pod %s has no %s Event from draind (has %v)", p.Name, r, keys(reasons[p.Name]))
			}
		}
		s := o.series[p.Name]
		if s == nil {
			t.Errorf("no draind_draining_pod_* series for %s scraped from :9461 during the rollout", p.Name)
		}
		if _, ok := o.statuses[p.Name]; !ok {
			t.Errorf("draind status never listed %s while it drained", p.Name)
		}
		rows = append(rows, fmt.Sprintf("| %s | %.0f | %.0f | %.0f | %s |", p.Name,
			s["draind_draining_pod_syns_total"], s["draind_draining_pod_live_connections"], s["draind_draining_pod_steered_total"], o.statuses[p.Name]))
	}
	t.Logf("per-pod drain series scraped from :9461 during the rollout (max values) and the last state draind status showed:\n| pod | syns | live connections | steered | status |\n|---|---|---|---|---|\n%s", strings.Join(rows, "\n"))
	if o.text == "" {
		t.Errorf("no `draind status` output listed a draining pod of %s", o.namespace)
	} else {
		t.Logf("draind status during the rollout:\n%s", o.text)
	}
	timeline(ctx, t, o.n, res.oldPods[0])
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// timeline prints one pod's drain from the components' own clocks: the
// kubelet's log (it sees the deletion, runs the preStop, sees the container
// exit) and draind's log (drain started, drained).
func timeline(ctx context.Context, t *testing.T, n *realnode.Node, pod corev1.Pod) {
	type step struct {
		at   time.Time
		what string
	}
	var steps []step
	kl, err := n.KubeletLog(pod.Namespace + "/" + pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	var appID string
	for _, c := range pod.Status.ContainerStatuses {
		if c.Name == "app" {
			_, appID, _ = strings.Cut(c.ContainerID, "://")
		}
	}
	deleteSeen := false
	for _, e := range kl {
		switch {
		case e.Msg == "SyncLoop DELETE" && !deleteSeen:
			// The first DELETE is the graceful deletion; the kubelet's own
			// final delete (grace 0) after the containers exit follows.
			deleteSeen = true
			steps = append(steps, step{e.Time, "kubelet: deletion seen (SyncLoop DELETE), preStop starts"})
		case e.Msg == "Killing container with a grace period" && strings.Contains(e.Line, `containerName="app"`):
			steps = append(steps, step{e.Time, "kubelet: preStop returned, SIGTERM to container app (Killing container with a grace period)"})
		case strings.Contains(e.Msg, "SyncLoop (PLEG)") && strings.Contains(e.Line, "ContainerDied") && appID != "" && strings.Contains(e.Line, appID):
			steps = append(steps, step{e.Time, "kubelet: container app exited (PLEG ContainerDied)"})
		case e.Msg == "SyncLoop REMOVE":
			steps = append(steps, step{e.Time, "kubelet: pod removed (SyncLoop REMOVE)"})
		}
	}
	logs, err := n.Kubectl(ctx, "-n", "draind-system", "logs", "ds/draind", "--all-containers", "--prefix=false")
	if err == nil {
		for _, rec := range draindRecords(logs) {
			if rec.Pod != pod.Namespace+"/"+pod.Name {
				continue
			}
			switch rec.Msg {
			case "drain started":
				steps = append(steps, step{rec.Time, "draind: drain started (" + rec.Reason + "), DrainStarted Event"})
			case "pod drained":
				steps = append(steps, step{rec.Time, fmt.Sprintf("draind: drained after %.2fs, Drained Event", rec.Seconds)})
			}
		}
	}
	sort.SliceStable(steps, func(i, j int) bool { return steps[i].at.Before(steps[j].at) })
	if len(steps) == 0 {
		t.Errorf("no timeline for %s", pod.Name)
		return
	}
	var b strings.Builder
	t0 := steps[0].at
	for _, s := range steps {
		fmt.Fprintf(&b, "| %s | +%6dms | %s |\n", s.at.UTC().Format("15:04:05.000000"), s.at.Sub(t0).Milliseconds(), s.what)
	}
	t.Logf("timeline of %s (kubelet and draind timestamps):\n| time (UTC) | since delete | event |\n|---|---|---|\n%s", pod.Name, b.String())
	// Order: the deletion (the kubelet and draind both watch for it, so
	// either may log it first) → drained → SIGTERM → container exit.
	at := map[string]time.Time{}
	for _, s := range steps {
		for _, p := range []string{"kubelet: deletion seen", "draind: drain started", "draind: drained", "kubelet: preStop returned", "kubelet: container app exited"} {
			if strings.HasPrefix(s.what, p) && at[p].IsZero() {
				at[p] = s.at
			}
		}
	}
	for _, pair := range [][2]string{
		{"kubelet: deletion seen", "draind: drained"}, {"draind: drain started", "draind: drained"},
		{"draind: drained", "kubelet: preStop returned"}, {"kubelet: preStop returned", "kubelet: container app exited"},
	} {
		a, b := at[pair[0]], at[pair[1]]
		if a.IsZero() || b.IsZero() || b.Before(a) {
			t.Errorf("timeline of %s: want %q (%v) before %q (%v)", pod.Name, pair[0], a.Format("15:04:05.000000"), pair[1], b.Format("15:04:05.000000"))
		}
	}
}

// upgrade restarts the DaemonSet in the middle of an application rollout:
// no client may see a failure.
func upgrade(ctx context.Context, t *testing.T, n *realnode.Node, spec corev1.PodSpec) *rolloutResult {
	before := draindPod(ctx, t, n)
	restarted := make(chan error, 1)
	res := runRollout(ctx, t, n, "upgrade", spec, func(ctx context.Context, t *testing.T, res *rolloutResult) {
		// Wait until the first old pod is being deleted (draining), then
		// restart draind under it.
		for ctx.Err() == nil {
			p, err := n.Cluster.Admin.CoreV1().Pods("upgrade").Get(ctx, res.oldPods[0].Name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				break
			}
			for _, q := range res.oldPods[1:] {
				if qq, err := n.Cluster.Admin.CoreV1().Pods("upgrade").Get(ctx, q.Name, metav1.GetOptions{}); err != nil || qq.DeletionTimestamp != nil {
					goto restart
				}
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
	restart:
		began := time.Now()
		out, err := n.Kubectl(ctx, "-n", "draind-system", "rollout", "restart", "ds/draind")
		if err == nil {
			out, err = n.Kubectl(ctx, "-n", "draind-system", "rollout", "status", "ds/draind", "--timeout=2m")
		}
		t.Logf("draind restarted from %s to %s (UTC)", began.UTC().Format("15:04:05.000"), time.Now().UTC().Format("15:04:05.000"))
		if err != nil {
			err = fmt.Errorf("%w: %s", err, out)
		}
		restarted <- err
	})
	if err := <-restarted; err != nil {
		t.Fatalf("restarting draind: %v", err)
	}
	after := waitDraindRolledOut(ctx, t, n)
	if after.UID == before.UID {
		t.Errorf("draind's pod was not replaced (%s)", after.Name)
	}
	t.Logf("draind pod %s replaced by %s during the application rollout", before.Name, after.Name)
	for kind, st := range res.clients {
		if st.Failed() != 0 {
			t.Errorf("during the draind upgrade the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		}
	}
	if t.Failed() {
		for _, p := range res.oldPods {
			t.Logf("old pod %s: %s", p.Name, p.Status.PodIP)
		}
		if logs, err := n.Kubectl(ctx, "-n", "draind-system", "logs", "ds/draind"); err == nil {
			t.Logf("the new draind's log:\n%s", logs)
		}
	}
	return res
}

// uninstall deletes the overlay, then runs the documented `draind bpf
// remove` on the node, and asks the kernel: no draind program attached or
// loaded, no pins.
func uninstall(ctx context.Context, t *testing.T, n *realnode.Node, overlay, binary string) {
	kubectl(ctx, t, n, "delete", "-k", overlay, "--timeout=2m")
	kubepods := kubepodsCgroup(t)
	// What the README says: after delete -k the hooks stay attached (pinned).
	left := attachedPrograms(t, kubepods)
	t.Logf("after kubectl delete -k: programs on %s: %v", kubepods, left)
	if want := len(shippedAttachments); len(left) != want {
		t.Errorf("after kubectl delete -k want draind's %d programs still attached (pinned, as the README says), have %v", want, left)
	}
	out, err := runHost(ctx, binary, "bpf", "remove")
	if err != nil {
		t.Fatalf("draind bpf remove: %v\n%s", err, out)
	}
	t.Logf("draind bpf remove: %s", strings.TrimSpace(string(out)))
	if got := attachedPrograms(t, kubepods); len(got) != 0 {
		t.Errorf("programs still attached to %s after draind bpf remove: %v", kubepods, keys(got))
	}
	// Programs are freed once nothing holds them; give the kernel a moment
	// (RCU) before declaring a leak.
	var progs []string
	for range 50 {
		if progs = loadedPrograms(left); len(progs) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(progs) != 0 {
		t.Errorf("draind's programs are still loaded in the kernel after draind bpf remove: %v", progs)
	}
	if _, err := os.Stat(bpf.DefaultPinDir); err == nil {
		ents, _ := os.ReadDir(bpf.DefaultPinDir)
		t.Errorf("%s still exists after draind bpf remove (%d entries)", bpf.DefaultPinDir, len(ents))
	}
}
