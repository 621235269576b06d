package reconcile

import (
	"iter"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/internal/backendset"
)

const ttl = 10 * time.Minute

// fakeDesired is a model reduced to what the reconciler reads: per
// service-port its frontends' keys and backends, per key its drain.
type fakeDesired struct {
	frontends map[bpf.ServicePortID][]bpf.EndpointKey
	backends  map[bpf.ServicePortID][]netip.AddrPort
	drains    map[bpf.EndpointKey]bpf.Drain
	touchedSP map[bpf.ServicePortID]struct{}
	touchedK  map[bpf.EndpointKey]struct{}
}

func newFakeDesired() *fakeDesired {
	return &fakeDesired{frontends: map[bpf.ServicePortID][]bpf.EndpointKey{}, backends: map[bpf.ServicePortID][]netip.AddrPort{},
		drains: map[bpf.EndpointKey]bpf.Drain{}, touchedSP: map[bpf.ServicePortID]struct{}{}, touchedK: map[bpf.EndpointKey]struct{}{}}
}

func (d *fakeDesired) ServicePort(id bpf.ServicePortID, now time.Time) ([]bpf.Frontend, *bpf.Backends, backendset.Set) {
	be, ok := d.backends[id]
	if !ok {
		return nil, nil, ""
	}
	var fes []bpf.Frontend
	for _, k := range d.frontends[id] {
		fes = append(fes, bpf.Frontend{Key: k, Service: id, Expires: now.Add(ttl)})
	}
	return fes, &bpf.Backends{Service: id, Expires: now.Add(ttl)}, backendset.Pack(be)
}

func (d *fakeDesired) Drain(k bpf.EndpointKey, now time.Time) (bpf.Drain, bool) {
	dr, ok := d.drains[k]
	dr.Expires = now.Add(ttl)
	return dr, ok
}

func (d *fakeDesired) ServicePorts() iter.Seq[bpf.ServicePortID] { return maps.Keys(d.backends) }
func (d *fakeDesired) HasServicePort(id bpf.ServicePortID) bool {
	_, ok := d.backends[id]
	return ok
}
func (d *fakeDesired) Keys() iter.Seq[bpf.EndpointKey] { return maps.Keys(d.drains) }
func (d *fakeDesired) HasKey(k bpf.EndpointKey) bool {
	_, ok := d.drains[k]
	return ok
}
func (d *fakeDesired) Touched() (map[bpf.ServicePortID]struct{}, map[bpf.EndpointKey]struct{}) {
	return d.touchedSP, d.touchedK
}

func key(s string) bpf.EndpointKey {
	ap := netip.MustParseAddrPort(s)
	return bpf.EndpointKey{Addr: ap.Addr(), Port: ap.Port(), Proto: bpf.TCP}
}

// draining is a Service (id 1, VIP 10.96.0.1:80) whose endpoint
// 10.0.0.1:8080 drains, rewritten to 10.0.0.2:8080.
func draining() *fakeDesired {
	d := newFakeDesired()
	d.frontends[1] = []bpf.EndpointKey{key("10.96.0.1:80")}
	d.backends[1] = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:8080")}
	d.drains[key("10.0.0.1:8080")] = bpf.Drain{Key: key("10.0.0.1:8080"), Service: 1, Policy: bpf.PolicyRewrite}
	d.touchedSP[1] = struct{}{}
	d.touchedK[key("10.0.0.1:8080")] = struct{}{}
	return d
}

func kinds(ops []datapathtest.Op) string {
	var out []string
	for _, o := range ops {
		out = append(out, o.Kind)
	}
	return strings.Join(out, ",")
}

// TestApplyOrderAndMinimalDiff: a pass writes the backends before the
// entries naming them and deletes them after; a pass with nothing touched
// writes nothing; the touched sets are cleared.
func TestApplyOrderAndMinimalDiff(t *testing.T) {
	dp := datapathtest.New()
	var drains []string
	r := New(dp, ttl, Hooks{OnDrain: func(k bpf.EndpointKey, present bool) {
		drains = append(drains, k.String()+map[bool]string{true: "+", false: "-"}[present])
	}})
	d := draining()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	dp.StartLog()
	if res := r.Apply(d, now, false, false); res.Ops != 3 || res.Errors != 0 {
		t.Fatalf("first pass %+v, want 3 ops", res)
	}
	if got, want := kinds(dp.StopLog()), "set-backends,upsert-frontend,upsert-drain"; got != want {
		t.Fatalf("first pass wrote %s, want %s", got, want)
	}
	if len(d.touchedSP)+len(d.touchedK) != 0 {
		t.Fatalf("touched sets left: %v %v", d.touchedSP, d.touchedK)
	}
	if res := r.Apply(d, now.Add(time.Second), false, false); res.Ops != 0 {
		t.Fatalf("a pass with nothing touched wrote %d ops", res.Ops)
	}
	// The drain ends and the Service goes: entries first, backends last.
	delete(d.drains, key("10.0.0.1:8080"))
	delete(d.backends, 1)
	delete(d.frontends, 1)
	d.touchedSP[1], d.touchedK[key("10.0.0.1:8080")] = struct{}{}, struct{}{}
	dp.StartLog()
	r.Apply(d, now.Add(2*time.Second), false, false)
	if got, want := kinds(dp.StopLog()), "delete-frontend,delete-drain,delete-backends"; got != want {
		t.Fatalf("removal wrote %s, want %s", got, want)
	}
	if len(dp.Frontends)+len(dp.Backends)+len(dp.Drains) != 0 {
		t.Fatalf("left in the datapath: %v %v %v", dp.Frontends, dp.Backends, dp.Drains)
	}
	if want := []string{key("10.0.0.1:8080").String() + "+", key("10.0.0.1:8080").String() + "-"}; !slices.Equal(drains, want) {
		t.Errorf("OnDrain told %v, want %v", drains, want)
	}
}

// TestFailedWriteRetried: a failed write is reported, leaves the applied
// state as it was and is retried by the next pass, touched or not.
func TestFailedWriteRetried(t *testing.T) {
	dp := datapathtest.New()
	var failed []string
	r := New(dp, ttl, Hooks{OnError: func(what string, err error) { failed = append(failed, what) }})
	d := draining()
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	dp.FailNext = 1 // the backends
	res := r.Apply(d, now, false, false)
	if res.Errors != 1 || len(failed) != 1 || !r.Pending() {
		t.Fatalf("pass %+v, errors told %v, pending %v", res, failed, r.Pending())
	}
	r.Apply(d, now.Add(time.Second), false, false)
	if r.Pending() || len(dp.Backends) != 1 || len(dp.Frontends) != 1 || len(dp.Drains) != 1 {
		t.Fatalf("after the retry: pending %v, datapath %v %v %v", r.Pending(), dp.Backends, dp.Frontends, dp.Drains)
	}
}

// TestFullPassRemovesLeftovers: entries adopted from a previous process
// that the model does not want are deleted by the first (full) pass, and
// wanted ones already in place are not rewritten.
func TestFullPassRemovesLeftovers(t *testing.T) {
	dp := datapathtest.New()
	r := New(dp, ttl, Hooks{})
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	d := draining()
	clear(d.touchedSP)
	clear(d.touchedK)
	stale := key("10.0.0.9:8080")
	for _, err := range []error{
		dp.SetBackends(bpf.Backends{Service: 1, Backends: d.backends[1], Expires: now.Add(ttl)}),
		dp.UpsertFrontend(bpf.Frontend{Key: key("10.96.0.1:80"), Service: 1, Expires: now.Add(ttl)}),
		dp.UpsertDrain(bpf.Drain{Key: stale, Service: 1, Policy: bpf.PolicyRewrite, Expires: now.Add(ttl)}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	dump, err := dp.Dump()
	if err != nil {
		t.Fatal(err)
	}
	r.Adopt(dump)
	dp.StartLog()
	r.Apply(d, now, true, false)
	if got, want := kinds(dp.StopLog()), "upsert-drain,delete-drain"; got != want {
		t.Fatalf("the full pass wrote %s, want %s", got, want)
	}
	if _, ok := dp.Drains[stale]; ok {
		t.Error("the leftover drain entry is still there")
	}
}

// TestRefreshRoundInBatches: a refresh round visits every target, a batch
// per RefreshStep, and rewrites the entries due.
func TestRefreshRoundInBatches(t *testing.T) {
	dp := datapathtest.New()
	r := New(dp, ttl, Hooks{})
	d := newFakeDesired()
	for i := range 3 * RefreshBatch {
		id := bpf.ServicePortID(i + 1)
		d.backends[id] = []netip.AddrPort{netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(i), 1}), 80)}
	}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	r.Apply(d, now, true, false)
	now = now.Add(ttl/2 + time.Second) // every entry due
	r.StartRefresh(d, now)
	if r.refreshLeft() != 3*RefreshBatch {
		t.Fatalf("round of %d targets, want %d", r.refreshLeft(), 3*RefreshBatch)
	}
	total := 0
	for i := 0; r.Refreshing(); i++ {
		if i > 3 {
			t.Fatalf("the round is not over after %d batches: %d left", i, r.refreshLeft())
		}
		res := r.Apply(d, now, false, true)
		if res.Ops > RefreshBatch {
			t.Fatalf("a batch wrote %d ops, more than %d", res.Ops, RefreshBatch)
		}
		total += res.Ops
		now = now.Add(RefreshStep)
	}
	if total != 3*RefreshBatch {
		t.Errorf("the round rewrote %d backend sets, want %d", total, 3*RefreshBatch)
	}
}

// refreshLeft is how many targets the refresh round under way has left.
func (r *Reconciler) refreshLeft() int { return len(r.refreshKeys) + len(r.refreshServicePorts) }
