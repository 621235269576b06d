package fault

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/headline"
)

// mapSample is one read of a daemon's pinned maps.
type mapSample struct {
	at       time.Time
	steering bool   // live frontend for the VIP and live drain for the pod
	drains   int    // live drain entries for the pod's IP
	steered  uint64 // steered_clusterip counter (IPv4)
	err      error
}

// mapWatch reads a daemon's pinned maps every mapPoll.
type mapWatch struct {
	d    *headline.Draind
	vip  netip.AddrPort
	ip   netip.Addr
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []mapSample
}

func watchMaps(d *headline.Draind, vip netip.AddrPort, ip netip.Addr) *mapWatch {
	w := &mapWatch{d: d, vip: vip, ip: ip, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		t := time.NewTicker(mapPoll)
		defer t.Stop()
		for {
			s := mapSample{}
			dm, err := pinned(d)
			s.at = time.Now()
			if err != nil {
				s.err = err
			} else {
				s.drains = len(liveDrains(dm, ip, s.at))
				s.steering = liveFrontend(dm, vip, s.at) && s.drains > 0
				s.steered = dm.Counters.Get(bpf.OutSteeredClusterIP, bpf.IPv4)
			}
			w.mu.Lock()
			w.samples = append(w.samples, s)
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *mapWatch) Stop() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

func (w *mapWatch) between(from, to time.Time) []mapSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []mapSample
	for _, s := range w.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// gaps returns the samples in [from, to) that did not steer, as time
// spans (first and last such sample of each run).
func gaps(ss []mapSample) [][2]time.Time {
	var out [][2]time.Time
	in := false
	for _, s := range ss {
		if !s.steering {
			if !in {
				out = append(out, [2]time.Time{s.at, s.at})
				in = true
			}
			out[len(out)-1][1] = s.at
		} else {
			in = false
		}
	}
	return out
}

// backFrom returns how long after from the maps steered again for good
// (from the first steering sample after the last non-steering one), or -1
// if they did not by the last sample.
func backFrom(ss []mapSample, from time.Time) time.Duration {
	if len(ss) == 0 || !ss[len(ss)-1].steering {
		return -1
	}
	back := from
	for i := len(ss) - 1; i >= 0; i-- {
		if !ss[i].steering {
			if i+1 < len(ss) {
				back = ss[i+1].at
			}
			break
		}
	}
	if back.Before(from) {
		return 0
	}
	return back.Sub(from)
}

// firstSteer returns how long after from the steered_clusterip counter
// first grew, or -1.
func firstSteer(ss []mapSample, from time.Time) time.Duration {
	var prev uint64
	havePrev := false
	for _, s := range ss {
		if s.err != nil {
			continue
		}
		if havePrev && s.steered > prev && !s.at.Before(from) {
			return s.at.Sub(from)
		}
		prev, havePrev = s.steered, true
	}
	return -1
}

// TestFaultAPIOutage stops kube-apiserver in the middle of a drain for more
// than twice the drain Lease duration, then starts it again (same port,
// certificates, etcd). web-0 on node a is drained by its offline call with a
// long wait (its preStop is blocked in it) and stays Ready; a client on each
// node opens a ClusterIP connection every 20 ms. A second pod, gone-0, was
// drained and deleted just before the outage, so that its linger — and the
// deletion of its Lease — falls inside the outage:
//   - node a, which hosts web-0, keeps its local drain throughout: its
//     steering never lapses and web-0's offline call is not cancelled;
//   - node a renews (or recreates) web-0's Lease as soon as the API server
//     answers, and every node steers again within one second of /readyz;
//   - no new connection reaches web-0 from then on;
//   - no adopt/cancel loop ("drain adopted" logged over and over);
//   - gone-0's Lease, whose deletion failed during the outage, is deleted
//     within a few seconds of the API server being back.
//
// Node b may fail open while the Lease has expired and it cannot hear from
// the API server; the test prints when it did.
func TestFaultAPIOutage(t *testing.T) {
	bed.RequirePrivileged(t)
	const leaseDuration = 10 * time.Second
	const linger = 10 * time.Second
	outage := envDuration(t, EnvOutage, 25*time.Second)
	if outage < 2*leaseDuration {
		t.Fatalf("%s=%v: the outage must last at least twice the Lease duration (%v)", EnvOutage, outage, leaseDuration)
	}
	tol := tolerance(t)
	bound := time.Second + tol
	// How long after the API server is back the test watches.
	const observe = 8 * time.Second
	const leaseDeleteBound = 5 * time.Second // "within a few seconds"

	f := newFixture(t, "outage", "a", "b")
	vip := f.service("web")
	web0 := f.pod("a", "web-0", "web")
	web1 := f.pod("a", "web-1", "web")
	web2 := f.pod("b", "web-2", "web")
	gone0 := f.pod("a", "gone-0", "gone")
	f.watchReady("web", web0, web1, web2)
	f.waitProgrammed(vip, web0, web1, web2)
	args := []string{"--lease-duration=" + leaseDuration.String(), "--linger=" + linger.String()}
	da := f.startDraind("a", args...)
	db := f.startDraind("b", args...)
	ca, cb := f.client("a"), f.client("b")
	f.reaches(cb, vip, 60, "web-0", "web-1", "web-2")
	admin := f.env.kc.Admin
	leases := admin.CoordinationV1().Leases(headline.DraindNamespace)

	// web-0's preStop: an offline call that waits far longer than the test
	// (quiet 5 min: it cannot be "drained" before the test ends).
	type answer struct {
		at   time.Time
		code int
		body string
		err  error
	}
	waitCtx, cancelWait := context.WithCancel(f.ctx)
	defer cancelWait()
	waited := make(chan answer, 1)
	go func() {
		code, body, err := offline(waitCtx, web0, da, "wait=5m&quiet=5m")
		waited <- answer{time.Now(), code, body, err}
	}()
	f.waitSteering(vip, web0.Bed.IP4, 10*time.Second)
	web0Lease := k8s.LeaseName(types.UID(podUID(t, f, "web-0")))

	// gone-0: drained (Lease published), then deleted; its linger ends
	// linger after node a sees it gone, inside the outage.
	if code, body, err := offline(f.ctx, gone0, da, ""); err != nil || code != 200 {
		t.Fatalf("gone-0's offline call: %d %s %v", code, body, err)
	}
	goneLease := k8s.LeaseName(types.UID(podUID(t, f, "gone-0")))
	if _, err := leases.Get(f.ctx, goneLease, metav1.GetOptions{}); err != nil {
		t.Fatalf("gone-0's Lease after its offline call: %v", err)
	}
	if err := admin.CoreV1().Pods(f.ns).Delete(f.ctx, "gone-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := gone0.Terminate(f.ctx, nil); err != nil {
		t.Fatal(err)
	}
	goneAt := time.Now()

	pa := startProber("client-a", ca, vip)
	pb := startProber("client-b", cb, vip)
	wa := watchMaps(da, vip, web0.Bed.IP4)
	wb := watchMaps(db, vip, web0.Bed.IP4)
	defer func() { pa.Stop(); pb.Stop(); wa.Stop(); wb.Stop() }()

	// The outage starts 3 s after gone-0 is gone: its linger (10 s) ends
	// 7 s into it.
	time.Sleep(time.Until(goneAt.Add(3 * time.Second)))
	adoptedBefore, err := countLog(da.LogPath(), "drain adopted")
	if err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := f.env.kc.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	// The bed's controllers come out of the outage slowly (reflector
	// backoff): the tests after this one get a fresh controller manager.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := f.env.kc.RestartControllerManager(ctx); err != nil {
			t.Errorf("restarting kube-controller-manager after the outage: %v", err)
		}
	})
	t.Logf("kube-apiserver killed %s after gone-0 was deleted; down for %v (drain Lease duration %v, linger %v)", ms(down.Sub(goneAt)), outage, leaseDuration, linger)
	time.Sleep(time.Until(down.Add(outage)))
	up, err := f.env.kc.StartAPIServer(f.ctx, readyPoll)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver /readyz ok %s after it was started again (outage %s)", ms(up.Sub(down.Add(outage))), ms(up.Sub(down)))

	// After the API server is back: web-0's Lease renewed, gone-0's
	// deleted.
	var renewedAt, goneLeaseAt time.Time
	var renewErr, goneErr error
	for deadline := up.Add(observe); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(f.ctx, time.Second)
		if renewedAt.IsZero() {
			l, err := leases.Get(ctx, web0Lease, metav1.GetOptions{})
			switch {
			case err != nil:
				renewErr = err
			case l.Spec.RenewTime != nil && l.Spec.RenewTime.After(down):
				renewedAt = time.Now()
			default:
				renewErr = fmt.Errorf("renewTime %v is from before the outage", l.Spec.RenewTime)
			}
		}
		if goneLeaseAt.IsZero() {
			_, err := leases.Get(ctx, goneLease, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				goneLeaseAt = time.Now()
			} else {
				goneErr = err
			}
		}
		cancel()
	}
	end := time.Now()
	pa.Stop()
	pb.Stop()
	wa.Stop()
	wb.Stop()
	adopted, err := countLog(da.LogPath(), "drain adopted")
	if err != nil {
		t.Fatal(err)
	}
	adopted -= adoptedBefore
	var ans *answer
	select {
	case a := <-waited:
		ans = &a
	default:
	}

	// The figures.
	t.Logf("figures (API server back = /readyz ok, polled every %v; maps polled every %v; bound 1 s + %v tolerance):", readyPoll, mapPoll, tol)
	for _, x := range []struct {
		name string
		w    *mapWatch
	}{{"a (hosts web-0)", wa}, {"b (remote)", wb}} {
		during := x.w.between(down, up)
		var spans []string
		for _, g := range gaps(during) {
			spans = append(spans, fmt.Sprintf("+%s..+%s", ms(g[0].Sub(down)), ms(g[1].Sub(down))))
		}
		lost := "steered throughout"
		if len(spans) > 0 {
			lost = "not steering at " + strings.Join(spans, ", ") + " after the API server went down"
		}
		t.Logf("  node %s during the outage (%d samples): %s", x.name, len(during), lost)
		afterS := x.w.between(up, end)
		back := backFrom(afterS, up)
		t.Logf("  node %s after: steering again %s after the API server was back; first connection steered away %s after",
			x.name, fmtDur(back), fmtDur(firstSteer(afterS, up)))
	}
	fmtAt := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return ms(at.Sub(up))
	}
	t.Logf("  web-0's Lease renewed after the outage: %s after the API server was back (last answer: %v)", fmtAt(renewedAt), renewErr)
	t.Logf("  gone-0's Lease (linger ended %s into the outage) deleted: %s after the API server was back (last answer: %v)",
		ms(goneAt.Add(linger).Sub(down)), fmtAt(goneLeaseAt), goneErr)
	t.Logf("  \"drain adopted\" logged by node a's draind from the outage on: %d times", adopted)
	if ans != nil {
		t.Logf("  web-0's offline call (wait=5m) ended %s after the API server went down: %d %s %v", ms(ans.at.Sub(down)), ans.code, ans.body, ans.err)
	} else {
		t.Logf("  web-0's offline call (wait=5m) still waiting, as its preStop should be")
	}
	for _, x := range []struct {
		name string
		p    *prober
	}{{"client-a", pa}, {"client-b", pb}} {
		t.Logf("  %s: before the outage %s | during %s | first second after %s | later %s", x.name,
			fmtTally(tally(x.p.between(time.Time{}, down))), fmtTally(tally(x.p.between(down, up))),
			fmtTally(tally(x.p.between(up, up.Add(bound)))), fmtTally(tally(x.p.between(up.Add(bound), end))))
	}

	// The verdicts.
	if g := gaps(wa.between(down, up)); len(g) > 0 {
		t.Errorf("node a, which hosts web-0, stopped steering during the outage (first at +%s): it must keep its local drain", ms(g[0][0].Sub(down)))
	}
	if ans != nil {
		t.Errorf("web-0's offline call ended during or after the outage (%d %s %v): the waiter must not be cancelled", ans.code, ans.body, ans.err)
	}
	if renewedAt.IsZero() || renewedAt.Sub(up) > bound {
		t.Errorf("web-0's Lease renewed %s after the API server was back: want within %v", fmtAt(renewedAt), bound)
	}
	for name, w := range map[string]*mapWatch{"a": wa, "b": wb} {
		if back := backFrom(w.between(up, end), up); back < 0 || back > bound {
			t.Errorf("node %s steers again %s after the API server was back: want within %v", name, fmtDur(back), bound)
		}
	}
	if d := firstSteer(wb.between(up, end), up); d < 0 || d > bound {
		t.Errorf("node b's first connection steered away %s after the API server was back: want within %v", fmtDur(d), bound)
	}
	for name, p := range map[string]*prober{"client-a": pa, "client-b": pb} {
		if n := tally(p.between(up.Add(bound), end))["web-0"]; n > 0 {
			t.Errorf("%s: %d new connections reached web-0 later than %v after the API server was back", name, n, bound)
		}
	}
	if adopted > 2 {
		t.Errorf("node a's draind logged \"drain adopted\" %d times from the outage on: an adopt/cancel loop", adopted)
	}
	if goneLeaseAt.IsZero() || goneLeaseAt.Sub(up) > leaseDeleteBound {
		t.Errorf("gone-0's Lease deleted %s after the API server was back: want within %v (a failed delete must be retried)", fmtAt(goneLeaseAt), leaseDeleteBound)
	}
}

func fmtDur(d time.Duration) string {
	if d < 0 {
		return "never (by the end of the test)"
	}
	return ms(d)
}

// podUID returns the UID of a pod of the fixture's namespace.
func podUID(t *testing.T, f *fixture, name string) string {
	t.Helper()
	p, err := f.env.kc.Admin.CoreV1().Pods(f.ns).Get(f.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(p.UID)
}
