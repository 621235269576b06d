package gonepeers

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/internal/runloop"
)

// goneFlows lists, for each new gone peer, the client flows this node's
// conntrack translated to it (a Service VIP's flows), and lists them gone
// too; they are refreshed and go with their peer. Listing happens once per
// peer (a flow that reaches a gone address later belongs to whoever holds
// it then), newest peers first, so a refresh of older ones never delays it.
type goneFlows struct {
	cfg  Config
	kick chan struct{}
	loop runloop.Loop

	mu      sync.Mutex
	fresh   map[netip.Addr]bpf.GonePeer   // new peers: flows to be listed
	refresh map[netip.Addr]bpf.GonePeer   // listed peers with a new expiry
	byPeer  map[netip.Addr][]bpf.GoneFlow // listed flows
	dropped map[netip.Addr]struct{}       // peers whose flows are to be unlisted
}

func (f *goneFlows) init(cfg Config) {
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

// flowsRetry is how long a peer whose flows could not be listed waits
// before they are listed again.
const flowsRetry = 500 * time.Millisecond

// requeue puts back a new peer whose flows could not be listed, for the
// retry, unless it was unlisted meanwhile or asked for again (with a newer
// entry); it does not wake the lister.
func (f *goneFlows) requeue(ip netip.Addr, p bpf.GonePeer) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, gone := f.dropped[ip]; gone {
		return
	}
	if _, queued := f.fresh[ip]; !queued {
		f.fresh[ip] = p
	}
}

func (f *goneFlows) wake() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// start runs the lister on its own goroutine until stop.
func (f *goneFlows) start(ctx context.Context) { f.loop.Start(ctx, f.run) }

// stop stops what start began and waits for it.
func (f *goneFlows) stop() { f.loop.Stop() }

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
	retry := false
	for _, ip := range ips {
		if !f.list(ctx, ip, fresh[ip]) {
			if ctx.Err() != nil {
				return // stopping
			}
			f.requeue(ip, fresh[ip])
			retry = true
		}
	}
	if retry { // not at once: a conntrack that keeps failing is not read in a loop
		time.AfterFunc(flowsRetry, f.wake)
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
			f.cfg.CTErrors.Inc()
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
			f.cfg.DatapathErrors.WithLabelValues(errorKind(err)).Inc()
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
