package hosted

import (
	"context"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/daemon/lease"
	"github.com/draind/draind/k8s"
)

// cleanStaleLeases deletes the drain Leases that are over (l.mu held):
//   - a Lease this node holds naming an IP that a different pod now
//     holds (a local pod, a believed claim Lease of another node, a ready
//     listing): pod IPs are reused; deleting the Lease tells every node to
//     stop steering the old pod's IP at once;
//   - a Lease this node holds whose pod is gone and that expired (left by
//     a draind that stopped before its cleanup).
func (l *Drains) cleanStaleLeases(leases map[types.UID]*k8s.DrainLease, pods map[types.UID]*k8s.Pod, now time.Time) {
	for uid, dl := range leases {
		if pods[uid] != nil {
			continue
		}
		mine := l.deletes(dl.Holder)
		stale := mine && l.pods[uid] == nil && !dl.Expires().After(now)
		for _, ip := range dl.IPs {
			if mine && l.cfg.Claims.ClaimedByOther(ip, uid) {
				stale = true
				if ld := l.pods[uid]; ld != nil {
					ld.claimedElsewhere = true // the linger ends now
				}
				break
			}
		}
		if stale {
			l.deleteLease(dl.Name, dl.Holder)
		}
	}
}

// deleteLease asks the writer to delete Lease name of holder, if this
// node deletes it (deletes). It takes no lock of its own: callers hold l.mu.
func (l *Drains) deleteLease(name, holder string) {
	if l.deletes(holder) {
		l.cfg.Writer.Want(name, lease.Write{Kind: lease.Delete})
	}
}

// deleteLeaseNow is deleteLease at once, for /v1/online (Drains.Online):
// the pod's own drain Lease, deleted while the call's answer waits for it
// and reports its error.
func (l *Drains) deleteLeaseNow(ctx context.Context, name, holder string) error {
	if !l.deletes(holder) {
		return fmt.Errorf("drain lease %s is held by %s: only its holder deletes it", name, holder)
	}
	return l.cfg.Writer.DeleteNow(ctx, name)
}

// deletes is the one place that decides whether this node deletes a
// Lease; the writer (lease.Writer) is the one that does. Only a Lease's
// holder deletes it: the shipped Lease policy denies any other node, and a
// local pod at the IP of another node's drain Lease claims the IP instead
// (publishClaims), so a Lease of another holder is never deleted here.
// The holder deletes:
//   - a drain Lease whose drain ended: its pod gone and the linger over,
//     or its IP claimed elsewhere (forget);
//   - a drain Lease it holds naming an IP a different pod now holds, or
//     whose pod is gone and that expired (cleanStaleLeases);
//   - a claim Lease no longer needed, or left by an earlier run
//     (publishClaims);
//   - a drain Lease whose drain /v1/online cancels (deleteLeaseNow).
func (l *Drains) deletes(holder string) bool { return holder == l.cfg.Node }

// forget drops a drain (l.mu held); deleteLease also deletes its Lease.
func (l *Drains) forget(uid types.UID, deleteLease bool) {
	l.unlist(uid)
	if deleteLease {
		l.deleteLease(k8s.LeaseName(uid), l.cfg.Node)
	} else {
		l.cfg.Writer.Drop(k8s.LeaseName(uid))
	}
}

// request is the Lease a drain publishes (l.mu held).
func (l *Drains) request(ld *drain) k8s.DrainRequest {
	r := k8s.DrainRequest{PodNamespace: ld.namespace, PodName: ld.name, PodUID: ld.uid, IPs: ld.ips,
		Node: l.cfg.Node, Reason: ld.reason, Duration: l.cfg.LeaseDuration, SteerPodIP: ld.steerPodIP}
	if ld.state == StateGone {
		r.State = StateGone // a pod that vanished: gone from the first write
	}
	return r
}

// LeaseWritten records a write of this node's Leases that landed or failed:
// the writer's result (lease.Writer's onResult, on its goroutine).
func (l *Drains) LeaseWritten(r lease.Result) {
	op := r.Kind.String()
	switch {
	case r.Err == nil:
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "ok").Inc()
	case lease.Gone(r.Kind, r.Err):
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "refused").Inc()
		l.cfg.Log.Info("drain lease deleted, not renewed again", "lease", r.Name)
	case lease.Permanent(r.Kind, r.Err):
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "refused").Inc()
		l.cfg.Log.Warn("drain lease write refused, retried with backoff up to "+lease.RefusedMax.String(),
			"lease", r.Name, "op", op, logKeyErr, r.Err)
	default:
		l.cfg.Metrics.LeaseOps.WithLabelValues(op, "error").Inc()
		l.cfg.Log.Error("writing drain lease, will retry", "lease", r.Name, "op", op, logKeyErr, r.Err)
	}
	if strings.HasPrefix(r.Name, k8s.ClaimPrefix) {
		l.claimWritten(r)
		return
	}
	if r.Kind == lease.Delete {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		if k8s.LeaseName(ld.uid) != r.Name {
			continue
		}
		switch {
		case r.Err == nil:
			ld.published, ld.lastRenew = true, r.At
		case apierrors.IsNotFound(r.Err) && !ld.leaseSeen:
			ld.published = false // never landed: create it
		case lease.Gone(r.Kind, r.Err):
			ld.leaseLost = true // deleted: reconcile ends the drain
		}
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

// publish creates (or joins) the pod's drain Lease now, for an offline
// call that answers only once the drain is announced cluster-wide.
func (l *Drains) publish(ctx context.Context, ld *drain, now time.Time) error {
	l.mu.Lock()
	req := l.request(ld)
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, lease.CallTimeout)
	defer cancel()
	_, created, err := l.cfg.Leases.Publish(ctx, req, now)
	op := "renew"
	if created {
		op = "create"
	}
	l.cfg.Metrics.LeaseOps.WithLabelValues(op, result(err)).Inc()
	if err != nil {
		l.cfg.Log.Error("publishing drain lease", logKeyPod, ld.namespace+"/"+ld.name, logKeyErr, err)
		return err
	}
	l.mu.Lock()
	ld.published = true
	ld.lastRenew = now
	l.mu.Unlock()
	return nil
}
