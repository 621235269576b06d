package daemon

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

	"github.com/draind/draind/k8s"
)

// leaseWrite is one write of a drain Lease this node holds.
type leaseWrite struct {
	kind leaseWriteKind
	req  k8s.DrainRequest  // publish: the drain to create (or join)
	ann  map[string]string // renew: progress annotations
}

type leaseWriteKind uint8

const (
	leasePublish leaseWriteKind = iota + 1 // create, or renew if it exists
	leaseRenew                             // move the renew time to now
	leaseDelete
)

func (k leaseWriteKind) String() string {
	switch k {
	case leasePublish:
		return "create"
	case leaseRenew:
		return "renew"
	case leaseDelete:
		return "delete"
	}
	return "unknown"
}

// leaseResult tells the drain owner what landed.
type leaseResult struct {
	name string
	kind leaseWriteKind
	at   time.Time // when the write landed (the Lease's new renew time)
	err  error
}

// Lease write retries: quick enough that a Lease lands well within a second
// of the API server answering again, slow enough not to matter to it.
const (
	leaseRetryMin = 100 * time.Millisecond
	leaseRetryMax = 500 * time.Millisecond
	// leaseCallTimeout bounds one API call: a hung API server delays Lease
	// writes, never this node's drains or offline answers.
	leaseCallTimeout = 5 * time.Second
	// A write the API server refused (see permanentLeaseError: an
	// admission policy denying it, an invalid object) is retried after leaseRefusedMin, doubling up to
	// leaseRefusedMax: not hot, yet soon enough when the refusal was an
	// API server still starting (its authorizer answers 403 until synced).
	leaseRefusedMin = time.Second
	leaseRefusedMax = 30 * time.Second
)

// permanentLeaseError says whether retrying the same write soon cannot
// help: 403 (an admission policy or RBAC denies it), 422 (invalid), and a
// renewal of a Lease that no longer exists (leaseGone: never retried).
func permanentLeaseError(kind leaseWriteKind, err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || leaseGone(kind, err)
}

// leaseGone says whether a write failed because its Lease no longer exists
// (someone deleted it): not retried at all.
func leaseGone(kind leaseWriteKind, err error) bool {
	return kind == leaseRenew && apierrors.IsNotFound(err)
}

// leaseWriter performs the drain Lease writes of this node, off the loop
// that measures drains and answers offline calls. It keeps only the latest
// write per Lease, retries each with backoff until it lands, and stamps a
// renewal with the instant it is sent, not the instant it was asked for (a
// renewal that waited out an outage must not land already expired).
type leaseWriter struct {
	leases   *k8s.Leases
	duration time.Duration
	clock    clock.Clock
	log      *slog.Logger
	onResult func(leaseResult)
	kick     chan struct{}

	mu      sync.Mutex
	pending map[string]*pendingWrite
}

type pendingWrite struct {
	w        leaseWrite
	failures int // in a row, of any kind: the transient backoff
	// refusals in a row: the refused backoff, which starts over after an
	// outage's transient failures (see leaseRefusedMin)
	refusals int
	next     time.Time
}

func newLeaseWriter(leases *k8s.Leases, duration time.Duration, c clock.Clock, log *slog.Logger, onResult func(leaseResult)) *leaseWriter {
	return &leaseWriter{leases: leases, duration: duration, clock: c, log: log, onResult: onResult,
		kick: make(chan struct{}, 1), pending: map[string]*pendingWrite{}}
}

// want records the write a Lease needs; a later write of the same Lease
// replaces an earlier one that has not landed yet.
func (lw *leaseWriter) want(name string, w leaseWrite) {
	lw.mu.Lock()
	p := lw.pending[name]
	switch {
	case p == nil:
		lw.pending[name] = &pendingWrite{w: w}
	case p.w.kind == leasePublish && w.kind == leaseRenew:
		// Not created yet: creating it renews it.
	default:
		p.w = w
	}
	lw.mu.Unlock()
	select {
	case lw.kick <- struct{}{}:
	default:
	}
}

// has reports whether a write of name waits.
func (lw *leaseWriter) has(name string) bool {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.pending[name] != nil
}

// drop forgets the write waiting for name (the drain ended).
func (lw *leaseWriter) drop(name string) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	delete(lw.pending, name)
}

// run writes until ctx ends.
func (lw *leaseWriter) run(ctx context.Context) {
	t := lw.clock.NewTimer(leaseRetryMax)
	defer t.Stop()
	for {
		lw.flush(ctx)
		t.Reset(leaseRetryMin)
		select {
		case <-ctx.Done():
			return
		case <-lw.kick:
		case <-t.C():
		}
	}
}

// flush sends every due write once.
func (lw *leaseWriter) flush(ctx context.Context) {
	now := lw.clock.Now()
	lw.mu.Lock()
	names := make([]string, 0, len(lw.pending))
	for name, p := range lw.pending {
		if !now.Before(p.next) {
			names = append(names, name)
		}
	}
	lw.mu.Unlock()
	slices.Sort(names)
	for _, name := range names {
		lw.mu.Lock()
		p := lw.pending[name]
		var w leaseWrite
		if p != nil {
			w = p.w // want may replace it concurrently
		}
		lw.mu.Unlock()
		if p == nil {
			continue
		}
		at, err := lw.do(ctx, name, w)
		if w.kind == leaseDelete && apierrors.IsNotFound(err) {
			err = nil // already deleted: what the write wanted
		}
		lw.mu.Lock()
		if cur := lw.pending[name]; cur == p {
			switch {
			case err == nil:
				if cur.w.kind == w.kind {
					delete(lw.pending, name)
				}
			case leaseGone(w.kind, err):
				// Renewing a Lease that no longer exists cannot land:
				// the write ends here, and its owner decides (onResult)
				// whether to create it again or end the drain.
				if cur.w.kind == w.kind {
					delete(lw.pending, name)
				}
			case permanentLeaseError(w.kind, err):
				cur.failures++
				cur.refusals++
				cur.next = lw.clock.Now().Add(min(leaseRefusedMin<<min(cur.refusals-1, 8), leaseRefusedMax))
			default:
				cur.failures++
				cur.refusals = 0
				cur.next = lw.clock.Now().Add(min(leaseRetryMin<<min(cur.failures-1, 8), leaseRetryMax))
			}
		}
		lw.mu.Unlock()
		if lw.onResult != nil {
			lw.onResult(leaseResult{name: name, kind: w.kind, at: at, err: err})
		}
	}
}

// do performs one write.
func (lw *leaseWriter) do(ctx context.Context, name string, w leaseWrite) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	defer cancel()
	now := lw.clock.Now()
	switch w.kind {
	case leasePublish:
		_, _, err := lw.leases.Publish(ctx, w.req, now)
		return now, err
	case leaseRenew:
		_, err := lw.leases.Renew(ctx, name, lw.duration, now, w.ann)
		return now, err
	case leaseDelete:
		return now, lw.leases.Delete(ctx, name)
	}
	return now, errors.New("unknown lease write")
}
