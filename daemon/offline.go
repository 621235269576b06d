package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/k8s"
)

// maxQuiet bounds ?quiet=: longer is surely a mistake.
const maxQuiet = 5 * time.Minute

// offline starts (or joins) the drain of the pod calling from ip and, with
// wait > 0, blocks until it is drained, wait passes, or the caller goes
// away.
func (l *hostedDrains) offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) OfflineResult {
	p := l.podByIP(ip)
	if p == nil {
		return OfflineResult{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), code: http.StatusForbidden}
	}
	if wait > 0 && !l.reserve(p.UID) {
		return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "too many concurrent waits", code: http.StatusTooManyRequests}
	}
	now := l.cfg.Clock.Now()
	ld, err := l.join(ctx, p, now)
	if err != nil {
		if wait > 0 {
			l.mu.Lock()
			l.release(p.UID)
			l.mu.Unlock()
		}
		return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "publishing the drain: " + err.Error(), code: http.StatusServiceUnavailable}
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
	l.wake()
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
				return OfflineResult{Error: "caller went away", code: 499}
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
		return OfflineResult{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), code: http.StatusForbidden}
	}
	res := OfflineResult{Pod: p.Namespace + "/" + p.Name, code: http.StatusOK, State: "online"}
	if p.Deleting() {
		res.Error, res.code = "the pod is being deleted: its drain cannot be undone", http.StatusConflict
		return res
	}
	l.writer.drop(k8s.LeaseName(p.UID))
	dctx, cancel := context.WithTimeout(ctx, leaseCallTimeout)
	err := l.cfg.Leases.Delete(dctx, k8s.LeaseName(p.UID))
	cancel()
	l.cfg.Metrics.LeaseOps.WithLabelValues("delete", result(err)).Inc()
	if err != nil {
		res.Error, res.code = err.Error(), http.StatusServiceUnavailable
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

// parseDuration accepts plain decimal seconds ("30", "2.5") and Go
// durations without a sign ("30s", "1m30s"); nothing else: no sign, no
// exponent, no hexadecimal, no digit separators, no NaN or infinity. A
// value beyond maxDuration is an error: a duration that cannot be compared
// would skip the quiet period.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	var d time.Duration
	switch {
	case plainSeconds.MatchString(s):
		n, err := strconv.ParseFloat(s, 64)
		if err != nil || n > maxDuration.Seconds() {
			return 0, fmt.Errorf("duration %q out of range (0 to %s)", s, maxDuration)
		}
		d = time.Duration(n * float64(time.Second))
	case goDuration.MatchString(s):
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("bad duration %q", s)
		}
	default:
		return 0, fmt.Errorf("bad duration %q: want seconds (30, 2.5) or a Go duration (30s, 1m30s)", s)
	}
	if d < 0 || d > maxDuration {
		return 0, fmt.Errorf("duration %q out of range (0 to %s)", s, maxDuration)
	}
	return d, nil
}

var (
	plainSeconds = regexp.MustCompile(`^[0-9]{1,6}(\.[0-9]{1,9})?$`)
	goDuration   = regexp.MustCompile(`^([0-9]{1,9}(\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$`)
)

// maxDuration bounds every duration parameter (far above any sane wait).
const maxDuration = 24 * time.Hour

// offlineRequest is a parsed /v1/offline query.
type offlineRequest struct {
	wait, quiet time.Duration
}

// parseOfflineQuery validates the query of /v1/offline: only wait and
// quiet, each at most once. defQuiet is used when quiet is absent; wait is
// capped at maxWait.
func parseOfflineQuery(q url.Values, defQuiet, maxWait time.Duration) (offlineRequest, error) {
	req := offlineRequest{quiet: defQuiet}
	for k, v := range q {
		if k != "wait" && k != "quiet" {
			return req, fmt.Errorf("unknown parameter %q", k)
		}
		if len(v) != 1 {
			return req, fmt.Errorf("%s: given %d times", k, len(v))
		}
	}
	var err error
	if req.wait, err = parseDuration(q.Get("wait")); err != nil {
		return req, fmt.Errorf("wait: %w", err)
	}
	if q.Has("quiet") {
		if req.quiet, err = parseDuration(q.Get("quiet")); err != nil {
			return req, fmt.Errorf("quiet: %w", err)
		}
		if req.quiet > maxQuiet {
			return req, fmt.Errorf("quiet: at most %s", maxQuiet)
		}
	}
	req.wait = min(req.wait, maxWait)
	return req, nil
}

// Handler serves the node-local API: POST /v1/offline, POST /v1/online,
// /healthz, /readyz. It listens on the node (hostNetwork); the caller's
// source IP identifies the pod, so a pod can only drain itself. Only POST
// acts: a GET (a prefetcher, a probe) never starts a drain.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/offline", d.serveOffline)
	mux.HandleFunc("POST /v1/online", d.serveOnline)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !d.Ready() {
			http.Error(w, "not ready: informers syncing or programs not attached", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return withBodyDeadline(http.MaxBytesHandler(mux, maxBodyBytes), d.cfg.BodyTimeout)
}

func (d *Daemon) serveOffline(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/offline"
	if err := d.readBody(w, r); err != nil {
		d.reply(w, path, OfflineResult{Error: "reading the request body: " + err.Error(), code: bodyErrorCode(err)})
		return
	}
	if !d.Ready() {
		d.reply(w, path, OfflineResult{Error: errNotReady.Error(), code: http.StatusServiceUnavailable})
		return
	}
	req, err := parseOfflineQuery(r.URL.Query(), d.cfg.Quiet, d.cfg.MaxWait)
	if err != nil {
		d.reply(w, path, OfflineResult{Error: err.Error(), code: http.StatusBadRequest})
		return
	}
	ip, err := callerOf(r)
	if err != nil {
		d.reply(w, path, OfflineResult{Error: "unknown caller", code: http.StatusForbidden})
		return
	}
	d.reply(w, path, d.hosted.offline(r.Context(), ip, req.wait, req.quiet))
}

func (d *Daemon) serveOnline(w http.ResponseWriter, r *http.Request) {
	const path = "/v1/online"
	if err := d.readBody(w, r); err != nil {
		d.reply(w, path, OfflineResult{Error: "reading the request body: " + err.Error(), code: bodyErrorCode(err)})
		return
	}
	if !d.Ready() {
		d.reply(w, path, OfflineResult{Error: errNotReady.Error(), code: http.StatusServiceUnavailable})
		return
	}
	ip, err := callerOf(r)
	if err != nil {
		d.reply(w, path, OfflineResult{Error: "unknown caller", code: http.StatusForbidden})
		return
	}
	d.reply(w, path, d.hosted.online(r.Context(), ip))
}

// bodyErrorCode answers a body that failed to arrive: too large (413) or
// too slow (408).
func bodyErrorCode(err error) int {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return http.StatusRequestEntityTooLarge
	}
	return http.StatusRequestTimeout
}

// reply writes an answer and counts it.
func (d *Daemon) reply(w http.ResponseWriter, path string, r OfflineResult) {
	code := r.code
	if code == 0 {
		code = http.StatusOK
	}
	d.Metrics.OfflineRequests.WithLabelValues(path, strconv.Itoa(code)).Inc()
	w.Header().Set("Content-Type", "application/json")
	if code == 499 {
		return // nobody listens
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(r) // the caller hung up: nothing to tell it
}

// callerOf is the address a request came from.
func callerOf(r *http.Request) (netip.Addr, error) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, err
	}
	return ap.Addr().Unmap(), nil
}

// NewHTTPServer wraps Handler with limits against slow and greedy clients.
func (d *Daemon) NewHTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:    addr,
		Handler: d.Handler(),
		// No ReadTimeout: it would also cancel the context of a long
		// ?wait= call. Every request's body has its own deadline
		// (withBodyDeadline), and bodies are capped by MaxBytesHandler.
		ReadHeaderTimeout: d.cfg.HeaderTimeout,
		WriteTimeout:      d.cfg.MaxWait + 30*time.Second,
		IdleTimeout:       localIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ConnState:         d.countConn,
	}
}

// ServeOffline serves the offline API on l until ctx ends, with at most
// MaxConnections open at once (more are answered 503 and closed).
func (d *Daemon) ServeOffline(ctx context.Context, l net.Listener) error {
	return Serve(ctx, d.NewHTTPServer(l.Addr().String()), CapListener(l, d.cfg.MaxConnections, d.Metrics.OfflineConnsRefused.Inc))
}

// countConn tracks the offline API's open connections (status, tests).
func (d *Daemon) countConn(_ net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		d.conns.Add(1)
	case http.StateClosed, http.StateHijacked:
		d.conns.Add(-1)
	}
}

// readBody reads (and drops) the request body within BodyTimeout, then lifts
// the deadline. Until the body is read the server does not watch the
// connection, so a caller that went away would hold its wait slot until
// the wait ended; a body that never comes would hold the connection.
func (d *Daemon) readBody(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	// The kernel's clock, not d.clock: a socket deadline is wall time.
	if err := rc.SetReadDeadline(time.Now().Add(d.cfg.BodyTimeout)); err != nil {
		return nil // not a connection that supports deadlines (tests)
	}
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		w.Header().Set("Connection", "close") // what is left of the body is never read
		return err
	}
	// A deadline left in place would cut the wait at BodyTimeout: fail the
	// call instead.
	return rc.SetReadDeadline(time.Time{})
}

// ErrServerClosed is returned by Serve after Shutdown.
var ErrServerClosed = http.ErrServerClosed

// Serve runs srv on l until ctx ends.
func Serve(ctx context.Context, srv *http.Server, l net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		return nil
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
