package lease

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

	"github.com/draind/draind/daemon/internal/runloop"
	"github.com/draind/draind/k8s"
)

// verdict is what the Pod object said about a Lease.
type verdict struct {
	lease   k8s.DrainLease // the Lease as checked (identity, holder, IPs)
	ok      bool
	ips     []netip.Addr
	checked time.Time
}

// Trust checks Leases of pods no trusted slice lists against their Pod
// objects for Judge, off the runner's path: a pass asks, a goroutine reads
// the pod, the next pass has the answer. It reads and keeps; byPodObject
// judges.
type Trust struct {
	pods        typedcorev1.PodsGetter
	clock       clock.WithTicker
	log         *slog.Logger
	requestPass func()
	kick        chan struct{}
	loop        runloop.Loop

	mu       sync.Mutex
	verdicts map[string]*verdict // by Lease name
	pending  map[string]k8s.DrainLease
	// inherited are the addresses a previous draind's pinned maps still
	// steered when this one started (Inherit), until EndInherit.
	inherited map[netip.Addr]bool
	// gen changes with every verdict. Invariant: verified's answers (the
	// Pod read of a Lease with the same claim, a refusal until its
	// recheck) hold while gen stays. Checked by the daemon's
	// FuzzSequenceDifferential.
	gen uint64
}

// RecheckAfter is when a refused Lease is checked again (the pod may get
// its IPs or its node later than its Lease).
const RecheckAfter = 5 * time.Second

// NewTrust returns a checker that reads Pod objects through pods;
// requestPass (may be nil) is called when new verdicts are in.
func NewTrust(pods typedcorev1.PodsGetter, c clock.WithTicker, log *slog.Logger, requestPass func()) *Trust {
	return &Trust{pods: pods, clock: c, log: log, requestPass: requestPass, kick: make(chan struct{}, 1),
		verdicts: map[string]*verdict{}, pending: map[string]k8s.DrainLease{}}
}

// sameClaim says whether a and b claim the same pod, holder and IPs: a
// verdict on one holds for the other.
func sameClaim(a, b *k8s.DrainLease) bool {
	return a.PodUID == b.PodUID && a.Holder == b.Holder && a.PodNamespace == b.PodNamespace &&
		a.PodName == b.PodName && slices.Equal(a.IPs, b.IPs)
}

// verified returns the verdict on l, asking for a check when there is none
// (or it is stale). A refusal holds until recheck; the verdict of a check
// asked for changes the generation. Judge.Believed is its one caller.
func (t *Trust) verified(l *k8s.DrainLease) (ips []netip.Addr, ok bool, recheck time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	v := t.verdicts[l.Name]
	if v != nil && sameClaim(&v.lease, l) && (v.ok || t.clock.Since(v.checked) < RecheckAfter) {
		if !v.ok {
			recheck = v.checked.Add(RecheckAfter)
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

// Generation returns gen: the answers of its checks hold while it stays (and a
// refusal until its recheck).
func (t *Trust) Generation() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.gen
}

// ForgetExcept drops the verdicts of Leases not in names (they are gone).
func (t *Trust) ForgetExcept(names map[string]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name := range t.verdicts {
		if !names[name] {
			delete(t.verdicts, name)
		}
	}
}

// Inherit hands over what the pinned maps of a previous draind still
// steered when this one started: the addresses of its unexpired entries.
// Until EndInherit, a Lease whose pod the API no longer has (no pod of its
// name, or one with another UID) is honoured
// for those of its IPs (the previous draind confirmed them, and its pod is
// gone since: nothing else can confirm them now). A pod that still exists
// is checked as usual.
func (t *Trust) Inherit(ips map[netip.Addr]bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inherited = ips
}

// EndInherit ends what Inherit began (the verdicts it gave stay).
func (t *Trust) EndInherit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inherited = nil
}

// Start runs the checks on a goroutine of their own; Stop ends them.
func (t *Trust) Start(ctx context.Context) { t.loop.Start(ctx, t.run) }

// Stop stops what Start began and waits for it.
func (t *Trust) Stop() { t.loop.Stop() }

func (t *Trust) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.kick:
		}
		t.Flush(ctx)
	}
}

// Flush checks every pending Lease now and reports whether there was any.
func (t *Trust) Flush(ctx context.Context) bool {
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
	return len(pending) > 0
}

// check reads the Lease's pod and judges the Lease by it (byPodObject):
// the pod must exist with the Lease's UID, run on the holder, and have the
// Lease's IPs (the others are dropped); a pod the API no longer has counts
// for the inherited addresses. A failed read refuses it until its recheck.
func (t *Trust) check(ctx context.Context, l k8s.DrainLease) *verdict {
	v := &verdict{lease: l, checked: t.clock.Now()}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	p, err := t.pods.Pods(l.PodNamespace).Get(ctx, l.PodName, metav1.GetOptions{})
	var pod *k8s.Pod
	switch {
	case err == nil:
		if pod = k8s.PodFrom(p); pod.UID != l.PodUID {
			pod = nil // another pod of the same name (a StatefulSet's): the Lease's is gone
		}
	case !apierrors.IsNotFound(err):
		t.log.Warn("checking a drain Lease's pod", "lease", l.Name, "err", err)
		return v
	}
	t.mu.Lock()
	v.ips, v.ok = byPodObject(&l, pod, t.inherited)
	t.mu.Unlock()
	switch {
	case pod == nil && v.ok:
		t.log.Info("drain Lease honoured as pinned: its pod is gone", "lease", l.Name, "ips", v.ips)
	case pod != nil && pod.Node != l.Holder:
		t.log.Warn("drain Lease not honoured: its holder does not host the pod", "lease", l.Name, "holder", l.Holder, "node", pod.Node)
	}
	return v
}
