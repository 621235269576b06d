package daemon

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s"
)

// offline starts (or joins) the drain of the pod calling from ip and, with
// wait > 0, blocks until it is drained, wait passes, or the caller goes
// away.
func (l *hostedDrains) offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) OfflineResult {
	p := l.podByIP(ip)
	if p == nil {
		return OfflineResult{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), Code: http.StatusForbidden}
	}
	if wait > 0 && !l.reserve(p.UID) {
		return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "too many concurrent waits", Code: http.StatusTooManyRequests}
	}
	now := l.cfg.Clock.Now()
	ld, err := l.join(ctx, p, now)
	if err != nil {
		if wait > 0 {
			l.mu.Lock()
			l.release(p.UID)
			l.mu.Unlock()
		}
		return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "publishing the drain: " + err.Error(), Code: http.StatusServiceUnavailable}
	}
	if wait <= 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.resultOf(ld, now, nil, ld.state, http.StatusOK)
	}
	return l.wait(ctx, ld, &waiter{quiet: quiet, deadline: now.Add(wait), started: now, done: make(chan OfflineResult, 1)})
}

// join starts the pod's drain, or joins the one in progress, and makes
// sure its Lease is published before the caller is answered.
func (l *hostedDrains) join(ctx context.Context, p *k8s.Pod, now time.Time) (*hostedDrain, error) {
	l.mu.Lock()
	ld := l.pods[p.UID]
	created := ld == nil || ld.state == StateCancelled
	if created {
		ld = l.start(p, k8s.ReasonOffline, now, true)
	}
	// A pod that asks to go offline while it is being deleted extends its
	// drain to its own IP: publish the Lease again to say so.
	needPublish := !ld.published || !ld.steerPodIP
	ld.steerPodIP = true
	l.mu.Unlock()
	if !needPublish {
		return ld, nil
	}
	if err := l.publish(ctx, ld, now); err != nil {
		l.mu.Lock()
		if created && l.pods[p.UID] == ld && !ld.published {
			l.unlist(p.UID)
		}
		l.mu.Unlock()
		return nil, err
	}
	l.cfg.RequestPass()
	return ld, nil
}

// wait queues w on the drain (its slot is reserved) and blocks until it is
// settled or the caller goes away.
func (l *hostedDrains) wait(ctx context.Context, ld *hostedDrain, w *waiter) OfflineResult {
	l.mu.Lock()
	ld.waiters = append(ld.waiters, w)
	l.settle(ld, l.cfg.Clock.Now()) // maybe drained already: judge it at this instant
	l.mu.Unlock()
	l.cfg.Wake()
	select {
	case r := <-w.done:
		return r
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, x := range ld.waiters {
			if x == w {
				ld.waiters = append(ld.waiters[:i], ld.waiters[i+1:]...)
				l.release(ld.uid)
				return OfflineResult{Error: "caller went away", Code: 499}
			}
		}
		return <-w.done // settled meanwhile
	}
}

// reserve takes a wait slot for a pod: at most MaxWaitersPerPod per pod,
// and MaxWaiters on the node, except that a pod's first wait is never
// refused for the node-wide cap: one pod (or a few) cannot starve another.
func (l *hostedDrains) reserve(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.podWaits[uid]
	if n >= l.cfg.MaxWaitersPerPod || (n > 0 && l.nwait >= l.cfg.MaxWaiters) {
		return false
	}
	l.podWaits[uid] = n + 1
	l.nwait++
	return true
}

// release gives a wait slot back (l.mu held).
func (l *hostedDrains) release(uid types.UID) {
	l.nwait--
	if l.podWaits[uid]--; l.podWaits[uid] <= 0 {
		delete(l.podWaits, uid)
	}
}

// online ends a drain the pod (or an operator) asked for. A drain caused by
// the pod's deletion cannot be undone.
func (l *hostedDrains) online(ctx context.Context, ip netip.Addr) OfflineResult {
	p := l.podByIP(ip)
	if p == nil {
		return OfflineResult{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), Code: http.StatusForbidden}
	}
	res := OfflineResult{Pod: p.Namespace + "/" + p.Name, Code: http.StatusOK, State: "online"}
	if p.Deleting() {
		res.Error, res.Code = "the pod is being deleted: its drain cannot be undone", http.StatusConflict
		return res
	}
	err := l.deleteLeaseNow(ctx, k8s.LeaseName(p.UID), l.cfg.Node)
	l.cfg.Metrics.LeaseOps.WithLabelValues("delete", result(err)).Inc()
	if err != nil {
		res.Error, res.Code = err.Error(), http.StatusServiceUnavailable
		return res
	}
	l.mu.Lock()
	if ld := l.pods[p.UID]; ld != nil {
		ld.state = StateCancelled
		l.finishWaiters(ld, l.cfg.Clock.Now(), StateCancelled, http.StatusConflict)
		l.unlist(p.UID)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("cancelled").Inc()
	}
	l.mu.Unlock()
	l.cfg.RequestPass()
	return res
}

// Offline is the offline API's /v1/offline: see hostedDrains.offline.
func (d *Daemon) Offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) OfflineResult {
	return d.hosted.offline(ctx, ip, wait, quiet)
}

// Online is the offline API's /v1/online: see hostedDrains.online.
func (d *Daemon) Online(ctx context.Context, ip netip.Addr) OfflineResult {
	return d.hosted.online(ctx, ip)
}

// API is the node-local HTTP API over this daemon's drains.
func (d *Daemon) API() *nodeapi.Server { return d.api }
