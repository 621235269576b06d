package fault

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
)

// TestFaultTerminatingPodReachable deletes two pods of node b that no
// Service lists, while clients on nodes a and b keep connecting to their
// IPs. The kubelet stand-in does nothing, so both stay Terminating and
// serving. "lone" never asked to go offline and its workload did not opt in:
// the Kubernetes network model says a connection to its IP reaches it until
// it is gone, so every connection must be answered by lone, and every
// drain entry draind holds for its IP must pass (policy off). "optin"
// carries draind.io/steer-on-delete: "true" (as draind's webhook writes on
// the pods it injects): its IP is steered from the deletion on — refused,
// the default policy of a pod in no Service — which shows that the entries
// for lone are in place and only their policy differs.
func TestFaultTerminatingPodReachable(t *testing.T) {
	bed.RequirePrivileged(t)
	const observe = 2 * time.Second

	f := newFixture(t, "netmodel", "a", "b")
	lone := f.pod("b", "lone", "lone")
	optin := f.pod("b", "optin", "optin")
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"true"}}}`, k8s.AnnotationSteerOnDelete)
	if _, err := f.env.kc.Admin.CoreV1().Pods(f.ns).Patch(f.ctx, "optin", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	f.startDraind("a")
	f.startDraind("b")
	loneAddr := netip.AddrPortFrom(lone.Bed.IP4, serverPort)
	optinAddr := netip.AddrPortFrom(optin.Bed.IP4, serverPort)
	clients := map[string]*proberPair{}
	for _, n := range []string{"a", "b"} {
		c := f.client(n)
		f.reaches(c, loneAddr, 3, "lone")
		f.reaches(c, optinAddr, 3, "optin")
		clients[n] = &proberPair{lone: startProber("lone-"+n, c, loneAddr), optin: startProber("optin-"+n, c, optinAddr)}
	}
	deleted := time.Now()
	for _, name := range []string{"lone", "optin"} {
		if err := f.env.kc.Admin.CoreV1().Pods(f.ns).Delete(f.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Both nodes hold entries for both IPs once the deletion (node b) and
	// the drain Leases (node a) reached them.
	waitFor(t, 30*time.Second, "drain entries for lone and optin on both nodes", func() bool {
		for _, d := range f.daemons {
			dm, err := pinned(d)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if len(liveDrains(dm, lone.Bed.IP4, now)) == 0 || !hasPolicy(liveDrains(dm, optin.Bed.IP4, now), bpf.PolicyRefuse) {
				return false
			}
		}
		return true
	})
	entries := time.Now()
	time.Sleep(observe)
	for name, d := range f.daemons {
		dm, err := pinned(d)
		if err != nil {
			t.Fatal(err)
		}
		for _, dr := range liveDrains(dm, lone.Bed.IP4, time.Now()) {
			if dr.Policy != bpf.PolicyOff {
				t.Errorf("node %s: drain entry %s for lone (terminating, not offline, not opted in) has policy %s, want off", name, dr.Key, dr.Policy)
			}
		}
	}
	end := time.Now()
	for n, pp := range clients {
		for _, p := range []*prober{pp.lone, pp.optin} {
			if err := p.Stop(); err != nil {
				t.Fatal(err)
			}
		}
		all := tally(pp.lone.between(deleted, end))
		t.Logf("client on %s → lone %s from the deletion on (entries in place after %s): %s", n, loneAddr, ms(entries.Sub(deleted)), fmtTally(all))
		for k, c := range all {
			if k != "lone" {
				t.Errorf("client on %s: %d connections to lone's IP answered %q: a terminating pod must stay reachable at its IP", n, c, k)
			}
		}
		steered := tally(pp.optin.between(entries, end))
		t.Logf("client on %s → optin %s once its entries were in place: %s", n, optinAddr, fmtTally(steered))
		if steered["optin"] != 0 || len(steered) == 0 {
			t.Errorf("client on %s: opted-in pod's IP not steered after its deletion: %s", n, fmtTally(steered))
		}
	}
}

type proberPair struct{ lone, optin *prober }

func hasPolicy(ds []bpf.Drain, p bpf.Policy) bool {
	for _, d := range ds {
		if d.Policy == p {
			return true
		}
	}
	return false
}

// waitFor polls cond every 50 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waiting %s for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
