package fault

import (
	"context"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

// TestFaultHeadlessGonePodNotRefused deletes hl-0, a pod of a headless
// Service (pod-IP policy `off` by default: its pods are usually not
// interchangeable), while a client on another node keeps connecting to
// hl-0's IP. The kubelet stand-in removes the Pod object but leaves the
// pod's server answering, so what draind does to those connections shows:
// with policy `off` it leaves them alone, draining or gone — no connection
// is refused, neither while hl-0 drains nor during its linger, and no node
// holds a drain entry for the IP with any other policy (a headless
// Service's gone pod must not have its IP refused for the linger while the
// Service's policy is off).
func TestFaultHeadlessGonePodNotRefused(t *testing.T) {
	bed.RequirePrivileged(t)
	// How long after hl-0 left its slice the test watches: draind reacts to
	// a slice or pod change in milliseconds, so 3 s of linger is ample.
	const observe = 3 * time.Second

	f := newFixture(t, "headless", "a", "b")
	f.headlessService("hl")
	hl0 := f.pod("b", "hl-0", "hl")
	hl1 := f.pod("b", "hl-1", "hl")
	watch := f.watchReady("hl", hl0, hl1)
	args := []string{"--linger=60s"}
	f.startDraind("a", args...)
	f.startDraind("b", args...)
	ca := f.client("a")
	target := netip.AddrPortFrom(hl0.Bed.IP4, serverPort)
	f.reaches(ca, target, 5, "hl-0")

	p := startProber("client-a", ca, target)
	defer p.Stop()
	deleted := time.Now()
	if err := f.env.kc.Admin.CoreV1().Pods(f.ns).Delete(f.ctx, "hl-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kubelet's part, except that the server keeps answering.
	if err := hl0.Node.Kubelet.Terminate(f.ctx, f.ns, "hl-0", nil, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	left, err := watch.Wait(ctx, deleted, func(s kube.EndpointsSnapshot) bool {
		_, ok := s.Find(hl0.Bed.IP4)
		return !ok
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(left.At.Add(observe)))
	end := time.Now()
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	// Whatever entries draind keeps for the IP must pass connections.
	var bad []bpf.Drain
	for name, d := range f.daemons {
		dm, err := pinned(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, dr := range liveDrains(dm, hl0.Bed.IP4, time.Now()) {
			t.Logf("node %s: drain entry %s policy %s", name, dr.Key, dr.Policy)
			if dr.Policy != bpf.PolicyOff {
				bad = append(bad, dr)
			}
		}
	}

	draining := tally(p.between(deleted, left.At))
	gone := tally(p.between(left.At, end))
	t.Logf("client-a → %s (hl-0's IP): while hl-0 drained (%s) %s | after it left its slice (%v) %s",
		target, ms(left.At.Sub(deleted)), fmtTally(draining), observe, fmtTally(gone))
	for _, x := range []struct {
		when string
		m    map[string]int
	}{{"while hl-0 drained", draining}, {"after hl-0 was gone", gone}} {
		for k, n := range x.m {
			if k != "hl-0" {
				t.Errorf("%s: %d connections to %s answered %q: want all left alone (answered by hl-0, policy off)", x.when, n, target, k)
			}
		}
	}
	if len(gone) == 0 {
		t.Errorf("no connection to %s was tried after hl-0 was gone: the test proves nothing", target)
	}
	for _, dr := range bad {
		t.Errorf("drain entry %s for a headless Service's gone pod has policy %s: want none, or off", dr.Key, dr.Policy)
	}
}
