package hosted

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// Reconcile is one round over this node's drains: start the drains of
// local pods being deleted or gone, adopt this node's Leases of its pods,
// delete the Leases that are over, publish the claims, move each drain on
// and measure it. The Daemon runs a round every PollEvery and when asked
// (Config.Wake).
func (l *Drains) Reconcile(ctx context.Context) {
	now := l.cfg.Clock.Now()
	leases := map[types.UID]*k8s.DrainLease{}
	for _, dl := range l.cfg.State.DrainLeases() {
		leases[dl.PodUID] = dl
	}

	l.mu.Lock()
	known := len(l.pods)
	lp := l.localPods()
	pods := lp.ByUID
	l.drainDeleting(lp, now)
	// Drain Leases of local pods (an operator drain, or ours before a
	// restart): this node holds them now. An expired one is adopted too:
	// the pod asked to go offline and nobody undid it; only the renewals
	// stopped (this node was down, or the API server was).
	for uid, dl := range leases {
		p := pods[uid]
		if p == nil || dl.Holder != l.cfg.Node {
			continue // not a drain this node holds: never adopted
		}
		ld := l.pods[uid]
		if ld == nil || ld.state == StateCancelled {
			ld = l.adopt(p, dl)
		}
		ld.leaseSeen = true
	}
	l.cleanStaleLeases(leases, pods, now)
	l.publishClaims(leases, lp, now)
	if len(l.pods) > known {
		// New drains here: the next pass tells us their entry keys.
		defer l.cfg.RequestPass()
	}
	for uid, ld := range l.pods {
		l.step(uid, ld, leases[uid], pods[uid], now)
	}
	l.mu.Unlock()
	l.measure(ctx, now)
}

// step moves one of this node's drains on (l.mu held): its pod p and its
// Lease dl as the informers show them (nil: none).
func (l *Drains) step(uid types.UID, ld *drain, dl *k8s.DrainLease, p *k8s.Pod, now time.Time) {
	name := k8s.LeaseName(uid)
	if dl != nil && dl.Holder == l.cfg.Node {
		ld.leaseSeen = true
	}
	if dl != nil && ld.published && !l.request(ld).Describes(dl) {
		// The Lease was replaced by another drain's (another holder or
		// IPs): no node honours it for this pod. Publishing replaces it.
		ld.published = false
	}
	deleted := ld.leaseLost || (ld.leaseSeen && dl == nil)
	switch {
	case ld.state == StateCancelled:
		l.forget(uid, false)
		return
	case p == nil && deleted:
		// A gone pod's Lease was deleted (draind undrain): the
		// linger ends, and nothing renews the Lease again.
		if ld.state != StateGone {
			l.finishWaiters(ld, now, StateGone, 200)
		}
		l.forget(uid, false)
		return
	case p == nil && ld.state != StateGone:
		ld.state = StateGone
		ld.goneAt = now
		l.finishWaiters(ld, now, StateGone, 200)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("gone").Inc()
	case p != nil && deleted:
		// The Lease was deleted: /v1/online or draind undrain. A
		// pod being deleted drains all the same: publish it again.
		if p.Deleting() {
			ld.leaseSeen, ld.published, ld.leaseLost = false, false, false
			break
		}
		ld.state = StateCancelled
		l.finishWaiters(ld, now, StateCancelled, 409)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("cancelled").Inc()
		l.forget(uid, false)
		return
	}
	if ld.state == StateGone && (ld.claimedElsewhere || now.Sub(ld.goneAt) >= l.cfg.Linger) {
		l.forget(uid, ld.published || ld.leaseSeen)
		return
	}
	switch {
	case !ld.published:
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Publish, Req: l.request(ld)})
	case now.Sub(ld.lastRenew) >= l.cfg.LeaseDuration/3:
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Renew, Req: l.request(ld), Ann: ld.renewAnnotations(now)})
	}
}

// drainDeleting is the one place that decides that a deleting local pod
// drains (l.mu held). It decides again only when the pods or the drains
// it left changed: every pass asks.
func (l *Drains) drainDeleting(lp *LocalPods, now time.Time) {
	if lp == l.looked && l.unlisted == l.lookU {
		return
	}
	l.looked, l.lookU = lp, l.unlisted
	pods := lp.ByUID
	l.drainVanished(pods, now)
	for _, p := range pods {
		if p.Deleting() && !p.HostNetwork && len(p.IPs) > 0 {
			if ld := l.pods[p.UID]; ld == nil || ld.state == StateCancelled {
				if dl := l.ownLease(p.UID); dl != nil {
					// A drain from before a restart (an offline call, an
					// operator's): it goes on as its Lease says.
					l.adopt(p, dl)
				} else {
					l.start(p, k8s.ReasonPodDeleting, now, true)
				}
			}
		}
	}
}

// drainVanished gives local pods that disappeared without a drain (a force
// delete: ready, then gone) or are being deleted with no grace (killed now)
// a hosted drain that is gone from the start, so that its drain Lease tells
// every node at once; and makes the Lease of a drained pod that just went
// say so at once too (l.mu held).
func (l *Drains) drainVanished(pods map[types.UID]*k8s.Pod, now time.Time) {
	for uid, p := range pods {
		if !p.KilledWithoutGrace() || p.HostNetwork || p.Finished() || len(p.IPs) == 0 {
			continue
		}
		ld := l.pods[uid]
		if ld != nil && ld.state == StateGone {
			continue
		}
		if ld == nil || ld.state == StateCancelled {
			ld = l.start(p, model.ReasonVanished, now, false)
			l.cfg.Metrics.DrainStarts.WithLabelValues(model.ReasonVanished).Inc()
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
		ld := l.start(p, model.ReasonVanished, now, false)
		ld.state, ld.goneAt = StateGone, now
		l.cfg.Metrics.DrainStarts.WithLabelValues(model.ReasonVanished).Inc()
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
	l.seen = pods // a LocalPods snapshot's: nothing writes to it
}

// ownLease returns this node's drain Lease of pod uid (nil: none).
func (l *Drains) ownLease(uid types.UID) *k8s.DrainLease {
	for _, dl := range l.cfg.State.DrainLeases() {
		if dl.PodUID == uid && dl.Holder == l.cfg.Node {
			return dl
		}
	}
	return nil
}

// AdoptGone adopts, at start-up (before the first pass), this node's
// unexpired drain Leases of pods this node no longer has: they drained and
// were deleted while no draind ran here, so no drain here saw them go.
// Only the IPs held (a previous draind's pinned entries for them, steering
// or not yet) count: a Lease no draind here acted on adopts nothing. Each
// becomes a gone drain at now: those IPs stay steered for --linger from
// now, as if this draind had seen the pod go, and its Lease is deleted
// when that ends (or at once if another pod claims an IP).
func (l *Drains) AdoptGone(now time.Time, held map[netip.Addr]bool) {
	leases := l.cfg.State.DrainLeases()
	l.mu.Lock()
	defer l.mu.Unlock()
	pods := l.localPods().ByUID
	for _, dl := range leases {
		if dl.Holder != l.cfg.Node || pods[dl.PodUID] != nil || l.pods[dl.PodUID] != nil || !dl.Expires().After(now) {
			continue
		}
		var ips []netip.Addr
		for _, ip := range dl.IPs {
			if held[ip] {
				ips = append(ips, ip)
			}
		}
		if len(ips) == 0 {
			continue
		}
		l.pods[dl.PodUID] = &drain{uid: dl.PodUID, namespace: dl.PodNamespace, name: dl.PodName, ips: ips,
			reason: dl.Reason, started: dl.Acquired, state: StateGone, goneAt: now, steerPodIP: true,
			leaseSeen: true, published: true, lastRenew: dl.Renewed}
		l.cfg.Log.Info("drain adopted", logKeyPod, dl.PodNamespace+"/"+dl.PodName, logKeyReason, dl.Reason, "state", StateGone)
	}
}

// adopt takes over the drain of local pod p that this node's Lease dl
// records (l.mu held): adopted, not started (no second DrainStarted
// event), with the Lease's reason, start and pod-IP steering.
func (l *Drains) adopt(p *k8s.Pod, dl *k8s.DrainLease) *drain {
	ld := l.start(p, dl.Reason, dl.Acquired, false)
	ld.steerPodIP = ld.steerPodIP || dl.SteerPodIP
	ld.published = true
	ld.lastRenew = dl.Renewed
	return ld
}

// start records a drain of a local pod (l.mu held); announce is false
// when adopting a drain already in progress (a Lease found at start-up).
func (l *Drains) start(p *k8s.Pod, reason string, since time.Time, announce bool) *drain {
	ld := &drain{uid: p.UID, namespace: p.Namespace, name: p.Name, ips: slices.Clone(p.IPs),
		reason: reason, started: since, state: StateDraining, created: p.CreationTimestamp.Time,
		steerPodIP: k8s.SteersPodIP(reason, p.SteerOnDelete)}
	l.pods[p.UID] = ld
	if !announce {
		l.cfg.Log.Info("drain adopted", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
		return ld
	}
	l.cfg.Metrics.DrainStarts.WithLabelValues(reason).Inc()
	l.cfg.Log.Info("drain started", logKeyPod, p.Namespace+"/"+p.Name, logKeyReason, reason)
	l.event(ld, corev1.EventTypeNormal, EventDrainStarted, fmt.Sprintf("draind started draining the pod (reason %s, node %s)", reason, l.cfg.Node))
	return ld
}
