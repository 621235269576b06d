package realnode_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/test/cluster/realnode"
)

// faultBound is how long after an old pod's deletion a connection may
// still reach it in the fault tests: draind steers within tens of
// milliseconds of the deletion; a second covers the watch's own delay and
// kube-proxy's rule removal on a quiet cluster, and is what the
// control-plane bed's fault tests allow.
const faultBound = time.Second

// TestMultiNodeFaultRestart restarts draind on the clients' node again and
// again while a rollout of servers on the other nodes runs: draind's pins
// keep steering while it is down and the new daemon takes them over, so no
// new connection reaches an old pod once it is drained, nor after its
// deletion (beyond faultBound) — or, for a pod deleted while no draind ran
// on the clients' node, after draind is Ready there again: a drain that
// starts while draind is down is not steered until it is back (the pod's
// node sees those connections and does not call it drained meanwhile).
func TestMultiNodeFaultRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	b := sharedMultiBed(t)
	b.install(ctx, t)
	spec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	// down are the windows in which no Ready draind ran on the clients'
	// node: from a pod's deletion until its successor is Ready.
	var down []window
	during := func(ctx context.Context, t *testing.T, _ *rolloutResult) {
		for ctx.Err() == nil {
			p := b.draindPodOnErr(ctx, b.client)
			if p == "" {
				sleepCtx(ctx, 100*time.Millisecond)
				continue
			}
			from := time.Now()
			if _, err := b.m.Kubectl(ctx, "-n", "draind-system", "delete", "pod", p, "--wait=false"); err != nil {
				continue
			}
			for ctx.Err() == nil {
				if q := b.draindPodOnErr(ctx, b.client); q != "" && q != p {
					break
				}
				sleepCtx(ctx, 100*time.Millisecond)
			}
			w := window{from: from}
			if ctx.Err() == nil {
				w.to = time.Now()
			} // else open: closed below, once draind is Ready again
			down = append(down, w)
			sleepCtx(ctx, 3*time.Second)
		}
	}
	rec := &flowRecorder{}
	res := runRolloutOn(ctx, t, b.m.Nodes[0], "fault-restart-"+b.m.ProxyMode(), b.onServers(spec), b.client, b.recording(rec, during))
	b.waitDraindReady(ctx, t)
	for i := range down {
		if down[i].to.IsZero() {
			down[i].to = time.Now()
		}
	}
	b.checkPlacement(t, res.oldPods)
	if len(down) < 2 {
		t.Errorf("draind on %s was restarted %d times during the rollout, want at least 2", b.client, len(down))
	}
	var downs []string
	for _, w := range down {
		downs = append(downs, w.to.Sub(w.from).Round(100*time.Millisecond).String())
	}
	// Requests of the stale pod-IP client may time out while no draind
	// runs on its node: reported, not asserted (see docs/multinode.md).
	b.checkNoLateConnections(ctx, t, res, rec, false, down)
	kubectl(ctx, t, b.m.Nodes[0], "delete", "namespace", res.namespace, "--wait=false")
	t.Logf("multi-node figures: TestMultiNodeFaultRestart (kube-proxy %s): %d restarts of draind on the clients' node (down %s) during a %v rollout; clients: %s; wall time %v",
		b.m.ProxyMode(), len(down), strings.Join(downs, ", "), res.took.Round(100*time.Millisecond), summary(res), time.Since(start).Round(time.Second))
}

// TestMultiNodeFaultOutage stops kube-apiserver (SIGKILL) as the first old
// pod of a rollout starts draining and starts it again 15 s later: the
// nodes' draind keep steering from what they knew, so no request fails and
// no new connection reaches an old pod after its deletion (beyond
// faultBound).
func TestMultiNodeFaultOutage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	b := sharedMultiBed(t)
	b.install(ctx, t)
	spec, err := realnode.WithRecipe(b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	const outage = 15 * time.Second
	var stopped, ready time.Time
	ns := "fault-outage-" + b.m.ProxyMode()
	during := func(ctx context.Context, t *testing.T, _ *rolloutResult) {
		cs := b.m.Cluster.Admin
		for ctx.Err() == nil {
			pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + appName})
			if err == nil && deleting(pods.Items) {
				break
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		sleepCtx(ctx, 300*time.Millisecond) // the drain Lease written
		if ctx.Err() != nil {
			return
		}
		if err := b.m.Cluster.StopAPIServer(); err != nil {
			t.Errorf("stopping kube-apiserver: %v", err)
			return
		}
		stopped = time.Now()
		sleepCtx(ctx, outage)
		var err error
		if ready, err = b.m.Cluster.StartAPIServer(context.Background(), 100*time.Millisecond); err != nil {
			t.Errorf("starting kube-apiserver again: %v", err)
			return
		}
		if err := b.m.Cluster.RestartControllerManager(context.Background()); err != nil {
			t.Errorf("restarting kube-controller-manager after the outage: %v", err)
		}
	}
	rec := &flowRecorder{}
	res := runRolloutOn(ctx, t, b.m.Nodes[0], ns, b.onServers(spec), b.client, b.recording(rec, during))
	if stopped.IsZero() || ready.IsZero() {
		t.Fatalf("the outage did not happen during the rollout")
	}
	b.checkPlacement(t, res.oldPods)
	b.checkNoLateConnections(ctx, t, res, rec, true, nil)
	b.waitDraindReady(ctx, t)
	kubectl(ctx, t, b.m.Nodes[0], "delete", "namespace", res.namespace, "--wait=false")
	t.Logf("multi-node figures: TestMultiNodeFaultOutage (kube-proxy %s): apiserver down %v mid-rollout; rollout %v; clients: %s; wall time %v",
		b.m.ProxyMode(), ready.Sub(stopped).Round(100*time.Millisecond), res.took.Round(100*time.Millisecond), summary(res), time.Since(start).Round(time.Second))
}

func deleting(pods []corev1.Pod) bool {
	for _, p := range pods {
		if p.DeletionTimestamp != nil {
			return true
		}
	}
	return false
}

// window is a span of time.
type window struct{ from, to time.Time }

// flowRecorder keeps every connection from the clients' node that an old
// pod accepted, read from conntrack there while the rollout runs: a gone
// pod's flows do not last until its end (draind expires them).
type flowRecorder struct {
	mu    sync.Mutex
	flows map[string]map[flowID]conntrack.Flow // by old pod IP
}

type flowID struct {
	orig  conntrack.Tuple
	start int64
}

// read adds the accepted flows conntrack on n now holds to old pods.
func (r *flowRecorder) read(ctx context.Context, n *realnode.Node, pods []corev1.Pod) error {
	addrs := make([]netip.Addr, len(pods))
	for i, p := range pods {
		addrs[i] = netip.MustParseAddr(p.Status.PodIP)
	}
	byAddr, err := n.AcceptedFlows(ctx, addrs...)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.flows == nil {
		r.flows = map[string]map[flowID]conntrack.Flow{}
	}
	for addr, flows := range byAddr {
		ip := addr.String()
		if r.flows[ip] == nil {
			r.flows[ip] = map[flowID]conntrack.Flow{}
		}
		for _, f := range flows {
			r.flows[ip][flowID{f.Orig, f.Start.UnixNano()}] = f
		}
	}
	return nil
}

// of returns the flows recorded to ip.
func (r *flowRecorder) of(ip string) []conntrack.Flow {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []conntrack.Flow
	for _, f := range r.flows[ip] {
		out = append(out, f)
	}
	return out
}

// recording returns a during func that runs fault (if any) and, beside it, reads
// the clients' node's flows to the old pods into rec every 250 ms.
func (b *multiBed) recording(rec *flowRecorder, fault func(context.Context, *testing.T, *rolloutResult)) func(context.Context, *testing.T, *rolloutResult) {
	return func(ctx context.Context, t *testing.T, res *rolloutResult) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if fault != nil {
				fault(ctx, t, res)
			}
		}()
		for ctx.Err() == nil {
			if err := rec.read(ctx, b.m.Node(b.client), res.oldPods); err != nil && ctx.Err() == nil {
				t.Errorf("reading conntrack on %s: %v", b.client, err)
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
		<-done
	}
}

// checkNoLateConnections asserts that no connection from the clients'
// node reached an old pod later than faultBound after the pod's deletion
// (or after the end of the down window the deletion fell in)
// and, if strict, that no client request failed (failures are logged
// otherwise).
func (b *multiBed) checkNoLateConnections(ctx context.Context, t *testing.T, res *rolloutResult, rec *flowRecorder, strict bool, down []window) {
	t.Helper()
	for _, kind := range clientKinds {
		if st := res.clients[kind]; st.Failed() != 0 && strict {
			t.Errorf("the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		} else if st.Failed() != 0 {
			t.Logf("the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		}
	}
	if err := rec.read(ctx, b.m.Node(b.client), res.oldPods); err != nil {
		t.Fatal(err)
	}
	var late []string
	for _, p := range res.oldPods {
		del, ok := res.deleted[p.Name]
		if !ok {
			t.Errorf("no deletion seen for old pod %s", p.Name)
			continue
		}
		// A drain that starts while no draind runs on the clients' node
		// is steered from the moment one is Ready again.
		for _, w := range down {
			if !del.Before(w.from) && del.Before(w.to) {
				t.Logf("%s was deleted %v into a restart of draind on %s: counted from its return", p.Name, del.Sub(w.from).Round(time.Millisecond), b.client)
				del = w.to
			}
		}
		for _, f := range rec.of(p.Status.PodIP) {
			if !f.Start.IsZero() && f.Start.Sub(del) > faultBound {
				late = append(late, fmt.Sprintf("%v → %s (%s) %v after its deletion", f.Orig.Src, p.Name, p.Status.PodIP, f.Start.Sub(del).Round(time.Millisecond)))
			}
		}
	}
	if len(late) > 0 {
		t.Errorf("%d new connections reached an old pod more than %v after its deletion:\n%s", len(late), faultBound, strings.Join(late, "\n"))
	}
	drained := b.checkNoneAfterDrained(ctx, t, res, rec)
	explainFailures(t, res, drained, down)
}

// checkNoneAfterDrained asserts that every old pod was declared drained by
// the draind of its node and that no connection from the clients' node
// reached it after that moment, reports each old pod's deletion → drained
// time, and returns the drained times by namespace/name.
func (b *multiBed) checkNoneAfterDrained(ctx context.Context, t *testing.T, res *rolloutResult, rec *flowRecorder) map[string]time.Time {
	t.Helper()
	drained := b.drainedAt(ctx, t, res.oldPods)
	var after, took []string
	seen := 0
	for _, p := range res.oldPods {
		at, ok := drained[p.Namespace+"/"+p.Name]
		if !ok {
			t.Errorf("old pod %s was never declared drained by draind on %s", p.Name, p.Spec.NodeName)
			continue
		}
		took = append(took, at.Sub(res.deleted[p.Name]).Round(10*time.Millisecond).String())
		flows := rec.of(p.Status.PodIP)
		if len(flows) == 0 {
			t.Errorf("conntrack on %s holds no connection to old pod %s (%s): nothing to check", b.client, p.Name, p.Status.PodIP)
		}
		seen += len(flows)
		for _, f := range flows {
			if !f.Start.IsZero() && f.Start.After(at) {
				after = append(after, fmt.Sprintf("%v → %s (%s) %v after it was drained", f.Orig.Src, p.Name, p.Status.PodIP, f.Start.Sub(at).Round(time.Millisecond)))
			}
		}
	}
	if len(after) > 0 {
		t.Errorf("%d new connections reached an old pod after it was drained:\n%s", len(after), strings.Join(after, "\n"))
	}
	t.Logf("old pods: deletion → drained %s; of %d connections from %s to them, %d started after the pod was drained", strings.Join(took, ", "), seen, b.client, len(after))
	return drained
}

// requestTimeout is the clients' per-request timeout (testapp's default).
const requestTimeout = 2 * time.Second

// explainFailures logs, for each failed client request, the old pod it
// went to, how long before it was sent that pod was deleted and drained,
// and whether a Ready draind ran on the clients' node while it was out.
func explainFailures(t *testing.T, res *rolloutResult, drained map[string]time.Time, down []window) {
	t.Helper()
	for _, kind := range clientKinds {
		for _, e := range res.clients[kind].Errors {
			f := strings.SplitN(e, " ", 3)
			at, err := time.Parse(time.RFC3339Nano, f[0])
			if err != nil || len(f) < 3 {
				continue
			}
			sent := at
			if f[1] == "timeout:" {
				sent = at.Add(-requestTimeout)
			}
			what := "no old pod"
			for _, p := range res.oldPods {
				if !strings.Contains(f[2], p.Status.PodIP+":") {
					continue
				}
				what = fmt.Sprintf("%s, deleted %v before", p.Name, sent.Sub(res.deleted[p.Name]).Round(time.Millisecond))
				if d, ok := drained[p.Namespace+"/"+p.Name]; ok {
					what += fmt.Sprintf(", drained %v before", sent.Sub(d).Round(time.Millisecond))
				}
			}
			state := "draind Ready on the clients' node throughout"
			for _, w := range down {
				if at.After(w.from) && sent.Before(w.to) {
					state = fmt.Sprintf("no Ready draind on the clients' node from %s to %s", w.from.Format("15:04:05.000"), w.to.Format("15:04:05.000"))
				}
			}
			t.Logf("%s client request sent at %s failed (%s): %s; %s", kind, sent.Format("15:04:05.000"), strings.TrimSuffix(f[1], ":"), what, state)
		}
	}
}

// drainedAt returns when the draind of each old pod's node declared it
// drained ("pod drained" in its JSON log), by namespace/name.
func (b *multiBed) drainedAt(ctx context.Context, t *testing.T, pods []corev1.Pod) map[string]time.Time {
	t.Helper()
	out := map[string]time.Time{}
	seen := map[string]bool{}
	for _, p := range pods {
		if seen[p.Spec.NodeName] {
			continue
		}
		seen[p.Spec.NodeName] = true
		d := b.draindPodOn(ctx, t, p.Spec.NodeName)
		logs := kubectl(ctx, t, b.m.Nodes[0], "-n", "draind-system", "logs", d.Name)
		for _, rec := range draindRecords(logs) {
			if rec.Msg == "pod drained" {
				out[rec.Pod] = rec.Time
			}
		}
	}
	return out
}

// draindPodOnErr is draindPodOn without failing: "" when there is none.
func (b *multiBed) draindPodOnErr(ctx context.Context, node string) string {
	pods, err := b.m.Cluster.Admin.CoreV1().Pods("draind-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=draind", FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && podReady(&p) {
			return p.Name
		}
	}
	return ""
}
