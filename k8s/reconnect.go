package k8s

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// Reconnect retries of list and watch calls while the API server cannot be
// reached. The informers' reflector backs off exponentially up to 30 s
// (with jitter, up to a minute) on such errors, so after an outage of a
// minute a node would learn of a renewed drain Lease a minute late. Inside
// the ListerWatcher the call is instead retried every ~0.1-0.3 s, so every
// node reconnects within a fraction of a second of the API server answering
// again, and the reflector never sees the error (nor grows its backoff).
// Refused connections cost the server nothing; the jitter spreads a large
// cluster's reconnects.
const (
	reconnectMin    = 100 * time.Millisecond
	reconnectJitter = 200 * time.Millisecond
)

// unreachable reports whether err means the API server could not be
// reached or is not serving yet, as opposed to an answer (403, 410, ...)
// the reflector must see.
func unreachable(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err) ||
		utilnet.IsNoRoutesError(err) || (errors.As(err, &ne) && ne.Timeout()) ||
		apierrors.IsServiceUnavailable(err)
}

// retryUnreachable calls fn until it returns anything but an unreachable
// error, or ctx ends.
func retryUnreachable[T any](ctx context.Context, fn func() (T, error)) (T, error) {
	for {
		v, err := fn()
		if !unreachable(err) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(reconnectMin + rand.N(reconnectJitter)):
		}
	}
}

// reconnecting wraps a ListWatch so that its calls wait out an unreachable
// API server (see reconnectMin).
func reconnecting(lw *cache.ListWatch) *cache.ListWatch {
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return retryUnreachable(ctx, func() (runtime.Object, error) { return list(ctx, o) })
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return retryUnreachable(ctx, func() (watch.Interface, error) { return watchFn(ctx, o) })
		},
	}
}
