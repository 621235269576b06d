package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/draind/draind/k8s"
)

// maxQuiet bounds ?quiet=: longer is surely a mistake.
const maxQuiet = 5 * time.Minute

// offline starts (or joins) the drain of the pod calling from ip and, with
// wait > 0, blocks until it is drained or wait passes.
func (l *hostedDrains) offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) OfflineResult {
	p := l.podByIP(ip)
	if p == nil {
		return OfflineResult{Error: fmt.Sprintf("%s is not a pod on node %s", ip, l.cfg.Node), code: http.StatusForbidden}
	}
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	if wait > 0 {
		// Reserve the slot now: the check and the count must be one step.
		if l.nwait >= l.cfg.MaxWaiters {
			l.mu.Unlock()
			return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "too many concurrent waits", code: http.StatusTooManyRequests}
		}
		l.nwait++
	}
	reserved := wait > 0
	defer func() {
		if reserved { // the call ended before it became a waiter
			l.mu.Lock()
			l.nwait--
			l.mu.Unlock()
		}
	}()
	ld := l.pods[p.UID]
	created := ld == nil || ld.state == StateCancelled
	if created {
		ld = l.start(p, k8s.ReasonOffline, now, true)
	}
	needPublish := !ld.published
	l.mu.Unlock()
	if needPublish {
		if err := l.publish(ctx, ld, now); err != nil {
			l.mu.Lock()
			if created && l.pods[p.UID] == ld && !ld.published {
				delete(l.pods, p.UID)
			}
			l.mu.Unlock()
			return OfflineResult{Pod: p.Namespace + "/" + p.Name, Error: "publishing the drain: " + err.Error(), code: http.StatusServiceUnavailable}
		}
		l.cfg.RequestPass()
	}
	l.mu.Lock()
	if wait <= 0 {
		r := l.resultOf(ld, now, nil, ld.state, http.StatusOK)
		l.mu.Unlock()
		return r
	}
	w := &waiter{quiet: quiet, deadline: now.Add(wait), started: now, done: make(chan OfflineResult, 1)}
	ld.waiters = append(ld.waiters, w)
	reserved = false                // the waiter owns the slot now; settling releases it
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
				l.nwait--
				return OfflineResult{Error: "caller went away", code: 499}
			}
		}
		return <-w.done // settled meanwhile
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
		delete(l.pods, p.UID)
		l.cfg.Metrics.DrainOutcomes.WithLabelValues("cancelled").Inc()
	}
	l.mu.Unlock()
	l.cfg.RequestPass()
	return res
}

// parseDuration accepts Go durations ("30s") and plain seconds ("30").
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		if n < 0 || n > 1e6 {
			return 0, fmt.Errorf("duration %q out of range", s)
		}
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("negative duration %q", s)
	}
	return d, nil
}

// Handler serves the node-local API: /v1/offline, /v1/online, /healthz,
// /readyz. It listens on the node (hostNetwork); the caller's source IP
// identifies the pod, so a pod can only drain itself.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, path string, r OfflineResult) {
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
		json.NewEncoder(w).Encode(r)
	}
	caller := func(r *http.Request) (netip.Addr, error) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			return netip.Addr{}, err
		}
		a, err := netip.ParseAddr(host)
		return a.Unmap(), err
	}
	mux.HandleFunc("/v1/offline", func(w http.ResponseWriter, r *http.Request) {
		const path = "/v1/offline"
		if r.Method != http.MethodGet && r.Method != http.MethodPost {
			reply(w, path, OfflineResult{Error: "use GET or POST", code: http.StatusMethodNotAllowed})
			return
		}
		if !d.Ready() {
			reply(w, path, OfflineResult{Error: errNotReady.Error(), code: http.StatusServiceUnavailable})
			return
		}
		q := r.URL.Query()
		for k := range q {
			if k != "wait" && k != "quiet" {
				reply(w, path, OfflineResult{Error: "unknown parameter " + strconv.Quote(k), code: http.StatusBadRequest})
				return
			}
		}
		wait, err := parseDuration(q.Get("wait"))
		if err != nil {
			reply(w, path, OfflineResult{Error: "wait: " + err.Error(), code: http.StatusBadRequest})
			return
		}
		quiet := d.cfg.Quiet
		if q.Has("quiet") {
			if quiet, err = parseDuration(q.Get("quiet")); err != nil || quiet > maxQuiet {
				if err == nil {
					err = fmt.Errorf("at most %s", maxQuiet)
				}
				reply(w, path, OfflineResult{Error: "quiet: " + err.Error(), code: http.StatusBadRequest})
				return
			}
		}
		wait = min(wait, d.cfg.MaxWait)
		ip, err := caller(r)
		if err != nil {
			reply(w, path, OfflineResult{Error: "unknown caller", code: http.StatusForbidden})
			return
		}
		reply(w, path, d.hosted.offline(r.Context(), ip, wait, quiet))
	})
	mux.HandleFunc("/v1/online", func(w http.ResponseWriter, r *http.Request) {
		const path = "/v1/online"
		if r.Method != http.MethodPost {
			reply(w, path, OfflineResult{Error: "use POST", code: http.StatusMethodNotAllowed})
			return
		}
		if !d.Ready() {
			reply(w, path, OfflineResult{Error: errNotReady.Error(), code: http.StatusServiceUnavailable})
			return
		}
		ip, err := caller(r)
		if err != nil {
			reply(w, path, OfflineResult{Error: "unknown caller", code: http.StatusForbidden})
			return
		}
		reply(w, path, d.hosted.online(r.Context(), ip))
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if !d.Ready() {
			http.Error(w, "not ready: informers syncing or programs not attached", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return http.MaxBytesHandler(mux, 4<<10)
}

// NewHTTPServer wraps Handler with limits against slow and greedy clients.
func (d *Daemon) NewHTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:    addr,
		Handler: d.Handler(),
		// No ReadTimeout: it would also cancel the context of a long
		// ?wait= call. Bodies are tiny and capped by MaxBytesHandler.
		ReadHeaderTimeout: d.cfg.HeaderTimeout,
		WriteTimeout:      d.cfg.MaxWait + 30*time.Second,
		IdleTimeout:       60 * time.Second,
		MaxHeaderBytes:    8 << 10,
	}
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
