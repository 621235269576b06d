// Package daemon is draind's node agent: the drain model and reconciler
// (Kubernetes signals -> desired datapath state -> BPF maps and conntrack),
// the drains of pods hosted on this node and their offline API, status and
// metrics.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/k8s"
)

// Log keys, written once.
const (
	logKeyService = "service"
	logKeyPod     = "pod"
	logKeyErr     = "err"
	logKeyValue   = "value"
	logKeyOps     = "ops"
	logKeyReason  = "reason"
	logKeyIP      = "ip"
)

// Config configures a Daemon.
type Config struct {
	Node      string
	Namespace string // where drain Leases live
	Version   string

	EntryTTL           time.Duration // steering entry lifetime without refresh
	Linger             time.Duration // departed pod IPs stay steered this long
	LeaseDuration      time.Duration // drain Lease duration (renewed at a third)
	GoneGrace          time.Duration // wait after an endpoint left every slice before cutting its TCP flows
	MinSyncInterval    time.Duration // bounded frequency: at most one pass per interval
	RegistryOnlyPolicy bpf.Policy
	UDPReexpire        time.Duration // UDP flows of draining endpoints are expired again this often

	// Offline API.
	Quiet       time.Duration // drained = no SYN for this long and no live connection
	MaxWait     time.Duration // cap of ?wait=
	MaxWaiters  int           // concurrent waits before 429
	PollEvery   time.Duration // drained-check period
	OfflineAddr string        // listen address of the offline API ("" = off)
	// HeaderTimeout bounds how long a client may take to send its request
	// headers (slow clients).
	HeaderTimeout time.Duration

	Clock  clock.WithTicker
	Logger *slog.Logger
	// OnLatency, if set, sees every event-to-datapath latency (benchmarks).
	OnLatency func(time.Duration)
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.EntryTTL, time.Minute)
	def(&c.Linger, 2*time.Minute)
	def(&c.LeaseDuration, 30*time.Second)
	def(&c.GoneGrace, 5*time.Second)
	def(&c.UDPReexpire, 10*time.Second)
	def(&c.Quiet, 2*time.Second)
	def(&c.MaxWait, 10*time.Minute)
	def(&c.PollEvery, 200*time.Millisecond)
	def(&c.HeaderTimeout, 5*time.Second)

	if c.MaxWaiters == 0 {
		c.MaxWaiters = 256
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Version == "" {
		c.Version = "dev"
	}
}

// Daemon is one node's draind.
type Daemon struct {
	cfg     Config
	client  kubernetes.Interface
	inf     *k8s.Informers
	state   State
	dp      Datapath
	ct      conntrack.Interface
	leases  *k8s.Leases
	log     *slog.Logger
	clock   clock.WithTicker
	Metrics *Metrics

	claims  *claims
	tracker tracker
	runner  *runner

	// Owned by the runner goroutine.
	model     *model
	rec       *reconciler
	firstDone bool
	lastFull  time.Time
	// modelMu is held by every pass and by status readers: the status view
	// is built on demand (a scrape, draind status), never on the hot path.
	modelMu sync.Mutex
	seenDel map[types.UID]time.Time // local pods first seen deleting

	ct2   *ctWorker
	local *localDrains

	synced   atomic.Bool
	attached atomic.Bool
	lastSync atomic.Int64 // unix nanoseconds at the end of the last datapath pass (status)
	// informer events handled, per kind (tests wait on them)
	events struct{ slices, services, leases, pods atomic.Uint64 }

	mu sync.Mutex // guards firstDone for readers
}

// New builds a daemon; Run starts it. ct may be nil (no conntrack expiry).
func New(cfg Config, client kubernetes.Interface, dp Datapath, ct conntrack.Interface) *Daemon {
	cfg.Defaults()
	inf := k8s.NewInformers(client, k8s.Config{Namespace: cfg.Namespace, NodeName: cfg.Node})
	d := &Daemon{
		cfg: cfg, client: client, inf: inf, state: inf, dp: dp, ct: ct,
		leases:  &k8s.Leases{Client: client, Namespace: cfg.Namespace},
		log:     cfg.Logger,
		clock:   cfg.Clock,
		claims:  newClaims(),
		seenDel: map[types.UID]time.Time{},
	}
	d.Metrics = NewMetrics(cfg.Version, dp, inf, d.PodStatuses)
	d.model = newModel(ModelConfig{
		Node: cfg.Node, EntryTTL: cfg.EntryTTL, Linger: cfg.Linger, RegistryOnlyPolicy: cfg.RegistryOnlyPolicy,
		OnPolicyWarning: func(svc, value string) {
			d.Metrics.PolicyInvalid.Inc()
			d.log.Warn("invalid pod-IP steering annotation, using the default", logKeyService, svc, logKeyValue, value)
		},
	}, d.state, d.claims)
	d.rec = newReconciler(dp, cfg.EntryTTL)
	d.rec.onDrain = func(k bpf.EndpointKey, present bool) { d.ct2.udpDrain(k, present, d.clock.Now()) }
	d.rec.onError = func(what string, err error) {
		kind := "other"
		if isMapFull(err) {
			kind = "map_full"
		}
		d.Metrics.DatapathErrors.WithLabelValues(kind).Inc()
		d.log.Error("datapath update failed, will retry", "what", what, logKeyErr, err)
	}
	d.tracker.init()
	d.runner = newRunner(cfg.Clock, cfg.MinSyncInterval, cfg.EntryTTL/4, d.sync)
	d.ct2 = newCTWorker(d)
	d.local = newLocalDrains(d)
	d.registerHandlers()
	return d
}

// Informers exposes the caches (tests, status).
func (d *Daemon) Informers() *k8s.Informers { return d.inf }

// Run starts the informers, adopts the pinned datapath state, waits for
// every informer to sync, then keeps the datapath in step until ctx ends.
func (d *Daemon) Run(ctx context.Context) error {
	if dump, err := d.dp.Dump(); err != nil {
		return fmt.Errorf("reading pinned datapath state: %w", err)
	} else {
		d.rec.adopt(dump)
		for _, b := range dump.Backends {
			if uint32(b.Service) > d.model.ids.next {
				d.model.ids.next = uint32(b.Service)
			}
		}
		for _, f := range dump.Frontends {
			if uint32(f.Service) > d.model.ids.next {
				d.model.ids.next = uint32(f.Service)
			}
		}
		for _, dr := range dump.Drains {
			if uint32(dr.Service) > d.model.ids.next {
				d.model.ids.next = uint32(dr.Service)
			}
		}
	}
	d.inf.Run(ctx)
	if err := d.inf.WaitForSync(ctx); err != nil {
		return err
	}
	for name, ok := range d.inf.Synced() {
		if ok {
			d.Metrics.InformerSynced.WithLabelValues(name).Set(1)
		}
	}
	d.synced.Store(true)
	d.log.Info("informers synced, reconciling")
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); d.runner.Loop(ctx) }()
	go func() { defer wg.Done(); d.ct2.loop(ctx) }()
	go func() { defer wg.Done(); d.local.loop(ctx) }()
	d.runner.Run()
	<-ctx.Done()
	wg.Wait()
	return nil
}

// SetAttached records that the programs are attached (readiness).
func (d *Daemon) SetAttached(ok bool) {
	d.attached.Store(ok)
	if ok {
		d.Metrics.SteeringReady.Set(1)
	} else {
		d.Metrics.SteeringReady.Set(0)
	}
}

// Ready reports whether informers synced, the first pass ran and the
// programs are attached.
func (d *Daemon) Ready() bool {
	d.mu.Lock()
	first := d.firstDone
	d.mu.Unlock()
	return d.synced.Load() && first && d.attached.Load()
}

// --- event intake -------------------------------------------------------------

// tracker records what changed since the last pass; informer handlers only
// write here and return.
type tracker struct {
	mu       sync.Mutex
	services map[string]time.Time // dirty Service -> earliest event
	ips      map[netip.Addr]struct{}
	pods     time.Time // zero: no change
	leases   time.Time
}

func (t *tracker) init() {
	t.services = map[string]time.Time{}
	t.ips = map[netip.Addr]struct{}{}
}

type dirtySet struct {
	services map[string]time.Time
	ips      map[netip.Addr]struct{}
	pods     time.Time
	leases   time.Time
}

func (t *tracker) take() dirtySet {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := dirtySet{services: t.services, ips: t.ips, pods: t.pods, leases: t.leases}
	t.init()
	t.pods, t.leases = time.Time{}, time.Time{}
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

func tombstone[T any](obj any) (T, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	v, ok := obj.(T)
	return v, ok
}

func sameVersion(a, b any) bool {
	type rv interface{ GetResourceVersion() string }
	x, ok1 := a.(rv)
	y, ok2 := b.(rv)
	return ok1 && ok2 && x.GetResourceVersion() != "" && x.GetResourceVersion() == y.GetResourceVersion()
}

// onChange calls fn with the object of every add, delete and real update
// (resyncs, which repeat a resourceVersion, are dropped).
func onChange(inf cache.SharedIndexInformer, fn func(any)) {
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: fn,
		UpdateFunc: func(o, n any) {
			if !sameVersion(o, n) {
				fn(n)
			}
		},
		DeleteFunc: fn,
	})
}

func (d *Daemon) registerHandlers() {
	sliceEvent := func(old, new *k8s.Slice) {
		defer d.events.slices.Add(1)
		now := d.clock.Now()
		d.tracker.markIPs(d.claims.updateSlice(old, new))
		for _, s := range []*k8s.Slice{old, new} {
			if s != nil && s.Service != "" {
				d.tracker.markService(s.Namespace+"/"+s.Service, now)
			}
		}
		d.runner.Run()
	}
	d.inf.Slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*k8s.Slice); ok {
				sliceEvent(nil, s)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			if sameVersion(oldObj, newObj) {
				return // resync: nothing changed
			}
			o, _ := oldObj.(*k8s.Slice)
			n, _ := newObj.(*k8s.Slice)
			sliceEvent(o, n)
		},
		DeleteFunc: func(obj any) {
			if s, ok := tombstone[*k8s.Slice](obj); ok {
				sliceEvent(s, nil)
			}
		},
	})
	svcEvent := func(obj any) {
		defer d.events.services.Add(1)
		if s, ok := tombstone[*k8s.Service](obj); ok {
			d.tracker.markService(s.Namespace+"/"+s.Name, d.clock.Now())
			d.runner.Run()
		}
	}
	onChange(d.inf.Services, svcEvent)
	leaseEvent := func(any) {
		defer d.events.leases.Add(1)
		d.tracker.markLeases(d.clock.Now())
		d.runner.Run()
		d.local.wake()
	}
	onChange(d.inf.Leases, leaseEvent)
	podEvent := func(any) {
		defer d.events.pods.Add(1)
		d.tracker.markIPs(d.claims.setLocalPods(d.state.LocalPods()))
		d.tracker.markPods(d.clock.Now())
		d.runner.Run()
		d.local.wake()
	}
	onChange(d.inf.Pods, podEvent)
}

// --- the pass -----------------------------------------------------------------

// buildPodDrains derives the pod-level drains from the drain Leases and this
// node's deleting pods. Expired Leases end their drain (fail open).
func (d *Daemon) buildPodDrains(now time.Time) map[types.UID]*podDrain {
	out := map[types.UID]*podDrain{}
	for _, l := range d.state.DrainLeases() {
		if !l.Expires().After(now) {
			continue
		}
		out[l.PodUID] = &podDrain{UID: l.PodUID, Namespace: l.PodNamespace, Name: l.PodName, IPs: l.IPs,
			Reason: l.Reason, Since: l.Acquired, Expires: l.Expires(), Holder: l.Holder, Lease: true}
	}
	live := map[types.UID]bool{}
	for _, p := range d.state.LocalPods() {
		live[p.UID] = true
		if !p.Deleting() || p.HostNetwork || len(p.IPs) == 0 {
			continue
		}
		since, ok := d.seenDel[p.UID]
		if !ok {
			since = now
			d.seenDel[p.UID] = now
		}
		if _, leased := out[p.UID]; leased {
			continue
		}
		out[p.UID] = &podDrain{UID: p.UID, Namespace: p.Namespace, Name: p.Name, IPs: p.IPs,
			Reason: k8s.ReasonPodDeleting, Since: since}
	}
	for uid := range d.seenDel {
		if !live[uid] {
			delete(d.seenDel, uid)
		}
	}
	return out
}

// sync is one reconciler pass, run by the runner. It returns the next
// instant the model changes by itself (a Lease or linger ending).
func (d *Daemon) sync() time.Time {
	d.modelMu.Lock()
	defer d.modelMu.Unlock()
	now := d.clock.Now()
	dirty := d.tracker.take()
	m := d.model

	// Pod-level drains; a changed one dirties the Services listing the pod.
	podAt := dirty.leases // the earliest Lease or local pod event
	if podAt.IsZero() || (!dirty.pods.IsZero() && dirty.pods.Before(podAt)) {
		podAt = dirty.pods
	}
	if podAt.IsZero() {
		podAt = now // no event: a deadline passed
	}
	changedDrains := m.setPodDrains(d.buildPodDrains(now))
	podViaServices := false
	for _, pd := range changedDrains {
		for _, svc := range m.servicesListing(pd.UID, pd.Namespace) {
			podViaServices = true
			if t, ok := dirty.services[svc]; !ok || podAt.Before(t) {
				dirty.services[svc] = podAt
			}
		}
	}
	var changedAt []time.Time
	for svc, at := range dirty.services {
		if m.recomputeService(svc, now) {
			changedAt = append(changedAt, at)
		}
	}
	for ip := range dirty.ips {
		m.claimsChanged(ip)
	}
	m.expireLingering(now)
	departed := m.departed
	m.departed = nil

	full := !d.firstDone || now.Sub(d.lastFull) >= d.cfg.EntryTTL/4
	if full {
		d.lastFull = now
	}
	res := d.rec.apply(m, now, full)
	done := d.clock.Now()
	d.lastSync.Store(done.UnixNano())
	d.Metrics.DatapathOps.Add(float64(res.Ops))
	if res.Ops > 0 {
		if len(changedDrains) > 0 && !podViaServices {
			changedAt = append(changedAt, podAt) // a registry-only pod: no Service carried it
		}
		for _, at := range changedAt {
			lat := done.Sub(at)
			d.Metrics.SignalToDatapath.Observe(lat.Seconds())
			if d.cfg.OnLatency != nil {
				d.cfg.OnLatency(lat)
			}
		}
	}
	if !d.firstDone {
		d.log.Info("first datapath pass done", logKeyOps, res.Ops)
		// The initial lists decoded the whole cluster once; hand that
		// garbage back to the node now rather than whenever the
		// scavenger gets to it.
		defer debug.FreeOSMemory()
	}
	d.local.setKeys(m.keysOf(d.local.uids()))
	d.mu.Lock()
	d.firstDone = true
	d.mu.Unlock()
	for _, dep := range departed {
		d.ct2.departed(dep)
	}

	next := m.nextDeadline()
	if d.rec.pending() {
		retry := now.Add(time.Second)
		if next.IsZero() || retry.Before(next) {
			next = retry
		}
	}
	return next
}

// PodStatuses returns every drained pod, with this node's measurements of
// the pods it hosts. It walks the model: call it for status and scrapes,
// not per event.
func (d *Daemon) PodStatuses() []PodStatus {
	d.modelMu.Lock()
	pods := d.model.drainedPods()
	d.modelMu.Unlock()
	view := make([]PodStatus, 0, len(pods))
	for _, p := range pods {
		ps := PodStatus{UID: string(p.UID), Reason: p.Reason, Since: p.Since, Deadline: p.Expires, State: StateDraining}
		ps.Namespace, ps.Name = splitPod(p.Pod)
		for _, ip := range p.IPs {
			ps.IPs = append(ps.IPs, ip.String())
		}
		for _, k := range p.Keys {
			ps.Entries = append(ps.Entries, k.String())
		}
		if p.Reason == ReasonDeparted {
			ps.State = StateLingering
		}
		d.local.annotate(&ps)
		view = append(view, ps)
	}
	return view
}

func splitPod(s string) (string, string) {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i], s[i+1:]
		}
	}
	return "", s
}

var errNotReady = errors.New("draind is not ready")
