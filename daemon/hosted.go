package daemon

import (
	"context"
	"net/netip"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s"
)

// The drains of the pods this node hosts are package hosted's; the Daemon
// wires them: their dependencies, the loop that runs their rounds, the
// Lease writer that sends what they decide, and the offline API's calls.

// OfflineResult is the answer of the offline API (nodeapi.Result).
type OfflineResult = nodeapi.Result

// newHosted wires the hosted drains and their Lease writer.
func (d *Daemon) newHosted(client kubernetes.Interface) {
	cfg := d.cfg
	leases := &k8s.Leases{Client: client, Namespace: cfg.Namespace}
	d.hostedWake = make(chan struct{}, 1)
	d.leaseWriter = lease.NewWriter(leases, cfg.LeaseDuration, cfg.Clock, func(r lease.Result) { d.hosted.LeaseWritten(r) })
	hc := hosted.Config{
		Node: cfg.Node, Linger: cfg.Linger, LeaseDuration: cfg.LeaseDuration, Quiet: cfg.Quiet,
		MaxWaiters: cfg.MaxWaiters, MaxWaitersPerPod: cfg.MaxWaitersPerPod,
		State: d.inf, LocalPods: d.localPodsNow, Claims: d.claims, Datapath: d.datapath, Conntrack: d.conntrack,
		Leases: leases, Writer: d.leaseWriter, Events: client.CoreV1().Events(""), Log: cfg.Logger, Clock: cfg.Clock,
		Metrics: hosted.Metrics{DrainStarts: d.Metrics.DrainStarts, DrainOutcomes: d.Metrics.DrainOutcomes,
			DrainDuration: d.Metrics.DrainDuration, LeaseOps: d.Metrics.LeaseOps, CTErrors: d.Metrics.CTErrors},
		RequestPass: d.runner.Run, Wake: d.wakeHosted,
	}
	if sd := socketsOf(d.datapath); sd != nil {
		hc.Sockets = sd
	}
	d.hosted = hosted.New(hc)
}

// startHosted starts the hosted drains' Events, the Lease writer and the
// loop of their rounds.
func (d *Daemon) startHosted(ctx context.Context) {
	d.hosted.Start()
	d.leaseWriting.Start(ctx, d.leaseWriter.Run)
	d.hostedLoop.Start(ctx, d.runHosted)
}

// stopHosted stops what startHosted began: no round runs once it returns,
// waiters are answered with why (503), queued Events are flushed.
func (d *Daemon) stopHosted(why string) {
	d.hostedLoop.Stop()
	d.hosted.Stop(why)
	d.leaseWriting.Stop()
}

// runHosted runs a round of the hosted drains (measure and settle them,
// publish and renew their Leases) every PollEvery, and at once when
// something asks (wakeHosted).
func (d *Daemon) runHosted(ctx context.Context) {
	t := d.clock.NewTicker(d.cfg.PollEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.hostedWake:
		case <-t.C():
		}
		d.hosted.Reconcile(ctx)
	}
}

// wakeHosted asks for a round of the hosted drains; it never blocks.
func (d *Daemon) wakeHosted() {
	select {
	case d.hostedWake <- struct{}{}:
	default:
	}
}

// Offline is the offline API's /v1/offline: see hosted.Drains.Offline.
func (d *Daemon) Offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) OfflineResult {
	return d.hosted.Offline(ctx, ip, wait, quiet)
}

// Online is the offline API's /v1/online: see hosted.Drains.Online.
func (d *Daemon) Online(ctx context.Context, ip netip.Addr) OfflineResult {
	return d.hosted.Online(ctx, ip)
}

// API is the node-local HTTP API over this daemon's drains.
func (d *Daemon) API() *nodeapi.Server { return d.api }
