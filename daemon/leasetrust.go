package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	"github.com/draind/draind/k8s"
)

// Which drain Leases are honoured. Every node's draind shares one
// ServiceAccount that may write drain Leases; a Lease is honoured only when
// the cluster's own records agree that its holder hosts the pod, and only
// for the pod's own IPs:
//
//   - this node's Leases: the pod is one of this node's pods;
//   - a pod that trusted slices list: their endpoints for the pod UID name
//     the holder as the node (a listing on another node rejects the Lease);
//   - a pod no trusted slice lists (a registry-only workload): the Pod
//     object itself, read once per Lease, names the holder and the IPs.
//
// A Lease not (yet) confirmed drains nothing: fail open.

// honouredIPs returns the IPs a Lease may drain, appended to buf, or false;
// until is when the answer may change with nothing else changing (zero:
// never).
func (d *Daemon) honouredIPs(l *k8s.DrainLease, local map[netip.Addr]*k8s.Pod, buf []netip.Addr, now time.Time) (ips []netip.Addr, ok bool, until time.Time) {
	ips = buf
	if l.Holder == d.cfg.Node {
		for _, ip := range l.IPs {
			if p := local[ip]; p != nil && p.UID == l.PodUID {
				ips = append(ips, ip)
			}
		}
		return ips, len(ips) > 0, time.Time{}
	}
	switch h := d.drainsState.hostsOf(d.claims, l, now); {
	case h.elsewhere:
		return ips, false, h.until // the pod runs elsewhere: not the holder's to drain
	case len(h.ips) > 0:
		return append(ips, h.ips...), true, h.until
	default:
		v, ok, recheck := d.leaseTrust.verified(l)
		if !h.until.IsZero() && (recheck.IsZero() || h.until.Before(recheck)) {
			recheck = h.until
		}
		return append(ips, v...), ok, recheck // a copy: buf is reused, the verdict kept
	}
}

// leaseHosts is what trusted slices said of a Lease's pod: the IPs they
// list it at on the Lease's holder, or that they list it on another node.
// Invariant: it is hostOf's answer for the Lease's IPs while the Lease
// object, the generation of those IPs' listings (gen, claims.ipsGeneration)
// and a departed host's answer (until) last. Checked by
// FuzzSequenceDifferential.
type leaseHosts struct {
	lease     *k8s.DrainLease
	gen       uint64    // the generation of its IPs' listings it was read at
	cached    bool      // gen is one (the IPs were watched)
	until     time.Time // a departed host's answer ends (zero: none)
	ips       []netip.Addr
	elsewhere bool
}

// hostsOf returns what trusted slices say of the pod of l, a Lease of
// another node: one index lookup per IP, kept (by Lease name) while the
// Lease object, the generation of its IPs' listings and a departed host's
// answer last.
func (st *podDrainsState) hostsOf(c *claims, l *k8s.DrainLease, now time.Time) *leaseHosts {
	gen, cached := c.ipsGeneration(l.IPs)
	if h := st.hostAnswers[l.Name]; h != nil && cached && h.cached && h.lease == l && h.gen == gen && (h.until.IsZero() || now.Before(h.until)) {
		return h
	}
	h := &leaseHosts{lease: l, gen: gen, cached: cached}
	for _, ip := range l.IPs {
		node, listed, until := c.hostOf(ip, l.PodUID)
		if !until.IsZero() && (h.until.IsZero() || until.Before(h.until)) {
			h.until = until
		}
		if listed && node != l.Holder {
			h.elsewhere, h.ips = true, nil
			break
		}
		if listed {
			h.ips = append(h.ips, ip)
		}
	}
	if st.hostAnswers == nil {
		st.hostAnswers = map[string]*leaseHosts{}
	}
	st.hostAnswers[l.Name] = h
	return h
}

// forgetHostAnswers drops the answers of Leases that are gone.
func (st *podDrainsState) forgetHostAnswers(names map[string]bool) {
	for name := range st.hostAnswers {
		if !names[name] {
			delete(st.hostAnswers, name)
		}
	}
}

// leaseVerdict is what the Pod object said about a Lease.
type leaseVerdict struct {
	lease   k8s.DrainLease // the Lease as checked (identity, holder, IPs)
	ok      bool
	ips     []netip.Addr
	checked time.Time
}

// leaseTrust checks Leases of pods no trusted slice lists against their Pod
// objects, off the runner's path: a pass asks, a goroutine reads the pod,
// the next pass has the answer.
type leaseTrust struct {
	pods        typedcorev1.PodsGetter
	clock       clock.WithTicker
	log         *slog.Logger
	requestPass func()
	kick        chan struct{}
	loop        loopRunner

	mu       sync.Mutex
	verdicts map[string]*leaseVerdict // by Lease name
	pending  map[string]k8s.DrainLease
	// gen changes with every verdict. Invariant: verified's answers (the
	// Pod read of a Lease with the same claim, a refusal until its
	// recheck) hold while gen stays. Checked by FuzzSequenceDifferential.
	gen uint64
}

// recheckAfter is when a refused Lease is checked again (the pod may get
// its IPs or its node later than its Lease).
const recheckAfter = 5 * time.Second

func newLeaseTrust(pods typedcorev1.PodsGetter, c clock.WithTicker, log *slog.Logger, requestPass func()) *leaseTrust {
	return &leaseTrust{pods: pods, clock: c, log: log, requestPass: requestPass, kick: make(chan struct{}, 1),
		verdicts: map[string]*leaseVerdict{}, pending: map[string]k8s.DrainLease{}}
}

func sameClaim(a, b *k8s.DrainLease) bool {
	return a.PodUID == b.PodUID && a.Holder == b.Holder && a.PodNamespace == b.PodNamespace &&
		a.PodName == b.PodName && slices.Equal(a.IPs, b.IPs)
}

// verified returns the verdict on l, asking for a check when there is none
// (or it is stale). A refusal holds until recheck; the verdict of a check
// asked for changes the generation.
func (t *leaseTrust) verified(l *k8s.DrainLease) (ips []netip.Addr, ok bool, recheck time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.verdicts[l.Name]
	if v != nil && sameClaim(&v.lease, l) && (v.ok || t.clock.Since(v.checked) < recheckAfter) {
		if !v.ok {
			recheck = v.checked.Add(recheckAfter)
		}
		return v.ips, v.ok, recheck
	}
	t.pending[l.Name] = *l
	select {
	case t.kick <- struct{}{}:
	default:
	}
	return nil, false, time.Time{}
}

// generation returns gen: verified's answers hold while it stays (and a
// refusal until its recheck).
func (t *leaseTrust) generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}

// forgetExcept drops the verdicts of Leases that are gone.
func (t *leaseTrust) forgetExcept(names map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.verdicts {
		if !names[name] {
			delete(t.verdicts, name)
		}
	}
}

// Start runs the checks; Stop ends them.
func (t *leaseTrust) Start(ctx context.Context) { t.loop.start(ctx, t.run) }

// Stop stops what Start began.
func (t *leaseTrust) Stop() { t.loop.stop() }

func (t *leaseTrust) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
		}
		t.flush(ctx)
	}
}

// flush checks every pending Lease.
func (t *leaseTrust) flush(ctx context.Context) {
	t.mu.Lock()
	pending := t.pending
	t.pending = map[string]k8s.DrainLease{}
	t.mu.Unlock()
	for name, l := range pending {
		v := t.check(ctx, l)
		t.mu.Lock()
		t.verdicts[name] = v
		t.gen++
		t.mu.Unlock()
	}
	if len(pending) > 0 && t.requestPass != nil {
		t.requestPass()
	}
}

// check reads the Lease's pod: it must exist with the Lease's UID, run on
// the holder, and have the Lease's IPs (the others are dropped).
func (t *leaseTrust) check(ctx context.Context, l k8s.DrainLease) *leaseVerdict {
	v := &leaseVerdict{lease: l, checked: t.clock.Now()}
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	p, err := t.pods.Pods(l.PodNamespace).Get(ctx, l.PodName, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			t.log.Warn("checking a drain Lease's pod", "lease", l.Name, logKeyErr, err)
		}
		return v
	}
	pod := k8s.PodFrom(p)
	if pod.UID != l.PodUID || pod.Node != l.Holder {
		t.log.Warn("drain Lease not honoured: its holder does not host the pod", "lease", l.Name, "holder", l.Holder, "node", pod.Node)
		return v
	}
	for _, ip := range l.IPs {
		if slices.Contains(pod.IPs, ip) {
			v.ips = append(v.ips, ip)
		}
	}
	v.ok = len(v.ips) > 0
	return v
}
