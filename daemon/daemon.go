package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/gonepeers"
	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/daemon/internal/runloop"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/daemon/reconcile"
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
)

// DefaultProcs is how many CPUs the Go runtime runs draind on
// (GOMAXPROCS) unless told otherwise (draind run --procs). An update's path
// is one serial pipeline: the watch decodes it, hands it to the informer's
// goroutine, and that goroutine's pass writes it, under the model's lock.
// With a P per CPU the hand-off wakes a second thread and idle threads spin
// looking for work: on 2 CPUs that cost a quarter of draind's CPU per
// update (BenchmarkClusterScale, docs/performance.md). Blocking system
// calls and netlink reads release the P, so they still run beside the event path; a
// long computation elsewhere (a relist's decoding, a status dump) shares
// the one P in the runtime's 10 ms turns.
const DefaultProcs = 1

// Config configures a Daemon. Its defaults, and the flags `draind run`
// binds to it, are in config.go.
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
	// FlowLister lists a gone pod's client flows (package gonepeers); nil: the
	// conntrack handle New is given, shared with expiry and counting. Its
	// own handle keeps a long expiry pass from delaying it.
	FlowLister conntrack.FlowLister

	// Offline API.
	Quiet      time.Duration // drained = no SYN for this long and no live connection
	MaxWait    time.Duration // cap of ?wait=
	MaxWaiters int           // concurrent waits before 429
	PollEvery  time.Duration // drained-check period
	// HeaderTimeout and BodyTimeout bound how long a client may take to
	// send its request headers and body (slow clients).
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	// MaxConnections caps the offline API's open connections.
	MaxConnections int
	// MaxWaitersPerPod caps one pod's concurrent waits, so that one pod
	// cannot take the node's slots from another.
	MaxWaitersPerPod int

	Clock  clock.WithTicker
	Logger *slog.Logger
	// REST is the configuration the client was made from, if any: with it
	// the EndpointSlice watch decodes straight into slim slices (k8s.Config).
	REST *rest.Config
	// APIQPS and APIBurst are the client's rate limit towards the API
	// server. Whoever makes the client applies them (`draind run` does);
	// they live here with every other default.
	APIQPS   float32
	APIBurst int
}

// Daemon is one node's draind. New wires it; nothing runs until Run.
type Daemon struct {
	cfg       Config
	inf       *k8s.Informers
	state     model.State
	datapath  Datapath
	conntrack conntrack.Interface // nil: no conntrack
	log       *slog.Logger
	clock     clock.WithTicker
	Metrics   *Metrics

	claims   *model.Claims
	tracker  tracker
	runner   *runner
	handlers []cache.ResourceEventHandlerRegistration
	// local and leases are this node's pods and the drain Leases as their
	// last event read them: every pass reads them, and a node runs up to a
	// hundred pods or more, a cluster's rollout as many Leases. Invariant:
	// each is its informer's store as of its handler's last call (a new
	// object per change: readers compare them by pointer). Checked by
	// FuzzSequenceDifferential.
	local       snapshot[hosted.LocalPods]
	leases      snapshot[drainLeases]
	drainsState podDrainsState // podDrains' own (modelMu)

	// Owned by whoever holds modelMu: the runner goroutine, or the slice
	// watch's for a pass it runs itself (pass.go, passNow).
	model      *model.Model
	reconciler *reconcile.Reconciler
	lastFull   time.Time
	// modelMu is held by every pass and by status readers: the status view
	// is built on demand (a scrape, draind status), never on the hot path.
	modelMu sync.Mutex
	// inlinePasses: the slice watch may run a pass itself (passNow), from
	// the loop's start to its stop.
	inlinePasses atomic.Bool
	inlineAfter  atomic.Int64 // UnixNano: no such pass before (passNow)

	nodes           typedcorev1.NodeInterface // this node's zone (zone.go)
	zoneLoop        runloop.Loop
	conntrackPolicy *conntrackPolicy
	hosted          *hosted.Drains // hosted.go wires them
	hostedLoop      runloop.Loop   // their rounds (runHosted)
	hostedWake      chan struct{}  // asks for a round (wakeHosted)
	leaseWriter     *lease.Writer  // sends the Lease writes they decide
	leaseWriting    runloop.Loop   // leaseWriter's goroutine
	leaseTrust      *lease.Trust
	judge           lease.Judge      // which Leases are believed
	gone            *gonepeers.Peers // sockets_gone.go wires it
	vanished        vanishIntake     // sockets_vanish.go
	pinned          pinnedSteering   // at start-up, until the first pass (restart.go)

	synced    atomic.Bool
	attached  atomic.Bool
	firstDone atomic.Bool
	startErr  error           // what New could not set up (Run returns it)
	lastSync  atomic.Int64    // unix nanoseconds of the last pass
	passes    atomic.Uint64   // passes run (the loop's and the slice watch's)
	api       *nodeapi.Server // the node-local HTTP API
	// informer events handled, per kind (tests wait on them)
	events struct{ slices, services, leases, pods atomic.Uint64 }
	// onLatency, if set before Run, sees every event-to-datapath latency;
	// onIntake how long every EndpointSlice event waited between its
	// receipt and draind's handler: client-go's part of the latency (its
	// queue, indexer and handler dispatch). The benchmarks set them.
	onLatency, onIntake func(time.Duration)
}

// New builds a daemon over its dependencies; Run starts it. ct may be nil
// (no conntrack expiry, live connections not counted). The settings cfg
// leaves 0 take their defaults (Config.Defaults); a value the daemon
// cannot honour is refused with Validate's error.
func New(cfg Config, client kubernetes.Interface, dp Datapath, ct conntrack.Interface) (*Daemon, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	inf := k8s.NewInformers(client, k8s.Config{Namespace: cfg.Namespace, NodeName: cfg.Node, Clock: cfg.Clock, REST: cfg.REST})
	d := &Daemon{cfg: cfg, inf: inf, state: inf, datapath: dp, conntrack: ct,
		log: cfg.Logger, clock: cfg.Clock, claims: model.NewClaims(cfg.Clock, cfg.Linger+cfg.LeaseDuration)}
	d.Metrics = NewMetrics(cfg.Version, dp, inf, d.PodStatuses)
	d.Metrics.Registry.MustRegister(&socketCollector{d: d})
	d.model = model.New(model.Config{
		Node: cfg.Node, EntryTTL: cfg.EntryTTL, Linger: cfg.Linger, RegistryOnlyPolicy: cfg.RegistryOnlyPolicy,
		OnPolicyWarning: func(svc, value string) {
			d.Metrics.PolicyInvalid.Inc()
			d.log.Warn("invalid pod-IP steering annotation, using the default", logKeyService, svc, logKeyValue, value)
		},
	}, d.state, d.claims)
	d.conntrackPolicy = newConntrackPolicy(conntrackPolicyConfig{Conntrack: ct, Claims: d.claims, Clock: cfg.Clock,
		Metrics: d.Metrics, Log: cfg.Logger, GoneGrace: cfg.GoneGrace, UDPReexpire: cfg.UDPReexpire})
	d.reconciler = reconcile.New(dp, cfg.EntryTTL, reconcile.Hooks{
		OnError: d.datapathError,
		OnDrain: func(k bpf.EndpointKey, present bool) { d.conntrackPolicy.udpDrain(k, present, d.clock.Now()) },
	})
	d.tracker.init()
	d.runner = newRunner(cfg.Clock, cfg.MinSyncInterval, cfg.EntryTTL/4, d.sync)
	d.newHosted(client)
	d.leaseTrust = lease.NewTrust(client.CoreV1(), cfg.Clock, cfg.Logger, d.runner.Run)
	d.judge = lease.Judge{Node: cfg.Node, Slices: d.claims, Pods: d.leaseTrust}
	d.api = nodeapi.New(d, nodeapi.Config{Quiet: cfg.Quiet, MaxWait: cfg.MaxWait, BodyTimeout: cfg.BodyTimeout,
		HeaderTimeout: cfg.HeaderTimeout, MaxConnections: cfg.MaxConnections,
		Requests: d.Metrics.OfflineRequests, ConnsRefused: d.Metrics.OfflineConnsRefused.Inc})
	d.nodes = client.CoreV1().Nodes()
	d.gone = d.newGonePeers()
	d.startErr = d.registerHandlers()
	return d, nil
}

func (d *Daemon) datapathError(what string, err error) {
	kind := "other"
	if errors.Is(err, bpf.ErrMapFull) {
		kind = "map_full"
	}
	d.Metrics.DatapathErrors.WithLabelValues(kind).Inc()
	d.log.Error("datapath update failed, will retry", "what", what, logKeyErr, err)
}

// Run adopts the pinned datapath state, starts the informers, waits for
// every informer to sync, then keeps the datapath in step until ctx ends.
// It returns once everything it started has stopped.
func (d *Daemon) Run(ctx context.Context) error {
	if d.startErr != nil {
		return d.startErr
	}
	if err := d.adoptDatapath(); err != nil {
		return err
	}
	infCtx, stopInformers := context.WithCancel(ctx)
	var informers sync.WaitGroup
	informers.Go(func() { d.inf.RunAndWait(infCtx) })
	defer func() { stopInformers(); informers.Wait() }()
	if err := d.inf.WaitForSync(ctx); err != nil {
		return err
	}
	if !cache.WaitForCacheSync(ctx.Done(), d.handlersSynced) {
		return fmt.Errorf("waiting for the informer handlers to sync: %w", ctx.Err())
	}
	for name, ok := range d.inf.Synced() {
		if ok {
			d.Metrics.InformerSynced.WithLabelValues(name).Set(1)
		}
	}
	d.synced.Store(true)
	d.checkLeases(ctx)
	d.log.Info("informers synced, reconciling", "endpointslice_decoding", d.inf.SliceDecoding)
	// Started in dependency order, stopped in reverse: the hosted drains
	// answer their waiters before the loop that feeds them stops.
	d.followZone(ctx)
	d.conntrackPolicy.Start(ctx)
	d.leaseTrust.Start(ctx)
	d.gone.Start(ctx)
	d.startHosted(ctx)
	d.runner.Start(ctx)
	d.runner.Run()
	// Passes in the slice watch's goroutine too, unless passes are rate
	// limited (--min-sync-interval): only the loop keeps that bound.
	d.inlinePasses.Store(d.cfg.MinSyncInterval == 0)
	<-ctx.Done()
	d.inlinePasses.Store(false)
	// A pass the watch began before finishes first: taking the lock waits
	// for it, and there is nothing to do under it.
	d.modelMu.Lock()
	//lint:ignore SA2001 the empty critical section is the wait
	d.modelMu.Unlock()
	d.runner.Stop()
	d.stopHosted("draind is stopping")
	d.gone.Stop()
	d.leaseTrust.Stop()
	d.zoneLoop.Stop()
	d.conntrackPolicy.Stop()
	return nil
}

// checkLeases checks, before the first pass, the Leases that only their
// pods can confirm: a restart must not drop (even for one pass) the
// entries of a registry-only drain it adopted, nor those of a pod that is
// gone since (restart.go).
func (d *Daemon) checkLeases(ctx context.Context) {
	d.hosted.AdoptGone(d.clock.Now(), d.pinned.held)
	d.modelMu.Lock()
	d.podDrains(d.localPodsNow(), d.clock.Now())
	d.modelMu.Unlock()
	d.leaseTrust.Flush(ctx)
	d.leaseTrust.EndInherit()
	d.restoreDepartures(d.clock.Now())
	d.pinned = pinnedSteering{}
}

// adoptDatapath seeds the reconciler (and the model's ids) from the pinned
// maps of a previous draind.
func (d *Daemon) adoptDatapath() error {
	dump, err := d.datapath.Dump()
	if err != nil {
		return fmt.Errorf("reading pinned datapath state: %w", err)
	}
	d.reconciler.Adopt(dump)
	d.model.AdoptIDs(dump)
	d.pinned = pinnedFrom(dump, d.clock.Now())
	d.leaseTrust.Inherit(d.pinned.addrs)
	if err := d.gone.Adopt(); err != nil {
		return fmt.Errorf("reading pinned gone peers: %w", err)
	}
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
	return d.synced.Load() && d.firstDone.Load() && d.attached.Load()
}

// PodStatuses returns every drained pod, with this node's measurements of
// the pods it hosts. It walks the model: call it for status and scrapes,
// not per event.
func (d *Daemon) PodStatuses() []PodStatus {
	d.modelMu.Lock()
	rows := d.model.PodStatuses()
	d.modelMu.Unlock()
	view := make([]PodStatus, len(rows))
	for i, r := range rows {
		view[i] = PodStatus{Namespace: r.Namespace, Name: r.Name, UID: r.UID, IPs: r.IPs, Reason: r.Reason,
			Since: r.Since, Deadline: r.Deadline, State: StateDraining, Entries: keyStrings(r.Entries)}
		if r.Lingering {
			view[i].State = StateLingering
		}
	}
	progress := d.hosted.Progress()
	for i := range view {
		if p, ok := progress[types.UID(view[i].UID)]; ok {
			view[i].setLocal(p)
		}
	}
	return view
}
