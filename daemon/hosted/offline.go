package hosted

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s"
)

// waiter is one blocked /v1/offline?wait= call.
type waiter struct {
	quiet    time.Duration
	deadline time.Time
	started  time.Time
	done     chan nodeapi.Result
}

// Offline starts (or joins) the drain of the pod calling from ip and, with
// wait > 0, blocks until it is drained, wait passes, or the caller goes
// away: the offline API's /v1/offline.
func (l *Drains) Offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) nodeapi.Result {
	p := l.podByIP(ip)
	if p == nil {
		return nodeapi.Result{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), Code: http.StatusForbidden}
	}
	if wait > 0 && !l.reserve(p.UID) {
		return nodeapi.Result{Pod: p.Namespace + "/" + p.Name, Error: "too many concurrent waits", Code: http.StatusTooManyRequests}
	}
	now := l.cfg.Clock.Now()
	ld, err := l.join(ctx, p, now)
	if err != nil {
		if wait > 0 {
			l.mu.Lock()
			l.release(p.UID)
			l.mu.Unlock()
		}
		return nodeapi.Result{Pod: p.Namespace + "/" + p.Name, Error: "publishing the drain: " + err.Error(), Code: http.StatusServiceUnavailable}
	}
	if wait <= 0 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.resultOf(ld, now, nil, ld.state, http.StatusOK)
	}
	return l.wait(ctx, ld, &waiter{quiet: quiet, deadline: now.Add(wait), started: now, done: make(chan nodeapi.Result, 1)})
}

// podByIP finds the local pod (not host-network) owning ip, in the pods
// the passes and reconcile see (a drain started for a pod they did not
// see yet would be taken for a vanished pod's).
//
// A pod that finished (Succeeded, Failed) may still list the IP its
// sandbox had, which the kubelet gives to a new pod: a finished pod is
// never the caller, and of several live pods sharing an IP (which the
// kubelet never does) none is.
func (l *Drains) podByIP(ip netip.Addr) *k8s.Pod {
	ip = ip.Unmap()
	var found *k8s.Pod
	for _, p := range l.localPods().ByUID {
		if p.HostNetwork || p.Finished() || !slices.Contains(p.IPs, ip) {
			continue
		}
		if found != nil {
			return nil // ambiguous
		}
		found = p
	}
	return found
}

// join starts the pod's drain, or joins the one in progress, and makes
// sure its Lease is published before the caller is answered.
func (l *Drains) join(ctx context.Context, p *k8s.Pod, now time.Time) (*drain, error) {
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
func (l *Drains) wait(ctx context.Context, ld *drain, w *waiter) nodeapi.Result {
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
				return nodeapi.Result{Error: "caller went away", Code: 499}
			}
		}
		return <-w.done // settled meanwhile
	}
}

// reserve takes a wait slot for a pod: at most MaxWaitersPerPod per pod,
// and MaxWaiters on the node, except that a pod's first wait is never
// refused for the node-wide cap: one pod (or a few) cannot starve another.
func (l *Drains) reserve(uid types.UID) bool {
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
func (l *Drains) release(uid types.UID) {
	l.nwait--
	if l.podWaits[uid]--; l.podWaits[uid] <= 0 {
		delete(l.podWaits, uid)
	}
}

// Online ends a drain the pod (or an operator) asked for: the offline
// API's /v1/online. A drain caused by the pod's deletion cannot be undone.
func (l *Drains) Online(ctx context.Context, ip netip.Addr) nodeapi.Result {
	p := l.podByIP(ip)
	if p == nil {
		return nodeapi.Result{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), Code: http.StatusForbidden}
	}
	res := nodeapi.Result{Pod: p.Namespace + "/" + p.Name, Code: http.StatusOK, State: "online"}
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
