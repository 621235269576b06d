package gonepeers

import (
	"errors"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/k8s"
)

// fakeView is a model as the gone peers read it, set by the test. As the
// model's, its generation changes with the pod drains and their noted
// Services (the test bumps it).
type fakeView struct {
	gen       uint64
	drains    map[types.UID]Drain
	listing   map[types.UID][]string // ServicesListing
	listings  map[types.UID][]string
	vanished  map[types.UID][]string
	lingering map[types.UID]bool
	claimedBy map[netip.Addr]types.UID // the pod that claims each IP
}

func newFakeView() *fakeView {
	return &fakeView{gen: 1, drains: map[types.UID]Drain{}, listing: map[types.UID][]string{},
		listings: map[types.UID][]string{}, vanished: map[types.UID][]string{},
		lingering: map[types.UID]bool{}, claimedBy: map[netip.Addr]types.UID{}}
}

func (v *fakeView) NotesGen() uint64 { return v.gen }
func (v *fakeView) PodDrains() iter.Seq2[types.UID, Drain] {
	return func(yield func(types.UID, Drain) bool) {
		for uid, d := range v.drains {
			if !yield(uid, d) {
				return
			}
		}
	}
}
func (v *fakeView) PodDrain(uid types.UID) (Drain, bool) {
	d, ok := v.drains[uid]
	return d, ok
}
func (v *fakeView) ServicesListing(uid types.UID, _ string) []string {
	return slices.Sorted(slices.Values(append(slices.Clone(v.listing[uid]), v.listings[uid]...)))
}
func (v *fakeView) Listings(uid types.UID) iter.Seq[string] { return slices.Values(v.listings[uid]) }
func (v *fakeView) VanishedServices(uid types.UID) []string { return v.vanished[uid] }
func (v *fakeView) Lingering(uid types.UID) bool            { return v.lingering[uid] }
func (v *fakeView) ClaimedByOther(ip netip.Addr, uid types.UID) bool {
	by, ok := v.claimedBy[ip]
	return ok && by != uid
}

// fakeState holds the Services by namespace/name; no pod is local.
type fakeState map[string]*k8s.Service

func (s fakeState) Service(key string) *k8s.Service { return s[key] }
func (s fakeState) LocalPods() []*k8s.Pod           { return nil }

const entryTTL = 5 * time.Minute

// testConfig is a Config over sd and st, without conntrack.
func testConfig(sd *datapathtest.Sockets, st fakeState) Config {
	return Config{Sockets: sd, State: st, EntryTTL: entryTTL,
		DatapathErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "datapath_errors_total"}, []string{"kind"}),
		CTErrors:       prometheus.NewCounter(prometheus.CounterOpts{Name: "conntrack_errors_total"}),
		Log:            slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// newTestPeers is Peers over sd and st, without conntrack.
func newTestPeers(sd *datapathtest.Sockets, st fakeState) *Peers { return New(testConfig(sd, st)) }

// service is a Service with the draind.io/end-dead-connections value
// endDead ("": none).
func service(endDead string) *k8s.Service { return &k8s.Service{EndDeadConnections: endDead} }

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestTouchedMatchWhole: the gone peers a pass computes again for what
// it is told changed (a claim of a gone pod's IP, a Service noted for a
// gone pod) are what the whole computation finds. After each random
// change a pass lists what it touched; a pass that computes the whole set
// must then change no entry. Two gone pods share an IP (c's and e's):
// both want its entry, with different ends (their drains' ends differ),
// c's only while api does not opt out, and only c is noted for api. One
// gone pod is dual-stack; the clock moves (entries are refreshed, drains
// renewed) and some writes fail.
func TestTouchedMatchWhole(t *testing.T) {
	for _, seed := range []uint64{18, 2026, 7} {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { touchedMatchWhole(t, seed) })
	}
}

// touchedWorld is TestTouchedMatchWhole's state: the view, the Services,
// the socket maps and the clock.
type touchedWorld struct {
	v      *fakeView
	st     fakeState
	sd     *datapathtest.Sockets
	g      *Peers
	now    time.Time
	leases map[types.UID]time.Duration
	optOut map[string]bool
}

func newTouchedWorld() *touchedWorld {
	w := &touchedWorld{v: newFakeView(), st: fakeState{}, sd: datapathtest.NewSockets(time.Time{}), now: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC),
		leases: map[types.UID]time.Duration{"a": 10 * time.Minute, "b": 10 * time.Minute, "c": 50 * time.Second, "d": 10 * time.Minute, "e": 10 * time.Minute},
		optOut: map[string]bool{}}
	w.g = newTestPeers(w.sd, w.st)
	w.st["default/web"], w.st["default/api"] = service("true"), service("true")
	ips := map[types.UID][]netip.Addr{"a": addrs("10.0.0.1", "fd00::1"), "b": addrs("10.0.0.2"), "c": addrs("10.0.0.3"),
		"d": addrs("10.0.0.4"), "e": addrs("10.0.0.3")}
	for uid, ip := range ips {
		w.v.drains[uid] = Drain{Namespace: "default", IPs: ip, Gone: true}
	}
	w.v.listing["a"], w.v.listing["b"], w.v.listing["c"] = []string{"default/web"}, []string{"default/web"}, []string{"default/api"}
	w.renew()
	return w
}

// renew renews every drain, as their Leases are.
func (w *touchedWorld) renew() {
	for uid, d := range w.v.drains {
		d.Expires = w.now.Add(w.leases[uid])
		w.v.drains[uid] = d
	}
	w.v.gen++
}

// step makes one random change and returns what changed and what it did.
func (w *touchedWorld) step(rng *rand.Rand, ips []netip.Addr) (dirtyIPs map[netip.Addr]struct{}, dirtySvcs map[string]time.Time, did string) {
	dirtyIPs, dirtySvcs = map[netip.Addr]struct{}{}, map[string]time.Time{}
	toggle := func() string {
		name := []string{"web", "api"}[rng.IntN(2)]
		w.optOut[name] = !w.optOut[name]
		v := map[bool]string{true: "false", false: "true"}[w.optOut[name]]
		w.st["default/"+name] = service(v)
		dirtySvcs["default/"+name] = w.now
		return name + " end-dead-connections=" + v
	}
	switch rng.IntN(7) {
	case 0, 1: // another pod claims a gone pod's IP, or releases it
		ip := ips[rng.IntN(len(ips))]
		if _, ok := w.v.claimedBy[ip]; ok {
			delete(w.v.claimedBy, ip)
		} else {
			w.v.claimedBy[ip] = "z"
		}
		dirtyIPs[ip] = struct{}{}
		return dirtyIPs, dirtySvcs, "claim of " + ip.String()
	case 2:
		return dirtyIPs, dirtySvcs, toggle()
	case 3: // a Service opts out or in, and the write fails
		w.sd.SetUpsertErr(fmt.Errorf("injected: %w", bpf.ErrMapFull))
		return dirtyIPs, dirtySvcs, "failing: " + toggle()
	case 4, 5: // time passes: refreshes come due
		d := time.Duration(rng.IntN(40)) * time.Second
		w.now = w.now.Add(d)
		return dirtyIPs, dirtySvcs, "clock +" + d.String()
	}
	return dirtyIPs, dirtySvcs, "nothing"
}

func touchedMatchWhole(t *testing.T, seed uint64) {
	w := newTouchedWorld()
	w.g.Pass(w.v, w.now, nil, nil)
	if got := w.sd.PeerMap(); len(got) != 5 {
		t.Fatalf("gone peers %v, want the 5 IPs", got)
	}
	ips := addrs("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "fd00::1")
	rng := rand.New(rand.NewPCG(seed, 2026))
	renewed, touchedPasses := w.now, 0
	for step := range 250 {
		dirtyIPs, dirtySvcs, did := w.step(rng, ips)
		if w.now.Sub(renewed) > 30*time.Second {
			w.renew()
			renewed = w.now
		}
		if w.g.fresh(w.v, w.now) {
			touchedPasses++
		}
		w.g.Pass(w.v, w.now, dirtyIPs, dirtySvcs)
		if w.sd.UpsertErr() != nil {
			w.sd.SetUpsertErr(nil)
			w.g.Pass(w.v, w.now, nil, nil)
		}
		got := w.sd.PeerMap()
		w.g.wantYet = false // the next pass computes the whole set
		w.g.Pass(w.v, w.now, nil, nil)
		if want := w.sd.PeerMap(); !maps.Equal(got, want) {
			t.Fatalf("step %d (%s): the pass listed %v, the whole set is %v", step, did, got, want)
		}
	}
	if touchedPasses < 50 {
		t.Errorf("%d of 250 passes computed only what they touched: the test misses its point", touchedPasses)
	}
	if n := testutil.ToFloat64(w.g.cfg.DatapathErrors.WithLabelValues("map_full")); n == 0 {
		t.Error("failed writes of a full map are not counted as map_full")
	}
}

// TestManyTouched: a change that touches more gone pods than touched
// keeps track of (a Service listing all of them opts out, then in) is
// written by computing the whole set.
func TestManyTouched(t *testing.T) {
	v, st, sd := newFakeView(), fakeState{"default/web": service("")}, datapathtest.NewSockets(time.Time{})
	g := newTestPeers(sd, st)
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	n := maxTouched + 6
	for i := range n {
		uid := types.UID(fmt.Sprint("p", i))
		v.drains[uid] = Drain{Namespace: "default", IPs: addrs(fmt.Sprintf("10.0.1.%d", i+1)), Gone: true}
		v.listing[uid] = []string{"default/web"}
	}
	g.Pass(v, now, nil, nil)
	if got := len(sd.PeerMap()); got != n {
		t.Fatalf("%d gone peers listed, want %d", got, n)
	}
	for _, val := range []string{"false", "true"} {
		st["default/web"] = service(val)
		dirty := map[string]time.Time{"default/web": now}
		if _, _, ok := g.touched(v, nil, dirty); ok {
			t.Fatalf("touched keeps track of %d pods (at most %d)", n, maxTouched)
		}
		g.Pass(v, now, nil, dirty)
		if got, want := len(sd.PeerMap()), map[string]int{"false": 0, "true": n}[val]; got != want {
			t.Errorf("%s=%s: %d gone peers listed, want %d", k8s.AnnotationEndDeadConnections, val, got, want)
		}
	}
}

// TestServicesKeptWhileLingering: the Services noted for a pod whose
// drain ended are kept while the view says it lingers (so that its
// opt-out still holds if its gone drain comes back), and forgotten when
// the linger ends, with nothing else changing; a pod no Service listed
// leaves no record, draining or not.
func TestServicesKeptWhileLingering(t *testing.T) {
	v, sd := newFakeView(), datapathtest.NewSockets(time.Time{})
	g := newTestPeers(sd, fakeState{"default/opt": service("false")})
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	v.drains["a"] = Drain{Namespace: "default", IPs: addrs("10.0.0.1"), Expires: now.Add(time.Minute)}
	v.listings["a"] = []string{"default/opt"}
	v.drains["j"] = Drain{Namespace: "default", IPs: addrs("10.0.0.7"), Expires: now.Add(time.Minute)}
	g.Pass(v, now, nil, nil)
	if _, ok := g.services["j"]; ok {
		t.Error("a pod no Service listed has a record of its Services")
	}
	delete(v.drains, "a")
	delete(v.drains, "j")
	delete(v.listings, "a")
	v.lingering["a"] = true
	v.gen++
	g.Pass(v, now, nil, nil)
	if _, ok := g.services["a"]; !ok || g.kept != 1 {
		t.Fatalf("the Services of a pod that lingers are forgotten at once (kept %d)", g.kept)
	}
	// Its gone drain comes back during the linger: its Service opts out.
	v.drains["a"] = Drain{Namespace: "default", IPs: addrs("10.0.0.1"), Expires: now.Add(time.Minute), Gone: true}
	v.gen++
	g.Pass(v, now, nil, nil)
	if got := sd.PeerMap(); len(got) != 0 {
		t.Errorf("a pod whose Service opted out while it drained is listed gone: %v", got)
	}
	delete(v.drains, "a")
	v.gen++
	g.Pass(v, now, nil, nil)
	v.lingering["a"] = false
	g.Pass(v, now.Add(time.Second), nil, nil)
	if got, ok := g.services["a"]; ok || len(g.services) != 0 {
		t.Errorf("Services kept after the linger ended: %v (all: %v)", got, g.services)
	}
}

// TestVanishedServiceOptsOut: a vanished pod's Service (the view's
// VanishedServices) decides for it once it is gone; an IP another pod
// claims is never listed; an entry lasts one TTL, or until its pod
// drain's end if that comes first.
func TestVanishedServiceOptsOut(t *testing.T) {
	v, sd := newFakeView(), datapathtest.NewSockets(time.Time{})
	g := newTestPeers(sd, fakeState{"default/opt": service("False"), "default/web": service("true")})
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	v.drains["x"] = Drain{Namespace: "default", IPs: addrs("10.0.0.5"), Gone: true}
	v.vanished["x"] = []string{"default/opt"}
	v.drains["y"] = Drain{Namespace: "default", IPs: addrs("10.0.0.6", "10.0.0.8"), Gone: true}
	v.vanished["y"] = []string{"default/web"}
	v.claimedBy[netip.MustParseAddr("10.0.0.8")] = "z"
	v.drains["w"] = Drain{Namespace: "default", IPs: addrs("10.0.0.9"), Expires: now.Add(time.Minute), Gone: true}
	g.Pass(v, now, nil, nil)
	got := slices.SortedFunc(maps.Keys(sd.PeerMap()), netip.Addr.Compare)
	if want := addrs("10.0.0.6", "10.0.0.9"); !slices.Equal(got, want) {
		t.Errorf("gone peers %v, want %v", got, want)
	}
	p := sd.PeerMap()[netip.MustParseAddr("10.0.0.6")]
	if !p.GoneAt.Equal(now) || !p.Expires.Equal(now.Add(entryTTL)) {
		t.Errorf("entry %+v: gone at the first pass that saw it, for one TTL", p)
	}
	if p := sd.PeerMap()[netip.MustParseAddr("10.0.0.9")]; !p.Expires.Equal(now.Add(time.Minute)) {
		t.Errorf("entry %+v: want it to end with its pod drain, at %v", p, now.Add(time.Minute))
	}
}

// TestAdoptKeepsGoneAt: entries a previous draind left are adopted with
// their instant (a restart does not move when a pod went), their flows
// deleted, and an adopted peer no pod drain wants is unlisted.
func TestAdoptKeepsGoneAt(t *testing.T) {
	v, sd := newFakeView(), datapathtest.NewSockets(time.Time{})
	g := newTestPeers(sd, fakeState{})
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	before := now.Add(-time.Minute)
	for _, a := range addrs("10.0.0.1", "10.0.0.2") {
		must(t, sd.UpsertGonePeer(bpf.GonePeer{Addr: a, GoneAt: before, Expires: now.Add(time.Minute)}))
	}
	local, remote := netip.MustParseAddrPort("10.0.1.9:1234"), netip.MustParseAddrPort("10.96.0.10:80")
	must(t, sd.UpsertGoneFlow(bpf.GoneFlow{Local: local, Remote: remote}))
	if err := g.Adopt(); err != nil {
		t.Fatal(err)
	}
	if fl := sd.Flows(); len(fl) != 0 {
		t.Errorf("adopted flows kept: %v", fl)
	}
	v.drains["a"] = Drain{Namespace: "default", IPs: addrs("10.0.0.1"), Gone: true}
	g.Pass(v, now, nil, nil)
	got := sd.PeerMap()
	if p, ok := got[netip.MustParseAddr("10.0.0.1")]; !ok || !p.GoneAt.Equal(before) || !p.Expires.Equal(now.Add(entryTTL)) {
		t.Errorf("adopted peer %+v (listed %v): want gone at %v, rewritten to end at %v", p, ok, before, now.Add(entryTTL))
	}
	if _, ok := got[netip.MustParseAddr("10.0.0.2")]; ok {
		t.Error("an adopted peer no pod drain wants is kept")
	}
}

func TestErrorKind(t *testing.T) {
	if k := errorKind(fmt.Errorf("upsert: %w", bpf.ErrMapFull)); k != "map_full" {
		t.Errorf("a full map's error is %q", k)
	}
	if k := errorKind(errors.New("EPERM")); k != "other" {
		t.Errorf("another error is %q", k)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
