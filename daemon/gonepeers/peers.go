package gonepeers

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// Peers keeps the gone-peer entries in step with the pod drains. Pass
// runs on the goroutine that owns the model; the flows of VIP clients are
// listed by their own goroutine (a conntrack dump never stalls steering).
type Peers struct {
	cfg Config

	// Owned by the goroutine that runs Pass.
	firstGone map[types.UID]time.Time           // when this node first saw the pod gone
	services  map[types.UID]map[string]struct{} // Services seen listing the pod
	applied   map[netip.Addr]bpf.GonePeer
	relist    map[netip.Addr]bool // adopted peers whose flows are listed again
	warned    map[string]string
	lastPrune time.Time
	// noted is the view's NotesGen when the Services of its pod drains
	// were last noted, gone the drained pods that are gone then, kept the
	// number of departed pods whose Services were kept for their linger:
	// desired reads every pod drain only when the model changed them.
	// Invariant: while notedYet and noted equals NotesGen, gone and
	// services are what noting every pod drain again gives. Checked by
	// package daemon's FuzzSequenceDifferential (its datapath has the gone
	// peers).
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
	// TestTouchedMatchWhole and package daemon's FuzzSequenceDifferential.
	wantYet      bool
	wantIPs      map[netip.Addr][]types.UID // the gone pods at each IP
	wantServices map[string][]types.UID     // the gone pods each Service listed
	refreshAt    time.Time                  // zero: none due
	retry        bool

	flows goneFlows
}

// New returns the gone peers of cfg; nothing is listed before the first
// Pass.
func New(cfg Config) *Peers {
	g := &Peers{cfg: cfg, firstGone: map[types.UID]time.Time{}, services: map[types.UID]map[string]struct{}{},
		applied: map[netip.Addr]bpf.GonePeer{}, relist: map[netip.Addr]bool{}, warned: map[string]string{},
		wantIPs: map[netip.Addr][]types.UID{}, wantServices: map[string][]types.UID{}}
	g.flows.init(cfg)
	return g
}

// Start starts the flow lister; Stop stops it.
func (g *Peers) Start(ctx context.Context) {
	if g.cfg.Sockets != nil && g.cfg.Flows != nil {
		g.flows.start(ctx)
	}
}

// Stop stops what Start began.
func (g *Peers) Stop() { g.flows.stop() }

// Adopt learns the entries a previous draind left, so the first pass only
// writes differences (their timestamps are kept: the instant a pod went
// does not move with a restart).
func (g *Peers) Adopt() error {
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
func (g *Peers) noteServices(uid types.UID, svcs ...string) {
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
func (g *Peers) optedOut(uid types.UID) bool {
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
func (g *Peers) desired(v View, now time.Time) {
	if !g.notedYet || g.noted != v.NotesGen() {
		g.noted, g.notedYet = v.NotesGen(), true
		g.noteDrains(v, now)
	}
	if g.want == nil {
		g.want = map[netip.Addr]bpf.GonePeer{}
	}
	clear(g.want)
	clear(g.wantIPs)
	clear(g.wantServices)
	for _, uid := range g.gone {
		pd, _ := v.PodDrain(uid)
		for _, ip := range pd.IPs {
			g.wantIPs[ip] = append(g.wantIPs[ip], uid)
		}
		for svc := range g.services[uid] {
			g.wantServices[svc] = append(g.wantServices[svc], uid)
		}
		g.wantPod(v, uid, now)
	}
}

// wantPod adds gone pod uid's entries to g.want: none if a Service that
// listed it opted out, none at an IP another pod claims.
func (g *Peers) wantPod(v View, uid types.UID, now time.Time) {
	if g.optedOut(uid) {
		return
	}
	pd, _ := v.PodDrain(uid)
	exp := now.Add(g.cfg.EntryTTL)
	if !pd.Expires.IsZero() && pd.Expires.Before(exp) {
		exp = pd.Expires
	}
	for _, ip := range pd.IPs {
		if v.ClaimedByOther(ip, uid) {
			continue
		}
		g.want[ip] = bpf.GonePeer{Addr: ip, GoneAt: g.firstGone[uid], Expires: exp}
	}
}

// noteDrains notes the Services of every pod drain, lists the gone ones
// (when this node first saw each gone) and forgets the pods that no longer
// drain.
func (g *Peers) noteDrains(v View, now time.Time) {
	g.gone = g.gone[:0]
	for uid, pd := range v.PodDrains() {
		if _, known := g.services[uid]; !known {
			g.noteServices(uid, v.ServicesListing(uid, pd.Namespace)...)
		}
		g.noteServices(uid, v.VanishedServices(uid)...)
		for s := range v.Listings(uid) {
			g.noteServices(uid, s)
		}
		if !pd.Gone {
			continue
		}
		if _, ok := g.firstGone[uid]; !ok {
			g.firstGone[uid] = now
		}
		g.gone = append(g.gone, uid)
	}
	for uid := range g.firstGone {
		if !drains(v, uid) {
			delete(g.firstGone, uid)
		}
	}
	g.pruneServices(v)
}

// pruneServices forgets the Services of pods that no longer drain, but
// for a departed or vanished one's, kept for its linger (counted in
// kept): until its pod drain (the gone Lease) arrives or its linger ends.
func (g *Peers) pruneServices(v View) {
	g.kept = 0
	for uid := range g.services {
		switch {
		case drains(v, uid):
		case v.Lingering(uid):
			g.kept++
		default:
			delete(g.services, uid)
		}
	}
}

// drains reports whether the pod has a pod drain.
func drains(v View, uid types.UID) bool {
	_, ok := v.PodDrain(uid)
	return ok
}

// fresh reports whether the last desired set still holds but for what
// the pass's changes touch (see touched): the model's notes are the same,
// no entry is due for a refresh and no write waits for a retry.
func (g *Peers) fresh(v View, now time.Time) bool {
	return g.wantYet && !g.retry && len(g.relist) == 0 && g.notedYet && g.noted == v.NotesGen() &&
		(g.refreshAt.IsZero() || now.Before(g.refreshAt))
}

// touched returns the gone pods whose entries the pass's changes may
// change: a claim of one of their IPs (dirtyIPs), a Service noted for them
// (dirtyServices: its opt-out), and every gone pod at an IP of those (two
// pods gone at one IP: the entry is either's). Past maxTouched pods it
// gives up (ok false): the whole set is then cheaper.
func (g *Peers) touched(v View, dirtyIPs map[netip.Addr]struct{}, dirtyServices map[string]time.Time) (uids []types.UID, ips []netip.Addr, ok bool) {
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
		pd, _ := v.PodDrain(uids[i])
		for _, ip := range pd.IPs {
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

// Pass writes the difference between the desired and the applied gone
// peers (the model's goroutine, after its pass). It computes the whole
// desired set only when the model's notes changed, an entry is due for a
// refresh or a write for a retry; else only the gone pods the pass's
// changes touch (dirtyIPs, dirtyServices: what the pass saw change), most
// passes none. A rollout keeps a hundred pods gone for minutes: their
// whole set cost ~0.4 ms, on a pass in a hundred at 150k.
func (g *Peers) Pass(v View, now time.Time, dirtyIPs map[netip.Addr]struct{}, dirtyServices map[string]time.Time) {
	if g.cfg.Sockets == nil {
		return
	}
	if !g.fresh(v, now) {
		g.passAll(v, now)
	} else if uids, ips, ok := g.touched(v, dirtyIPs, dirtyServices); !ok {
		g.passAll(v, now)
	} else if len(uids) > 0 {
		g.passTouched(v, now, uids, ips)
	}
	if g.kept > 0 {
		g.pruneServices(v) // a linger may have ended
	}
	g.pruneConnections(now)
}

// passTouched computes the entries of gone pods uids at ips again (see
// touched) and writes their difference.
func (g *Peers) passTouched(v View, now time.Time, uids []types.UID, ips []netip.Addr) {
	for _, ip := range ips {
		delete(g.want, ip)
	}
	for _, uid := range g.gone { // in the whole set's order: at a shared IP the same pod's entry wins
		if slices.Contains(uids, uid) {
			g.wantPod(v, uid, now)
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
func (g *Peers) passAll(v View, now time.Time) {
	g.wantYet, g.retry = true, false
	g.desired(v, now)
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
func (g *Peers) unlist(ip netip.Addr) {
	if err := g.cfg.Sockets.DeleteGonePeer(ip); err != nil {
		g.cfg.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
		g.cfg.Log.Error("unlisting a gone peer, will retry", logKeyIP, ip, logKeyErr, err)
		g.retry = true
		return
	}
	delete(g.applied, ip)
	delete(g.relist, ip)
	g.flows.drop(ip)
}

// apply lists gone peer p at ip unless it is listed so already.
func (g *Peers) apply(ip netip.Addr, p bpf.GonePeer, now time.Time) {
	cur, ok := g.applied[ip]
	if ok && !cur.GoneAt.IsZero() && cur.GoneAt.Before(p.GoneAt) {
		p.GoneAt = cur.GoneAt // adopted from a previous draind: keep the earlier instant
	}
	relist := g.relist[ip]
	if ok && !relist && cur.GoneAt.Equal(p.GoneAt) && !g.rewrite(cur, p, now) {
		return
	}
	if err := g.cfg.Sockets.UpsertGonePeer(p); err != nil {
		g.cfg.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
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
func (g *Peers) noteRefresh(ip netip.Addr, p bpf.GonePeer, now time.Time) {
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
func (g *Peers) rewrite(cur, p bpf.GonePeer, now time.Time) bool {
	return p.Expires.Before(cur.Expires.Add(-time.Second)) ||
		(cur.Expires.Sub(now) < g.cfg.EntryTTL/2 && p.Expires.After(cur.Expires))
}

// pruneInterval is how often the connection counts of addresses no local
// pod holds any more are dropped (the map is bounded by the node's pod
// ranges; this keeps it small where addresses are not reused).
const pruneInterval = 10 * time.Minute

// pruneConnections drops idle counts of addresses no local pod holds.
func (g *Peers) pruneConnections(now time.Time) {
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
	if errors.Is(err, bpf.ErrMapFull) {
		return "map_full"
	}
	return "other"
}
