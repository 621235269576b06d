package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/k8s"
)

// Ending client sockets to gone pods.
//
// A pod is gone when the node hosting it says so: its pod object was
// deleted (after a graceful drain, or at once by a force delete, an
// eviction of a dead node's pod... any deletion) and that node's draind
// published its drain Lease with state gone (or, on that node itself, its
// hosted drain is gone). A pod that merely left a Service, or whose slice
// changed, is never gone. For every gone pod whose IP no other pod holds
// (claims, by pod UID) and whose Services do not opt out
// (draind.io/end-dead-connections: "false" on any Service that listed it:
// the most cautious wins), every node lists its IPs as gone peers: client
// sockets connected to them before that instant end at their next
// retransmission timeout (TCP) or send (connected UDP). Where the node's
// conntrack translated a client's flow to a Service VIP into the gone pod,
// the flow itself is listed (the socket only knows the VIP).
//
// Safety, in the order the kernel applies it: a socket whose peer answers
// never reaches the retransmission callback (a live pod is never touched,
// even one wrongly listed); a socket established after the pod's IP was
// listed (a new pod that reused the IP before its claim arrived) carries a
// timestamp and is spared; an IP claimed by another pod is unlisted at once.

// ReasonVanished is the drain reason of a pod that left its node without
// draining (force deleted, or deleted while draind was not looking).
const ReasonVanished = "vanished"

// drainVanished gives local pods that disappeared without a drain (a force
// delete: ready, then gone) or are being deleted with no grace (killed now)
// a hosted drain that is gone from the start, so that its drain Lease tells
// every node at once; and makes the Lease of a drained pod that just went
// say so at once too (l.mu held).
func (l *hostedDrains) drainVanished(pods map[types.UID]*k8s.Pod, now time.Time) {
	for uid, p := range pods {
		if !p.KilledWithoutGrace() || p.HostNetwork || p.Finished() || len(p.IPs) == 0 {
			continue
		}
		ld := l.pods[uid]
		if ld != nil && ld.state == StateGone {
			continue
		}
		if ld == nil || ld.state == StateCancelled {
			ld = l.start(p, ReasonVanished, now, false)
			l.cfg.Metrics.DrainStarts.WithLabelValues(ReasonVanished).Inc()
		}
		ld.state, ld.goneAt, ld.lastRenew = StateGone, now, time.Time{}
		l.finishWaiters(ld, now, StateGone, 200)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
		l.cfg.Log.Info("pod killed without grace: gone", logKeyPod, p.Namespace+"/"+p.Name)
	}
	for uid, p := range l.seen {
		// A finished pod (a Job's, an evicted one) released its IPs when
		// it finished: removing its object later ends nobody's connections,
		// and its IPs may be another pod's by then.
		if pods[uid] != nil || p.HostNetwork || p.Finished() || len(p.IPs) == 0 {
			continue
		}
		if ld := l.pods[uid]; ld != nil && ld.state != StateCancelled {
			continue // draining already: the usual path makes it gone
		}
		ld := l.start(p, ReasonVanished, now, false)
		ld.state, ld.goneAt = StateGone, now
		l.cfg.Metrics.DrainStarts.WithLabelValues(ReasonVanished).Inc()
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
		l.cfg.Log.Info("pod vanished without a drain", logKeyPod, p.Namespace+"/"+p.Name)
	}
	// A draining pod that is about to turn gone in this reconcile: its
	// Lease is renewed at once, so every node learns it now, not at the next
	// periodic renewal.
	for uid, ld := range l.pods {
		if pods[uid] == nil && ld.state != StateGone && ld.state != StateCancelled {
			ld.lastRenew = time.Time{}
		}
	}
	l.seen = pods // a localPods snapshot's: nothing writes to it
}

// goneConfig is what ending sockets to gone pods depends on.
type goneConfig struct {
	Sockets   SocketDatapath       // nil: the socket hooks are not loaded
	Flows     conntrack.FlowLister // nil: no conntrack (VIP flows are not found)
	Claims    *claims
	State     State
	EntryTTL  time.Duration
	Metrics   *Metrics
	Log       *slog.Logger
	OnWarning func(service, value string) // a bad annotation value, once each
}

// gonePeers keeps the gone-peer entries in step with the pod drains. pass
// runs on the runner's goroutine; the flows of VIP clients are listed by
// its own goroutine (a conntrack dump never stalls steering).
type gonePeers struct {
	cfg goneConfig

	// Owned by the runner goroutine.
	firstGone map[types.UID]time.Time           // when this node first saw the pod gone
	services  map[types.UID]map[string]struct{} // Services seen listing the pod
	applied   map[netip.Addr]bpf.GonePeer
	relist    map[netip.Addr]bool // adopted peers whose flows are listed again
	warned    map[string]string
	lastPrune time.Time
	// noted is the model's notesGen when the Services of its pod drains
	// were last noted, gone the drained pods that are gone then, kept the
	// number of departed pods whose Services were kept for their linger:
	// desired reads every pod drain only when the model changed them.
	// Invariant: while notedYet and noted equals notesGen, gone and
	// services are what noting every pod drain again gives. Checked by
	// FuzzSequenceDifferential (its datapath has the gone peers).
	noted    uint64
	notedYet bool
	gone     []types.UID
	kept     int
	want     map[netip.Addr]bpf.GonePeer // desired's, reused
	// What the last desired set was computed from, so that a pass with
	// nothing new for it (most passes, while a rollout's pods are gone)
	// costs a few lookups instead of a claims check per gone pod's IP:
	// those IPs and the Services noted for those pods (a change of their
	// claims, or of a Service's opt-out, computes again), the first entry
	// refresh due, and a write left to retry. Invariant: while fresh, want
	// is what desired computes but for the pods touched names. Checked by
	// FuzzSequenceDifferential.
	wantYet      bool
	wantIPs      map[netip.Addr][]types.UID // the gone pods at each IP
	wantServices map[string][]types.UID     // the gone pods each Service listed
	refreshAt    time.Time                  // zero: none due
	retry        bool

	flows goneFlows
}

func newGonePeers(cfg goneConfig) *gonePeers {
	g := &gonePeers{cfg: cfg, firstGone: map[types.UID]time.Time{}, services: map[types.UID]map[string]struct{}{},
		applied: map[netip.Addr]bpf.GonePeer{}, relist: map[netip.Addr]bool{}, warned: map[string]string{},
		wantIPs: map[netip.Addr][]types.UID{}, wantServices: map[string][]types.UID{}}
	g.flows.init(cfg)
	return g
}

// Start starts the flow lister; Stop stops it.
func (g *gonePeers) Start(ctx context.Context) {
	if g.cfg.Sockets != nil && g.cfg.Flows != nil {
		g.flows.loop.start(ctx, g.flows.run)
	}
}

// Stop stops what Start began.
func (g *gonePeers) Stop() { g.flows.loop.stop() }

// adopt learns the entries a previous draind left, so the first pass only
// writes differences (their timestamps are kept: the instant a pod went
// does not move with a restart).
func (g *gonePeers) adopt() error {
	if g.cfg.Sockets == nil {
		return nil
	}
	peers, flows, err := g.cfg.Sockets.GoneEntries()
	if err != nil {
		return err
	}
	for _, p := range peers {
		g.applied[p.Addr] = p
		g.relist[p.Addr] = true
	}
	// Flows have no peer on record: they are deleted (nothing else would
	// ever delete them, and while any is listed every connect and egress
	// packet takes the gone path) and listed again with their peer, in the
	// first pass.
	for _, f := range flows {
		if err := g.cfg.Sockets.DeleteGoneFlow(f.Local, f.Remote); err != nil {
			g.cfg.Log.Error("deleting an adopted gone flow (it ends at its expiry)", "local", f.Local, "remote", f.Remote, logKeyErr, err)
		}
	}
	return nil
}

// noteServices records that a pod was listed by these Services (a vanished
// endpoint's Service, for its opt-out).
func (g *gonePeers) noteServices(uid types.UID, svcs ...string) {
	if uid == "" {
		return
	}
	set := g.services[uid]
	if set == nil {
		if len(svcs) == 0 {
			return // nothing to record: no empty sets to leak
		}
		set = map[string]struct{}{}
		g.services[uid] = set
	}
	for _, s := range svcs {
		set[s] = struct{}{}
	}
}

// optedOut reports whether a Service that listed the pod says
// draind.io/end-dead-connections: "false".
func (g *gonePeers) optedOut(uid types.UID) bool {
	out := false
	for key := range g.services[uid] {
		svc := g.cfg.State.Service(key)
		if svc == nil {
			continue
		}
		switch strings.ToLower(svc.EndDeadConnections) {
		case "", "true":
		case "false":
			out = true
		default:
			if g.warned[key] != svc.EndDeadConnections {
				g.warned[key] = svc.EndDeadConnections
				if g.cfg.OnWarning != nil {
					g.cfg.OnWarning(key, svc.EndDeadConnections)
				}
			}
		}
	}
	return out
}

// desired computes the gone peers from the model's pod drains into g.want,
// and which gone pods each IP and each noted Service concern.
func (g *gonePeers) desired(m *model, now time.Time) {
	if !g.notedYet || g.noted != m.notesGen {
		g.noted, g.notedYet = m.notesGen, true
		g.noteDrains(m, now)
	}
	if g.want == nil {
		g.want = map[netip.Addr]bpf.GonePeer{}
	}
	clear(g.want)
	clear(g.wantIPs)
	clear(g.wantServices)
	for _, uid := range g.gone {
		for _, ip := range m.podDrains[uid].IPs {
			g.wantIPs[ip] = append(g.wantIPs[ip], uid)
		}
		for svc := range g.services[uid] {
			g.wantServices[svc] = append(g.wantServices[svc], uid)
		}
		g.wantPod(m, uid, now)
	}
}

// wantPod adds gone pod uid's entries to g.want: none if a Service that
// listed it opted out, none at an IP another pod claims.
func (g *gonePeers) wantPod(m *model, uid types.UID, now time.Time) {
	if g.optedOut(uid) {
		return
	}
	pd := m.podDrains[uid]
	exp := now.Add(g.cfg.EntryTTL)
	if !pd.Expires.IsZero() && pd.Expires.Before(exp) {
		exp = pd.Expires
	}
	for _, ip := range pd.IPs {
		if g.cfg.Claims.claimedByOther(ip, uid) {
			continue
		}
		g.want[ip] = bpf.GonePeer{Addr: ip, GoneAt: g.firstGone[uid], Expires: exp}
	}
}

// noteDrains notes the Services of every pod drain, lists the gone ones
// (when this node first saw each gone) and forgets the pods that no longer
// drain.
func (g *gonePeers) noteDrains(m *model, now time.Time) {
	g.gone = g.gone[:0]
	for uid, pd := range m.podDrains {
		if _, known := g.services[uid]; !known {
			g.noteServices(uid, m.servicesListing(uid, pd.Namespace)...)
		}
		g.noteServices(uid, m.vanishedServicesOf(uid)...)
		for s := range m.listings[uid] {
			g.noteServices(uid, s)
		}
		if pd.State != StateGone {
			continue
		}
		if _, ok := g.firstGone[uid]; !ok {
			g.firstGone[uid] = now
		}
		g.gone = append(g.gone, uid)
	}
	for uid := range g.firstGone {
		if m.podDrains[uid] == nil {
			delete(g.firstGone, uid)
		}
	}
	g.pruneServices(m)
}

// pruneServices forgets the Services of pods that no longer drain, but
// for a vanished one's, kept for its linger (counted in kept).
func (g *gonePeers) pruneServices(m *model) {
	g.kept = 0
	for uid := range g.services {
		switch {
		case m.podDrains[uid] != nil:
		case g.vanishedRecently(uid, m):
			g.kept++
		default:
			delete(g.services, uid)
		}
	}
}

// vanishedRecently keeps the Services of a vanished endpoint until its pod
// drain (the gone Lease) arrives or its linger ends.
func (g *gonePeers) vanishedRecently(uid types.UID, m *model) bool {
	return m.lingeringOf(uid) || m.vanish.pendingUID(uid)
}

// fresh reports whether the last desired set still holds but for what
// the pass's changes touch (see touched): the model's notes are the same,
// no entry is due for a refresh and no write waits for a retry.
func (g *gonePeers) fresh(m *model, now time.Time) bool {
	return g.wantYet && !g.retry && len(g.relist) == 0 && g.notedYet && g.noted == m.notesGen &&
		(g.refreshAt.IsZero() || now.Before(g.refreshAt))
}

// touched returns the gone pods whose entries the pass's changes may
// change: a claim of one of their IPs (dirtyIPs), a Service noted for them
// (dirtyServices: its opt-out), and every gone pod at an IP of those (two
// pods gone at one IP: the entry is either's). Past maxTouched pods it
// gives up (ok false): the whole set is then cheaper.
func (g *gonePeers) touched(m *model, dirtyIPs map[netip.Addr]struct{}, dirtyServices map[string]time.Time) (uids []types.UID, ips []netip.Addr, ok bool) {
	add := func(us []types.UID) {
		for _, u := range us {
			if !slices.Contains(uids, u) {
				uids = append(uids, u)
			}
		}
	}
	for ip := range dirtyIPs {
		add(g.wantIPs[ip])
	}
	for svc := range dirtyServices {
		add(g.wantServices[svc])
	}
	for i := 0; i < len(uids); i++ { // uids grows: pods at the IPs found
		if len(uids) > maxTouched {
			return nil, nil, false
		}
		for _, ip := range m.podDrains[uids[i]].IPs {
			if !slices.Contains(ips, ip) {
				ips = append(ips, ip)
				add(g.wantIPs[ip])
			}
		}
	}
	return uids, ips, len(uids) <= maxTouched
}

// maxTouched bounds touched's quadratic bookkeeping (a pass usually
// touches none or one gone pod; a relist can touch all of them).
const maxTouched = 64

// pass writes the difference between the desired and the applied gone
// peers (runner goroutine, after the model's pass). It computes the whole
// desired set only when the model's notes changed, an entry is due for a
// refresh or a write for a retry; else only the gone pods the pass's
// changes touch (dirtyIPs, dirtyServices: what the pass saw change), most
// passes none. A rollout keeps a hundred pods gone for minutes: their
// whole set cost ~0.4 ms, on a pass in a hundred at 150k.
func (g *gonePeers) pass(m *model, now time.Time, dirtyIPs map[netip.Addr]struct{}, dirtyServices map[string]time.Time) {
	if g.cfg.Sockets == nil {
		return
	}
	if !g.fresh(m, now) {
		g.passAll(m, now)
	} else if uids, ips, ok := g.touched(m, dirtyIPs, dirtyServices); !ok {
		g.passAll(m, now)
	} else if len(uids) > 0 {
		g.passTouched(m, now, uids, ips)
	}
	if g.kept > 0 {
		g.pruneServices(m) // a linger may have ended
	}
	g.pruneConnections(now)
}

// passTouched computes the entries of gone pods uids at ips again (see
// touched) and writes their difference.
func (g *gonePeers) passTouched(m *model, now time.Time, uids []types.UID, ips []netip.Addr) {
	for _, ip := range ips {
		delete(g.want, ip)
	}
	for _, uid := range g.gone { // in the whole set's order: at a shared IP the same pod's entry wins
		if slices.Contains(uids, uid) {
			g.wantPod(m, uid, now)
		}
	}
	for _, ip := range ips {
		if p, ok := g.want[ip]; ok {
			g.apply(ip, p, now)
			g.noteRefresh(ip, p, now)
		} else if _, ok := g.applied[ip]; ok {
			g.unlist(ip)
		}
	}
}

// passAll computes the whole desired set and writes its difference.
func (g *gonePeers) passAll(m *model, now time.Time) {
	g.wantYet, g.retry = true, false
	g.desired(m, now)
	g.refreshAt = time.Time{}
	for ip, p := range g.want {
		g.apply(ip, p, now)
		g.noteRefresh(ip, p, now)
	}
	for ip := range g.applied {
		if _, ok := g.want[ip]; !ok {
			g.unlist(ip)
		}
	}
}

// unlist deletes the applied gone peer at ip.
func (g *gonePeers) unlist(ip netip.Addr) {
	if err := g.cfg.Sockets.DeleteGonePeer(ip); err != nil {
		g.cfg.Metrics.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
		g.cfg.Log.Error("unlisting a gone peer, will retry", logKeyIP, ip, logKeyErr, err)
		g.retry = true
		return
	}
	delete(g.applied, ip)
	delete(g.relist, ip)
	g.flows.drop(ip)
}

// apply lists gone peer p at ip unless it is listed so already.
func (g *gonePeers) apply(ip netip.Addr, p bpf.GonePeer, now time.Time) {
	cur, ok := g.applied[ip]
	if ok && !cur.GoneAt.IsZero() && cur.GoneAt.Before(p.GoneAt) {
		p.GoneAt = cur.GoneAt // adopted from a previous draind: keep the earlier instant
	}
	relist := g.relist[ip]
	if ok && !relist && cur.GoneAt.Equal(p.GoneAt) && !g.rewrite(cur, p, now) {
		return
	}
	if err := g.cfg.Sockets.UpsertGonePeer(p); err != nil {
		g.cfg.Metrics.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
		g.cfg.Log.Error("listing a gone peer, will retry", logKeyIP, ip, logKeyErr, err)
		g.retry = true
		return
	}
	if !ok {
		g.cfg.Log.Info("pod gone: ending client sockets to it", logKeyIP, ip)
	}
	g.flows.want(ip, p, !ok || relist) // listed, or refreshed with the peer
	g.applied[ip] = p
	delete(g.relist, ip)
}

// noteRefresh notes when the entry at ip is refreshed: when half its TTL
// has passed, unless its pod drain's end bounds it.
func (g *gonePeers) noteRefresh(ip netip.Addr, p bpf.GonePeer, now time.Time) {
	a, ok := g.applied[ip]
	if !ok || p.Expires.Before(now.Add(g.cfg.EntryTTL)) {
		return
	}
	if at := a.Expires.Add(-g.cfg.EntryTTL / 2); g.refreshAt.IsZero() || at.Before(g.refreshAt) {
		g.refreshAt = at
	}
}

// rewrite reports whether an applied entry's end must be written again:
// its pod drain now ends more than a second sooner, or half its TTL passed
// and the entry would last longer.
func (g *gonePeers) rewrite(cur, p bpf.GonePeer, now time.Time) bool {
	return p.Expires.Before(cur.Expires.Add(-time.Second)) ||
		(cur.Expires.Sub(now) < g.cfg.EntryTTL/2 && p.Expires.After(cur.Expires))
}

// pruneInterval is how often the connection counts of addresses no local
// pod holds any more are dropped (the map is bounded by the node's pod
// ranges; this keeps it small where addresses are not reused).
const pruneInterval = 10 * time.Minute

// pruneConnections drops idle counts of addresses no local pod holds.
func (g *gonePeers) pruneConnections(now time.Time) {
	if now.Sub(g.lastPrune) < pruneInterval {
		return
	}
	g.lastPrune = now
	held := map[netip.Addr]bool{}
	for _, p := range g.cfg.State.LocalPods() {
		for _, ip := range p.IPs {
			held[ip] = true
		}
	}
	n, err := g.cfg.Sockets.PruneConnections(func(a netip.Addr) bool { return held[a] })
	if err != nil {
		g.cfg.Log.Warn("pruning connection counts", logKeyErr, err)
	} else if n > 0 {
		g.cfg.Log.Debug("pruned connection counts of addresses no local pod holds", "addresses", n)
	}
}

func errorKind(err error) string {
	if isMapFull(err) {
		return "map_full"
	}
	return "other"
}

// goneFlows lists, for each new gone peer, the client flows this node's
// conntrack translated to it (a Service VIP's flows), and lists them gone
// too; they are refreshed and go with their peer. Listing happens once per
// peer (a flow that reaches a gone address later belongs to whoever holds
// it then), newest peers first, so a refresh of older ones never delays it.
type goneFlows struct {
	cfg  goneConfig
	loop loopRunner
	kick chan struct{}

	mu      sync.Mutex
	fresh   map[netip.Addr]bpf.GonePeer   // new peers: flows to be listed
	refresh map[netip.Addr]bpf.GonePeer   // listed peers with a new expiry
	byPeer  map[netip.Addr][]bpf.GoneFlow // listed flows
	dropped map[netip.Addr]struct{}       // peers whose flows are to be unlisted
}

func (f *goneFlows) init(cfg goneConfig) {
	f.cfg = cfg
	f.kick = make(chan struct{}, 1)
	f.fresh = map[netip.Addr]bpf.GonePeer{}
	f.refresh = map[netip.Addr]bpf.GonePeer{}
	f.byPeer = map[netip.Addr][]bpf.GoneFlow{}
	f.dropped = map[netip.Addr]struct{}{}
}

// want asks for a new peer's flows to be listed, or a known one's to be
// refreshed.
func (f *goneFlows) want(ip netip.Addr, p bpf.GonePeer, isNew bool) {
	if f.cfg.Flows == nil {
		return
	}
	f.mu.Lock()
	if isNew {
		f.fresh[ip] = p
	} else if _, queued := f.fresh[ip]; queued {
		f.fresh[ip] = p
	} else {
		f.refresh[ip] = p
	}
	delete(f.dropped, ip)
	f.mu.Unlock()
	f.wake()
}

func (f *goneFlows) drop(ip netip.Addr) {
	if f.cfg.Flows == nil {
		return
	}
	f.mu.Lock()
	delete(f.fresh, ip)
	delete(f.refresh, ip)
	f.dropped[ip] = struct{}{}
	f.mu.Unlock()
	f.wake()
}

func (f *goneFlows) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

func (f *goneFlows) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
		}
		f.work(ctx)
	}
}

// work lists the new peers' flows (IPv4 first: most clients are), then
// refreshes and unlists the others'.
func (f *goneFlows) work(ctx context.Context) {
	f.mu.Lock()
	fresh, refresh, dropped := f.fresh, f.refresh, f.dropped
	f.fresh, f.refresh, f.dropped = map[netip.Addr]bpf.GonePeer{}, map[netip.Addr]bpf.GonePeer{}, map[netip.Addr]struct{}{}
	f.mu.Unlock()
	ips := make([]netip.Addr, 0, len(fresh))
	for ip := range fresh {
		ips = append(ips, ip)
	}
	slices.SortFunc(ips, netip.Addr.Compare)
	for _, ip := range ips {
		if !f.list(ctx, ip, fresh[ip]) {
			if ctx.Err() != nil {
				return // stopping
			}
			f.want(ip, fresh[ip], true) // retried at the next kick
			time.AfterFunc(500*time.Millisecond, f.wake)
		}
	}
	for ip, p := range refresh {
		f.mu.Lock()
		listed := slices.Clone(f.byPeer[ip])
		f.mu.Unlock()
		for i := range listed {
			listed[i].Expires = p.Expires
			if err := f.cfg.Sockets.UpsertGoneFlow(listed[i]); err != nil {
				f.cfg.Log.Error("refreshing a gone flow", logKeyIP, ip, logKeyErr, err)
			}
		}
	}
	for ip := range dropped {
		f.mu.Lock()
		flows := f.byPeer[ip]
		delete(f.byPeer, ip)
		f.mu.Unlock()
		for _, fl := range flows {
			if err := f.cfg.Sockets.DeleteGoneFlow(fl.Local, fl.Remote); err != nil {
				f.cfg.Log.Error("unlisting a gone flow", logKeyIP, ip, logKeyErr, err)
			}
		}
	}
}

// list lists one new peer's flows; false if conntrack could not be read.
func (f *goneFlows) list(ctx context.Context, ip netip.Addr, p bpf.GonePeer) bool {
	start := time.Now()
	flows, err := f.cfg.Flows.EndpointFlows(ctx, ip, conntrack.TCP)
	if err != nil {
		if ctx.Err() == nil {
			f.cfg.Metrics.CTErrors.Inc()
			f.cfg.Log.Error("listing the flows of a gone pod, will retry", logKeyIP, ip, logKeyErr, err)
		}
		return false
	}
	var listed []bpf.GoneFlow
	for _, fl := range flows {
		// Only flows the node translated: a socket connected to the pod IP
		// itself is covered by the peer entry.
		if fl.Orig.Dst.Addr().Unmap() == ip || !fl.Orig.Src.IsValid() || !fl.Orig.Dst.IsValid() {
			continue
		}
		// A flow younger than the departure belongs to whoever holds the
		// address now.
		if !fl.Start.IsZero() && !fl.Start.Before(p.GoneAt) {
			continue
		}
		gf := bpf.GoneFlow{Local: unmapPort(fl.Orig.Src), Remote: unmapPort(fl.Orig.Dst), GoneAt: p.GoneAt, Expires: p.Expires}
		if err := f.cfg.Sockets.UpsertGoneFlow(gf); err != nil {
			f.cfg.Metrics.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
			f.cfg.Log.Error("listing a gone flow", logKeyIP, ip, logKeyErr, err)
			continue
		}
		listed = append(listed, gf)
	}
	if len(listed) > 0 {
		f.cfg.Log.Info("gone pod's client flows listed", logKeyIP, ip, "flows", len(listed), "took", time.Since(start))
	}
	f.mu.Lock()
	_, gone := f.dropped[ip]
	if !gone {
		f.byPeer[ip] = listed
	}
	f.mu.Unlock()
	if gone { // unlisted while its flows were being listed
		for _, fl := range listed {
			if err := f.cfg.Sockets.DeleteGoneFlow(fl.Local, fl.Remote); err != nil {
				f.cfg.Log.Error("unlisting a gone flow", logKeyIP, ip, logKeyErr, err)
			}
		}
	}
	return true
}

func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// newGonePeers wires the gone peers to the daemon's datapath and conntrack.
func (d *Daemon) newGonePeers() *gonePeers {
	cfg := goneConfig{Sockets: socketsOf(d.datapath), Claims: d.claims, State: d.state, EntryTTL: d.cfg.EntryTTL,
		Metrics: d.Metrics, Log: d.log,
		OnWarning: func(svc, value string) {
			d.log.Warn("invalid "+k8s.AnnotationEndDeadConnections+" annotation, using the default (true)", logKeyService, svc, logKeyValue, value)
		}}
	if fl, ok := d.conntrack.(conntrack.FlowLister); ok && d.conntrack != nil {
		cfg.Flows = fl
	}
	if d.cfg.FlowLister != nil && d.conntrack != nil {
		cfg.Flows = d.cfg.FlowLister
	}
	return newGonePeers(cfg)
}
