package lease

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"

	"github.com/draind/draind/k8s"
)

// Write is one write of a drain or claim Lease this node holds.
type Write struct {
	Kind Kind
	Req  k8s.DrainRequest  // Publish: the drain to create (or join)
	Ann  map[string]string // Renew: progress annotations
}

// Kind is what a Write does.
type Kind uint8

// The kinds of Write.
const (
	Publish Kind = iota + 1 // create, or renew if it exists
	Renew                   // move the renew time to now
	Delete
)

// String is the kind as the lease_ops metric labels it.
func (k Kind) String() string {
	switch k {
	case Publish:
		return "create"
	case Renew:
		return "renew"
	case Delete:
		return "delete"
	}
	return "unknown"
}

// Result tells the Lease's owner what landed.
type Result struct {
	Name string
	Kind Kind
	At   time.Time // when the write landed (the Lease's new renew time)
	Err  error
}

// Lease write retries: quick enough that a Lease lands well within a second
// of the API server answering again, slow enough not to matter to it.
const (
	retryMin = 100 * time.Millisecond
	// RetryMax is the longest wait before a transient failure is retried.
	RetryMax = 500 * time.Millisecond
	// CallTimeout bounds one API call: a hung API server delays Lease
	// writes, never this node's drains or offline answers.
	CallTimeout = 5 * time.Second
	// A write the API server refused (see Permanent: an admission policy
	// denying it, an invalid object) is retried after refusedMin,
	// doubling up to RefusedMax: not hot, yet soon enough when the refusal
	// was an API server still starting (its authorizer answers 403 until
	// synced).
	refusedMin = time.Second
	// RefusedMax is the longest wait before a refused write is retried.
	RefusedMax = 30 * time.Second
)

// Permanent says whether retrying the same write soon cannot help: 403
// (an admission policy or RBAC denies it), 422 (invalid), and a renewal of
// a Lease that no longer exists (Gone: never retried).
func Permanent(kind Kind, err error) bool {
	return apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || Gone(kind, err)
}

// Gone says whether a write failed because its Lease no longer exists
// (someone deleted it): not retried at all.
func Gone(kind Kind, err error) bool {
	return kind == Renew && apierrors.IsNotFound(err)
}

// Writer performs this node's Lease writes (drain and claim Leases), off
// the loop that measures drains and answers offline calls; it is the one
// code path that deletes a Lease (do). It keeps only
// the latest write per Lease, retries each with backoff until it lands,
// and stamps a renewal with the instant it is sent, not the instant it was
// asked for (a renewal that waited out an outage must not land already
// expired).
type Writer struct {
	leases   *k8s.Leases
	duration time.Duration
	clock    clock.Clock
	onResult func(Result)
	kick     chan struct{}

	mu      sync.Mutex
	pending map[string]*pendingWrite
}

type pendingWrite struct {
	w        Write
	failures int // in a row, of any kind: the transient backoff
	// refusals in a row: the refused backoff, which starts over after an
	// outage's transient failures (see refusedMin)
	refusals int
	next     time.Time
}

// NewWriter returns a writer of Leases through leases, renewing each for
// duration; onResult (may be nil) is told of every write that landed or
// failed, on the writer's goroutine.
func NewWriter(leases *k8s.Leases, duration time.Duration, c clock.Clock, onResult func(Result)) *Writer {
	return &Writer{leases: leases, duration: duration, clock: c, onResult: onResult,
		kick: make(chan struct{}, 1), pending: map[string]*pendingWrite{}}
}

// Want records the write a Lease needs; a later write of the same Lease
// replaces an earlier one that has not landed yet.
func (lw *Writer) Want(name string, w Write) {
	lw.mu.Lock()
	p := lw.pending[name]
	switch {
	case p == nil:
		lw.pending[name] = &pendingWrite{w: w}
	case p.w.Kind == Publish && w.Kind == Renew:
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

// Has reports whether a write of name waits.
func (lw *Writer) Has(name string) bool {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.pending[name] != nil
}

// Drop forgets the write waiting for name (the drain ended).
func (lw *Writer) Drop(name string) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	delete(lw.pending, name)
}

// DeleteNow deletes Lease name at once and returns the error (Leases
// absent count as deleted), for a caller whose answer waits for the
// deletion; the write waiting for name is dropped first. The caller
// reports the result: onResult is not told.
func (lw *Writer) DeleteNow(ctx context.Context, name string) error {
	lw.Drop(name)
	_, err := lw.do(ctx, name, Write{Kind: Delete})
	return err
}

// Run writes until ctx ends.
func (lw *Writer) Run(ctx context.Context) {
	t := lw.clock.NewTimer(RetryMax)
	defer t.Stop()
	for {
		lw.Flush(ctx)
		t.Reset(retryMin)
		select {
		case <-ctx.Done():
			return
		case <-lw.kick:
		case <-t.C():
		}
	}
}

// Flush sends every due write once.
func (lw *Writer) Flush(ctx context.Context) {
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
		var w Write
		if p != nil {
			w = p.w // want may replace it concurrently
		}
		lw.mu.Unlock()
		if p == nil {
			continue
		}
		at, err := lw.do(ctx, name, w)
		if w.Kind == Delete && apierrors.IsNotFound(err) {
			err = nil // already deleted: what the write wanted
		}
		lw.mu.Lock()
		if cur := lw.pending[name]; cur == p {
			switch {
			case err == nil:
				if cur.w.Kind == w.Kind {
					delete(lw.pending, name)
				}
			case Gone(w.Kind, err):
				// Renewing a Lease that no longer exists cannot land:
				// the write ends here, and its owner decides (onResult)
				// whether to create it again or end the drain.
				if cur.w.Kind == w.Kind {
					delete(lw.pending, name)
				}
			case Permanent(w.Kind, err):
				cur.failures++
				cur.refusals++
				cur.next = lw.clock.Now().Add(min(refusedMin<<min(cur.refusals-1, 8), RefusedMax))
			default:
				cur.failures++
				cur.refusals = 0
				cur.next = lw.clock.Now().Add(min(retryMin<<min(cur.failures-1, 8), RetryMax))
			}
		}
		lw.mu.Unlock()
		if lw.onResult != nil {
			lw.onResult(Result{Name: name, Kind: w.Kind, At: at, Err: err})
		}
	}
}

// do performs one write.
func (lw *Writer) do(ctx context.Context, name string, w Write) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	now := lw.clock.Now()
	switch w.Kind {
	case Publish:
		_, _, err := lw.leases.Publish(ctx, w.Req, now)
		return now, err
	case Renew:
		_, err := lw.leases.Renew(ctx, name, lw.duration, now, w.Ann)
		return now, err
	case Delete:
		return now, lw.leases.Delete(ctx, name)
	}
	return now, errors.New("unknown lease write")
}
