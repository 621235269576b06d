package daemon

import (
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/k8s"
)

// Event intake: informer handlers record what changed (tracker) and ask
// for a pass; they compute and write nothing themselves. The slice handler
// then runs that pass itself when no other is running (passNow).

// tracker records what changed since the last pass; informer handlers only
// write here and return.
type tracker struct {
	mu       sync.Mutex
	services map[string]time.Time // dirty Service -> earliest event
	ips      map[netip.Addr]struct{}
	pods     time.Time // zero: no change
	leases   time.Time
	// leasesGone are the pods whose drain Lease was deleted.
	leasesGone []types.UID
	// triggers is the earliest change time (the slices' trigger-time
	// annotation) per dirty Service, leaseTrigger the earliest acquire
	// time of a new drain Lease: where network-programming latency starts.
	triggers     map[string]time.Time
	leaseTrigger time.Time
	// spare is the dirty set the last pass took: the pass has ended when
	// the next one takes, so take hands its maps out again (a thousand
	// updates a second would otherwise grow two new maps per pass).
	spare dirtySet
}

func (t *tracker) init() {
	t.services = map[string]time.Time{}
	t.ips = map[netip.Addr]struct{}{}
	t.triggers = map[string]time.Time{}
}

// reuse returns m emptied, or a new map if there is none or m is large:
// clearing a map costs its size, and one pass (the first) may have marked
// the whole cluster.
func reuse[K comparable, V any](m map[K]V) map[K]V {
	if m == nil || len(m) > 1024 {
		return map[K]V{}
	}
	clear(m)
	return m
}

type dirtySet struct {
	services   map[string]time.Time
	ips        map[netip.Addr]struct{}
	pods       time.Time
	leases     time.Time
	leasesGone []types.UID
	// triggers and leaseTrigger: see tracker.
	triggers     map[string]time.Time
	leaseTrigger time.Time
}

// take returns what changed since the last take and starts recording
// afresh. What it returns is valid until the next take (only sync takes,
// under modelMu, and keeps none of it).
func (t *tracker) take() dirtySet {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := dirtySet{services: t.services, ips: t.ips, pods: t.pods, leases: t.leases, leasesGone: t.leasesGone,
		triggers: t.triggers, leaseTrigger: t.leaseTrigger}
	t.services, t.ips, t.triggers = reuse(t.spare.services), reuse(t.spare.ips), reuse(t.spare.triggers)
	t.spare = out
	t.pods, t.leases, t.leasesGone, t.leaseTrigger = time.Time{}, time.Time{}, nil, time.Time{}
	return out
}

func (t *tracker) markService(key string, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.services[key]; !ok || at.Before(old) {
		t.services[key] = at
	}
}

func (t *tracker) markIPs(ips []netip.Addr) {
	if len(ips) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, ip := range ips {
		t.ips[ip] = struct{}{}
	}
}

func earliest(cur *time.Time, at time.Time) {
	if cur.IsZero() || at.Before(*cur) {
		*cur = at
	}
}

func (t *tracker) markPods(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	earliest(&t.pods, at)
}

func (t *tracker) markLeases(at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	earliest(&t.leases, at)
}

// markTrigger notes a Service's change time (zero: none known).
func (t *tracker) markTrigger(key string, at time.Time) {
	if at.IsZero() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.triggers[key]; !ok || at.Before(old) {
		t.triggers[key] = at
	}
}

// markLeaseTrigger notes a new drain Lease's acquire time.
func (t *tracker) markLeaseTrigger(at time.Time) {
	if at.IsZero() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	earliest(&t.leaseTrigger, at)
}

func (t *tracker) markLeaseGone(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.leasesGone = append(t.leasesGone, uid)
}

func sameVersion(a, b any) bool {
	type rv interface{ GetResourceVersion() string }
	x, ok1 := a.(rv)
	y, ok2 := b.(rv)
	return ok1 && ok2 && x.GetResourceVersion() != "" && x.GetResourceVersion() == y.GetResourceVersion()
}

// onChange calls fn with the old and new object of every add (old nil),
// real update and delete (new nil). Resyncs, which repeat a
// resourceVersion, are dropped.
func onChange(inf interface {
	AddEventHandler(cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error)
}, fn func(old, new any, received time.Time)) (cache.ResourceEventHandlerRegistration, error) {
	return inf.AddEventHandler(eventFuncs(fn))
}

// eventFuncs adapts fn to client-go's handler: old is nil for an add, new
// nil for a deletion, and received is when the event's object reached
// draind (zero if unknown).
func eventFuncs(fn func(old, new any, received time.Time)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { fn(nil, obj, receiptOf(obj)) },
		UpdateFunc: func(o, n any) {
			if !sameVersion(o, n) {
				fn(o, n, receiptOf(n))
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				// A deletion the informer inferred from a relist: its
				// object is the last one received, long before.
				fn(t.Obj, nil, time.Time{})
				return
			}
			fn(obj, nil, receiptOf(obj)) // the deleted object, as received
		},
	}
}

// receiptOf is when obj reached draind (its informer stamped it, see
// k8s.Receipt); zero if it was not stamped.
func receiptOf(obj any) time.Time {
	if r, ok := obj.(interface{ Received() time.Time }); ok {
		return r.Received()
	}
	return time.Time{}
}

// registerHandlers registers the event handlers on the informers. A
// handler that cannot be registered (a stopped informer) would leave the
// daemon blind to its kind: the error is kept, and Run returns it.
func (d *Daemon) registerHandlers() error {
	kinds := []struct {
		name string
		inf  interface {
			AddEventHandler(cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error)
		}
		fn func(old, new any, received time.Time)
	}{
		{"EndpointSlices", d.inf.Slices, d.sliceEvent},
		{"Services", d.inf.Services, d.serviceEvent},
		{"Leases", d.inf.Leases, d.leaseEvent},
		{"Pods", d.inf.Pods, d.podEvent},
	}
	for _, k := range kinds {
		reg, err := onChange(k.inf, k.fn)
		if err != nil {
			return fmt.Errorf("registering the %s handler: %w", k.name, err)
		}
		d.handlers = append(d.handlers, reg)
	}
	return nil
}

// handlersSynced reports whether every handler has seen its informer's
// initial list: only then does the model know the whole cluster, and only
// then may a pass delete what it does not know.
func (d *Daemon) handlersSynced() bool {
	for _, h := range d.handlers {
		if h == nil || !h.HasSynced() {
			return false
		}
	}
	return true
}

// sliceEvent: the slice's Service must be recomputed, and the IPs whose
// ready listings changed hands re-merged.
func (d *Daemon) sliceEvent(oldObj, newObj any, received time.Time) {
	defer d.events.slices.Add(1)
	old, _ := oldObj.(*k8s.Slice)
	cur, _ := newObj.(*k8s.Slice)
	now := d.clock.Now()
	at := receivedAt(received, now)
	if d.onIntake != nil && !received.IsZero() {
		d.onIntake(now.Sub(at))
	}
	trustedOld, trustedCur := d.trustedPair(old, cur)
	if old != nil {
		d.vanished.observe(trustedOld, cur, now) // only trusted slices identify a pod
	}
	if cur != nil {
		d.tracker.markIPs(d.claims.SetSlice(cur.Namespace+"/"+cur.Name, trustedCur))
	} else if old != nil {
		d.tracker.markIPs(d.claims.SetSlice(old.Namespace+"/"+old.Name, nil))
	}
	for _, s := range []*k8s.Slice{old, cur} {
		if s != nil && s.Service != "" {
			d.tracker.markService(s.Namespace+"/"+s.Service, at)
		}
	}
	if cur != nil && cur.Service != "" {
		if trig := cur.TriggerTime(); old == nil || !trig.Equal(old.TriggerTime()) {
			d.tracker.markTrigger(cur.Namespace+"/"+cur.Service, trig)
		}
	}
	if !d.passNow() {
		d.runner.Run()
	}
}

// serviceEvent: the Service must be recomputed; if whether it has a
// selector changed, so did the trust in its slices.
func (d *Daemon) serviceEvent(oldObj, newObj any, received time.Time) {
	defer d.events.services.Add(1)
	old, _ := oldObj.(*k8s.Service)
	cur, _ := newObj.(*k8s.Service)
	s := cur
	if s == nil {
		s = old
	}
	if s == nil {
		return
	}
	at := receivedAt(received, d.clock.Now())
	key := s.Namespace + "/" + s.Name
	// Which of its slices are trusted depends on its selector and its UID
	// (a Service deleted and created again under the same name).
	if trustOf(old) != trustOf(cur) {
		for _, sl := range d.state.SlicesOf(key) {
			d.tracker.markIPs(d.claims.SetSlice(sl.Namespace+"/"+sl.Name, d.trusted(sl)))
		}
	}
	d.tracker.markService(key, at)
	d.runner.Run()
}

// trustOf is what the trust of a Service's slices depends on ("" for a
// Service without a selector, or none).
func trustOf(s *k8s.Service) types.UID {
	if s == nil || !s.HasSelector {
		return ""
	}
	return s.UID
}

// receivedAt is the instant event-to-datapath latencies count from: when
// the event's object reached draind (see onChange), as an offset back from
// now, so that it keeps now's monotonic clock reading (a receipt stamp is
// wall time: a clock step after the handler cannot skew the latency); now
// itself if the receipt is unknown or not before now (a clock step).
func receivedAt(received, now time.Time) time.Time {
	if received.IsZero() || !received.Before(now) {
		return now
	}
	return now.Add(-now.Sub(received))
}

// trusted returns s if it is the cluster's own record of its Service's
// pods (k8s.Slice.Trusted), else nil (s nil too).
func (d *Daemon) trusted(s *k8s.Slice) *k8s.Slice {
	if s == nil || s.Service == "" || !s.Trusted(d.state.Service(s.Namespace+"/"+s.Service)) {
		return nil
	}
	return s
}

// trustedPair is trusted of a slice's old and current state (either may be
// nil), looking their Service up once when they name the same one (the
// usual update).
func (d *Daemon) trustedPair(old, cur *k8s.Slice) (*k8s.Slice, *k8s.Slice) {
	if old == nil || cur == nil || old.Service == "" || old.Service != cur.Service || old.Namespace != cur.Namespace {
		return d.trusted(old), d.trusted(cur)
	}
	svc := d.state.Service(cur.Namespace + "/" + cur.Service)
	keep := func(s *k8s.Slice) *k8s.Slice {
		if s.Trusted(svc) {
			return s
		}
		return nil
	}
	return keep(old), keep(cur)
}

// leaseEvent: pod drains changed. A deleted Lease also ends its pod's
// lingering entries (see model.endLingersOf).
func (d *Daemon) leaseEvent(oldObj, newObj any, received time.Time) {
	defer d.events.leases.Add(1)
	d.leases.update(d.leaseSnapshot)
	if l, ok := oldObj.(*k8s.DrainLease); ok && newObj == nil && !l.Claim {
		d.tracker.markLeaseGone(l.PodUID)
	}
	if l, ok := newObj.(*k8s.DrainLease); ok && !l.Claim {
		if oldObj == nil {
			d.tracker.markLeaseTrigger(l.Acquired) // a drain started
		}
		if l.Holder == d.cfg.Node {
			d.hosted.SawLease(l.PodUID)
		}
	}
	d.tracker.markLeases(receivedAt(received, d.clock.Now()))
	d.runner.Run()
	d.wakeHosted()
}

// podEvent: this node's pods changed: local claims, and maybe a deletion.
func (d *Daemon) podEvent(_, _ any, received time.Time) {
	defer d.events.pods.Add(1)
	var pods []*k8s.Pod
	d.local.update(func() *hosted.LocalPods { pods = d.state.LocalPods(); return hosted.NewLocalPods(pods) })
	d.tracker.markIPs(d.claims.SetLocalPods(pods))
	d.tracker.markPods(receivedAt(received, d.clock.Now()))
	d.runner.Run()
	d.wakeHosted()
}

// localPodsNow is this node's pods as the last pod event read them
// (hosted.LocalPods).
func (d *Daemon) localPodsNow() *hosted.LocalPods {
	return d.local.get(func() *hosted.LocalPods { return hosted.NewLocalPods(d.state.LocalPods()) })
}

// drainLeases is the cached drain Leases, the claim Leases
// (claimleases.go) and the names of both: a snapshot a Lease event takes,
// read by every pass (as hosted.LocalPods).
type drainLeases struct {
	list   []*k8s.DrainLease
	claims []*k8s.DrainLease
	names  map[string]bool
}

func newDrainLeases(leases, claims []*k8s.DrainLease) *drainLeases {
	dl := &drainLeases{list: leases, claims: claims, names: make(map[string]bool, len(leases)+len(claims))}
	for _, l := range leases {
		dl.names[l.Name] = true
	}
	for _, l := range claims {
		dl.names[l.Name] = true
	}
	return dl
}

func (d *Daemon) leaseSnapshot() *drainLeases {
	return newDrainLeases(d.state.DrainLeases(), claimLeasesOf(d.state))
}

func (d *Daemon) drainLeasesNow() *drainLeases {
	return d.leases.get(d.leaseSnapshot)
}

// snapshot holds what an informer's store held when its handler last read
// it (update). Before the handler's first call (an empty store has none)
// get reads the store itself (build) and keeps that. Both read the store
// under mu: a snapshot is never older than the one it replaced, so a
// reader that compares two it got in turn (the hosted drains' vanished
// pods) never takes a pod new in the store for one that left.
type snapshot[T any] struct {
	p  atomic.Pointer[T]
	mu sync.Mutex
}

func (s *snapshot[T]) update(build func() *T) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.p.Store(build())
}

func (s *snapshot[T]) get(build func() *T) *T {
	if v := s.p.Load(); v != nil {
		return v
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.p.Load(); v != nil {
		return v
	}
	v := build()
	s.p.Store(v)
	return v
}
