package realnode_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
// new connection reaches an old pod after its deletion (beyond
// faultBound) — or, for a pod deleted while no draind ran on the clients'
// node, after draind is Ready there again: a drain that starts while
// draind is down is not steered until it is back (kube-proxy's own rule
// removal covers that gap).
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
			down = append(down, window{from, time.Now()})
			sleepCtx(ctx, 3*time.Second)
		}
	}
	res := runRolloutOn(ctx, t, b.m.Nodes[0], "fault-restart-"+b.m.ProxyMode(), b.onServers(spec), b.client, during)
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
	b.checkNoLateConnections(ctx, t, res, false, down)
	b.waitDraindReady(ctx, t)
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
	res := runRolloutOn(ctx, t, b.m.Nodes[0], ns, b.onServers(spec), b.client, during)
	if stopped.IsZero() || ready.IsZero() {
		t.Fatalf("the outage did not happen during the rollout")
	}
	b.checkPlacement(t, res.oldPods)
	b.checkNoLateConnections(ctx, t, res, true, nil)
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

// checkNoLateConnections asserts that no connection from the clients'
// node reached an old pod later than faultBound after the pod's deletion
// (or after the end of the down window the deletion fell in)
// and, if strict, that no client request failed (failures are logged
// otherwise).
func (b *multiBed) checkNoLateConnections(ctx context.Context, t *testing.T, res *rolloutResult, strict bool, down []window) {
	t.Helper()
	for _, kind := range clientKinds {
		if st := res.clients[kind]; st.Failed() != 0 && strict {
			t.Errorf("the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		} else if st.Failed() != 0 {
			t.Logf("the %s client saw %d failed requests (%s): %v", kind, st.Failed(), st.FailKinds(), st.Errors)
		}
	}
	client := b.m.Node(b.client)
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
		flows, err := client.AcceptedFlows(ctx, netip.MustParseAddr(p.Status.PodIP))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			if !f.Start.IsZero() && f.Start.Sub(del) > faultBound {
				late = append(late, fmt.Sprintf("%v → %s (%s) %v after its deletion", f.Orig.Src, p.Name, p.Status.PodIP, f.Start.Sub(del).Round(time.Millisecond)))
			}
		}
	}
	if len(late) > 0 {
		t.Errorf("%d new connections reached an old pod more than %v after its deletion:\n%s", len(late), faultBound, strings.Join(late, "\n"))
	}
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
