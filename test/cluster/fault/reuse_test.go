package fault

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

// TestFaultIPReuse deletes web-0, a pod of a ClusterIP Service on node b: it
// drains, departs, and its IP lingers on every node (--linger=60s), so a
// remote client's stale connection to it is rewritten to web-1. Then a new
// pod, reuse-0, in no Service, starts on node b with web-0's IP. From the
// moment its Pod object exists (with that IP, on node b), within one second:
// connections from a client on node a to that IP:port reach reuse-0 (not
// rewritten to web-1, not refused), and no node's pinned maps hold a drain
// entry for the IP any more.
func TestFaultIPReuse(t *testing.T) {
	bed.RequirePrivileged(t)
	tol := tolerance(t)
	bound := time.Second + tol
	const observe = 5 * time.Second

	f := newFixture(t, "reuse", "a", "b")
	vip := f.service("web")
	web0 := f.pod("b", "web-0", "web")
	web1 := f.pod("b", "web-1", "web")
	watch := f.watchReady("web", web0, web1)
	f.waitProgrammed(vip, web0, web1)
	args := []string{"--linger=60s"}
	da := f.startDraind("a", args...)
	f.startDraind("b", args...)
	ca := f.client("a")
	ip4, ip6 := web0.Bed.IP4, web0.Bed.IP6
	target := netip.AddrPortFrom(ip4, serverPort)
	f.reaches(ca, target, 5, "web-0")

	// web-0 goes: graceful delete, the kubelet's part (not ready, server
	// stopped, object removed), then its network namespace.
	deleted := time.Now()
	if err := f.env.kc.Admin.CoreV1().Pods(f.ns).Delete(f.ctx, "web-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := web0.Terminate(f.ctx, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	if _, err := watch.Wait(ctx, deleted, func(s kube.EndpointsSnapshot) bool {
		_, ok := s.Find(ip4)
		return !ok
	}); err != nil {
		t.Fatal(err)
	}
	if err := web0.Bed.Delete(); err != nil {
		t.Fatal(err)
	}
	// Premise: the remote node steers the departed IP for the linger.
	deadline := time.Now().Add(10 * time.Second)
	for {
		dm, err := pinned(da)
		if err == nil && len(liveDrains(dm, ip4, time.Now())) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node a holds no drain entry for web-0's departed IP %s 10 s after it left its slice (err %v): the test proves nothing", ip4, err)
		}
		time.Sleep(mapPoll)
	}
	f.reaches(ca, target, 5, "web-1")
	t.Logf("web-0 (%s) departed; node a rewrites connections to it to web-1 (linger 60 s)", ip4)

	// reuse-0: the bed pod with web-0's addresses and its server first,
	// then the Pod object — the instant it exists is the reference.
	rctx, rcancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer rcancel()
	staged, err := f.nodes["b"].StagePodIPs(rctx, "reuse-0", serverPort, ip4, ip6)
	if err != nil {
		t.Fatal(err)
	}
	p := startProber("client-a", ca, target)
	defer p.Stop()
	watches := map[string]*mapWatch{}
	for name, d := range f.daemons {
		watches[name] = watchMaps(d, netip.AddrPortFrom(ip4, serverPort), ip4)
	}
	time.Sleep(200 * time.Millisecond) // probes from before the Pod exists
	created := time.Now()
	if _, err := staged.Register(f.ctx, f.ns, map[string]string{"app": "other"}); err != nil {
		t.Fatal(err)
	}
	registered := time.Now()
	time.Sleep(observe)
	end := time.Now()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, w := range watches {
		w.Stop()
	}

	// The figures: the first connection reuse-0 answered, and anything
	// else after it; when each node's drain entries for the IP went.
	probes := p.between(created, end)
	var first time.Time
	var wrong []probe
	for _, pr := range probes {
		if first.IsZero() {
			if pr.server == "reuse-0" {
				first = pr.at
			}
			continue
		}
		if pr.server != "reuse-0" {
			wrong = append(wrong, pr)
		}
	}
	t.Logf("figures (from the Pod create call; its create+status calls took %s; bound 1 s + %v tolerance):", ms(registered.Sub(created)), tol)
	t.Logf("  client-a → %s before reuse-0's Pod existed: %s", target, fmtTally(tally(p.between(time.Time{}, created))))
	t.Logf("  client-a → %s in the first %v: %s; after: %s", target, bound,
		fmtTally(tally(p.between(created, created.Add(bound)))), fmtTally(tally(p.between(created.Add(bound), end))))
	if !first.IsZero() {
		t.Logf("  first connection answered by reuse-0: %s after the Pod was created; %d connections after it answered by another or failed", ms(first.Sub(created)), len(wrong))
	} else {
		t.Logf("  no connection answered by reuse-0 within %v", observe)
	}
	gone := map[string]time.Duration{}
	for name, w := range watches {
		gone[name] = -1
		ss := w.between(created, end)
		for i := len(ss) - 1; i >= 0; i-- {
			if ss[i].err != nil || hasDrain(ss[i]) {
				if i+1 < len(ss) {
					gone[name] = ss[i+1].at.Sub(created)
				}
				break
			}
			if i == 0 {
				gone[name] = 0
			}
		}
		t.Logf("  node %s: drain entries for %s gone %s after the Pod was created", name, ip4, fmtDur(gone[name]))
	}

	if first.IsZero() || first.Sub(created) > bound {
		t.Errorf("connections to %s reach the new pod reuse-0 %s after its Pod was created: want within %v", target, fmtDurOr(first, created), bound)
	}
	if len(wrong) > 0 {
		t.Errorf("%d connections after the first one reuse-0 answered went elsewhere or failed: %s", len(wrong), fmtTally(tally(wrong)))
	}
	for name, g := range gone {
		if g < 0 || g > bound {
			t.Errorf("node %s's drain entries for %s gone %s after reuse-0 was created: want within %v", name, ip4, fmtDur(g), bound)
		}
	}
}

// hasDrain reports whether a sample saw a live drain entry for the watched
// IP (mapWatch records steering as frontend && drain; for a pod IP there is
// no frontend, so the drain is what steering means here).
func hasDrain(s mapSample) bool { return s.drains > 0 }

func fmtDurOr(at, from time.Time) string {
	if at.IsZero() {
		return "never (by the end of the test)"
	}
	return fmt.Sprint(ms(at.Sub(from)))
}
