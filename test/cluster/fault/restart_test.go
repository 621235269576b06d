package fault

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/e2e"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
)

// killPhase is where in a daemon's life the next kill lands.
type killPhase int

const (
	// phaseStarting: 0-150 ms after exec, before it is ready: loading and
	// adopting the pins, informers syncing, the first pass.
	phaseStarting killPhase = iota
	// phaseJustReady: 0-250 ms after /readyz first said ok: the first
	// passes after adoption.
	phaseJustReady
	// phaseMidTraffic: 0.3-6.5 s after ready: anywhere in the reconcile
	// cycle (a full pass every --entry-ttl/4 = 5 s here).
	phaseMidTraffic
	numPhases
)

func (p killPhase) String() string {
	return [...]string{"starting", "just-ready", "mid-traffic"}[p]
}

// restartRound is one kill -9 and restart, and what the clients saw from
// that kill to the next one.
type restartRound struct {
	n        int
	victims  string // node names killed
	phase    killPhase
	killedAt time.Time
	dead     time.Duration // kill → exec of the new process
	ready    time.Duration // exec → ready (0: killed before it was)
	live     time.Duration // exec → the next kill
	seen     map[string]map[string]int
}

// TestFaultRestartLoop kills draind with SIGKILL at many instants of its
// life — while it loads and adopts the pins, right after it is ready, and
// anywhere in the reconcile cycle — on the client's node, the draining
// pod's node and both, restarting it each time on the same pins, while a
// client on each node opens a new ClusterIP connection every 20 ms. The
// draining pod (drained by its own offline call) stays Ready in its
// EndpointSlice, so kube-proxy keeps sending it a third of the new
// connections: only draind's steering keeps them away. No new connection may
// reach it across all restarts.
func TestFaultRestartLoop(t *testing.T) {
	bed.RequirePrivileged(t)
	rounds := envInt(t, EnvRestarts, 10)
	seed := uint64(time.Now().UnixNano())
	if s := envInt(t, EnvSeed, -1); s >= 0 {
		seed = uint64(s)
	}
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	t.Logf("%d restarts, seed %d (%s=%d repeats the instants)", rounds, seed, EnvSeed, seed)

	f := newFixture(t, "restart", "a", "b")
	vip := f.service("web")
	web0 := f.pod("a", "web-0", "web") // drained
	web1 := f.pod("a", "web-1", "web")
	web2 := f.pod("b", "web-2", "web")
	watch := f.watchReady("web", web0, web1, web2)
	f.waitProgrammed(vip, web0, web1, web2)
	// A full pass every 5 s (entry-ttl/4), so that kills land all over the
	// reconcile cycle within a short test; entries outlive a dead daemon by
	// 20 s, far more than any dead time here.
	args := []string{"--entry-ttl=20s"}
	daemons := map[string]*headline.Draind{"a": f.startDraind("a", args...), "b": f.startDraind("b", args...)}
	clients := map[string]*e2e.Client{"a": f.client("a"), "b": f.client("b")}

	// Premise: without a drain kube-proxy sends web-0 its share.
	f.reaches(clients["b"], vip, 60, "web-0", "web-1", "web-2")

	code, body, err := offline(f.ctx, web0, daemons["a"], "")
	if err != nil || code != 200 {
		t.Fatalf("web-0's offline call: %d %s %v", code, body, err)
	}
	t.Logf("web-0 called /v1/offline: %d %s", code, body)
	f.waitSteering(vip, web0.Bed.IP4, 10*time.Second)
	// web-0 is still Ready: kube-proxy keeps balancing to it.
	if e, ok := watch.Current().Find(web0.Bed.IP4); !ok || !e.Ready {
		t.Fatalf("web-0's endpoint %+v: want ready (an offline call does not change readiness)", e)
	}
	f.waitProgrammed(vip, web0, web1, web2)

	probers := map[string]*prober{}
	for _, name := range []string{"a", "b"} {
		probers[name] = startProber("client-"+name, clients[name], vip)
	}
	defer func() {
		for _, p := range probers {
			p.Stop()
		}
	}()
	calmFrom := time.Now()
	time.Sleep(time.Second)

	// The rounds: victims cycle b (the client's node), a (the draining
	// pod's), both; phases cycle too, offset so that every victim meets
	// every phase; instants within a phase are random.
	victimSets := [][]string{{"b"}, {"a"}, {"a", "b"}}
	var log []*restartRound
	for i := 0; i < rounds; i++ {
		r := &restartRound{n: i + 1, phase: killPhase((i + i/len(victimSets)) % int(numPhases))}
		victims := victimSets[i%len(victimSets)]
		r.victims = strings.Join(victims, "+")
		r.killedAt = time.Now()
		for _, v := range victims {
			if err := daemons[v].Kill(); err != nil {
				t.Fatal(err)
			}
		}
		r.dead = time.Duration(rng.Int64N(int64(500 * time.Millisecond)))
		time.Sleep(r.dead)
		execAt := time.Now()
		for _, v := range victims {
			if err := daemons[v].Start(); err != nil {
				t.Fatal(err)
			}
		}
		switch r.phase {
		case phaseStarting:
			time.Sleep(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
		case phaseJustReady, phaseMidTraffic:
			var ready time.Time
			for _, v := range victims {
				at, err := daemons[v].WaitReady(f.ctx, 5*time.Millisecond)
				if err != nil {
					t.Fatal(err)
				}
				ready = at
			}
			r.ready = ready.Sub(execAt)
			if r.phase == phaseJustReady {
				time.Sleep(time.Duration(rng.Int64N(int64(250 * time.Millisecond))))
			} else {
				time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(6200*time.Millisecond))))
			}
		}
		r.live = time.Since(execAt)
		log = append(log, r)
	}
	// The last daemons must come up and keep steering: watch one more
	// full pass (5 s) plus a margin.
	lastFrom := time.Now()
	for name, d := range daemons {
		if _, err := d.WaitReady(f.ctx, 5*time.Millisecond); err != nil {
			t.Fatalf("draind on %s after the last restart: %v", name, err)
		}
	}
	time.Sleep(6 * time.Second)
	end := time.Now()
	for name, p := range probers {
		if err := p.Stop(); err != nil {
			t.Fatalf("client %s: %v", name, err)
		}
	}

	// Per round, what each client saw from its kill to the next.
	windows := make([]time.Time, 0, len(log)+1)
	for _, r := range log {
		windows = append(windows, r.killedAt)
	}
	windows = append(windows, lastFrom)
	for i, r := range log {
		r.seen = map[string]map[string]int{}
		for name, p := range probers {
			r.seen[name] = tally(p.between(windows[i], windows[i+1]))
		}
	}
	total := map[string]int{}
	fails := map[string]int{}
	add := func(m map[string]int) {
		for k, v := range m {
			if strings.HasPrefix(k, "!") {
				fails[k] += v
			}
			total[k] += v
		}
	}
	t.Logf("web-0 drained and still Ready; a client on each node opens a ClusterIP connection every %v; connections by answering pod:", probeEvery)
	calm := map[string]map[string]int{}
	for name, p := range probers {
		calm[name] = tally(p.between(calmFrom, windows[0]))
		add(calm[name])
	}
	t.Logf("  before the first kill (1 s): client-a %s | client-b %s", fmtTally(calm["a"]), fmtTally(calm["b"]))
	for _, r := range log {
		ready := "killed before ready"
		if r.ready > 0 {
			ready = "ready after " + ms(r.ready)
		}
		t.Logf("  restart %2d: kill -9 %-3s  dead %-6s %-24s next kill at +%-8s (%s)  client-a %s | client-b %s",
			r.n, r.victims, ms(r.dead), ready, ms(r.live), r.phase, fmtTally(r.seen["a"]), fmtTally(r.seen["b"]))
		add(r.seen["a"])
		add(r.seen["b"])
	}
	after := map[string]map[string]int{}
	for name, p := range probers {
		after[name] = tally(p.between(lastFrom, end))
		add(after[name])
	}
	t.Logf("  after the last restart (%s): client-a %s | client-b %s", ms(end.Sub(lastFrom)), fmtTally(after["a"]), fmtTally(after["b"]))
	t.Logf("  total: %s", fmtTally(total))

	// The premise held all along: web-0 Ready, kube-proxy balancing to it.
	if e, ok := watch.Current().Find(web0.Bed.IP4); !ok || !e.Ready {
		t.Errorf("web-0's endpoint %+v at the end: want still ready, or the test proves nothing", e)
	}
	for name, n := range f.nodes {
		r, err := n.Kube.Rules(f.ctx, corev1.IPv4Protocol)
		if err != nil {
			t.Fatal(err)
		}
		sp := kube.ServicePort{IP: vip.Addr(), Port: vip.Port(), Protocol: corev1.ProtocolTCP}
		if !containsAddrPort(r.Endpoints(sp), web0.Addr(corev1.IPv4Protocol)) {
			t.Errorf("kube-proxy on %s no longer balances %s to web-0 at the end: the test proves nothing", name, vip)
		}
	}
	ok := total["web-1"] + total["web-2"]
	if ok < 50*rounds {
		t.Errorf("only %d connections answered over %d restarts: the clients did not keep up", ok, rounds)
	}
	if total["web-0"] > 0 {
		var bad []string
		for _, r := range log {
			if n := r.seen["a"]["web-0"] + r.seen["b"]["web-0"]; n > 0 {
				bad = append(bad, fmt.Sprintf("restart %d (kill %s, %s): %d", r.n, r.victims, r.phase, n))
			}
		}
		if n := calm["a"]["web-0"] + calm["b"]["web-0"]; n > 0 {
			bad = append(bad, fmt.Sprintf("before any kill: %d", n))
		}
		if n := after["a"]["web-0"] + after["b"]["web-0"]; n > 0 {
			bad = append(bad, fmt.Sprintf("after the last restart: %d", n))
		}
		t.Errorf("%d new connections reached the draining pod web-0 (want 0): %s", total["web-0"], strings.Join(bad, "; "))
	}
	if len(fails) > 0 {
		t.Errorf("failed connections (want none: steering goes to ready backends): %s", fmtTally(fails))
	}
}

func containsAddrPort(list []netip.AddrPort, a netip.AddrPort) bool {
	for _, x := range list {
		if x == a {
			return true
		}
	}
	return false
}
