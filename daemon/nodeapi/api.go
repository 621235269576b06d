package nodeapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPort is the offline API's port: the default of `draind run
// --offline-addr` and of `draind offline --port`.
const DefaultPort = 9460

// Result is the answer of /v1/offline and /v1/online.
type Result struct {
	Pod             string  `json:"pod"`
	State           string  `json:"state"`
	Drained         bool    `json:"drained"`
	WaitedSeconds   float64 `json:"waited_seconds"`
	SYNs            uint64  `json:"syns"`
	LiveConnections int     `json:"live_connections"`
	Steered         uint64  `json:"steered"`
	// LiveSockets and LiveConntrack are each source's count of live
	// connections, LiveSource the one LiveConnections came from
	// (package hosted, live.go); LiveSocketsPartial: the pod predates socket
	// counting.
	LiveSockets        *int   `json:"live_sockets,omitempty"`
	LiveConntrack      *int   `json:"live_conntrack,omitempty"`
	LiveSource         string `json:"live_source,omitempty"`
	LiveSocketsPartial bool   `json:"live_sockets_partial,omitempty"`
	Error              string `json:"error,omitempty"`
	// Code is the HTTP status (0: 200; 499: the caller went away, no
	// answer is written).
	Code int `json:"-"`
}

// Drains is what the API asks of the node agent.
type Drains interface {
	// Offline starts (or joins) the drain of the pod calling from ip and,
	// with wait > 0, blocks until it is drained, wait passes, or ctx ends.
	Offline(ctx context.Context, ip netip.Addr, wait, quiet time.Duration) Result
	// Online undoes the drain of the pod calling from ip.
	Online(ctx context.Context, ip netip.Addr) Result
	// Ready reports whether drains can be served (informers synced,
	// programs attached).
	Ready() bool
}

// Config are the API's limits and counters.
type Config struct {
	Quiet          time.Duration // ?quiet= when absent
	MaxWait        time.Duration // ?wait= is capped at this
	BodyTimeout    time.Duration // a request body must arrive within this
	HeaderTimeout  time.Duration // request headers must arrive within this
	MaxConnections int           // open at once; more are answered 503
	// Requests counts answers by path and status code (may be nil).
	Requests *prometheus.CounterVec
	// ConnsRefused is told of every connection past MaxConnections (may
	// be nil).
	ConnsRefused func()
}

// Server serves the API.
type Server struct {
	drains Drains
	cfg    Config
}

// New returns the API of drains.
func New(drains Drains, cfg Config) *Server { return &Server{drains: drains, cfg: cfg} }

// ErrNotReady is the answer before the node agent is ready.
var ErrNotReady = errors.New("draind is not ready")

// Handler serves the node-local API: POST /v1/offline, POST /v1/online,
// /healthz, /readyz. It listens on the node (hostNetwork); the caller's
// source IP identifies the pod, so a pod can only drain itself. Only POST
// acts: a GET (a prefetcher, a probe) never starts a drain.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/offline", s.serveOffline)
	mux.HandleFunc("POST /v1/online", s.serveOnline)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !s.drains.Ready() {
			http.Error(w, "not ready: informers syncing or programs not attached", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return withBodyDeadline(http.MaxBytesHandler(mux, maxBodyBytes), s.cfg.BodyTimeout)
}

func (s *Server) serveOffline(w http.ResponseWriter, r *http.Request) {
	s.serveCaller(w, r, "/v1/offline", func(ip netip.Addr) Result {
		req, err := parseOfflineQuery(r.URL.Query(), s.cfg.Quiet, s.cfg.MaxWait)
		if err != nil {
			return Result{Error: err.Error(), Code: http.StatusBadRequest}
		}
		return s.drains.Offline(r.Context(), ip, req.wait, req.quiet)
	})
}

func (s *Server) serveOnline(w http.ResponseWriter, r *http.Request) {
	s.serveCaller(w, r, "/v1/online", func(ip netip.Addr) Result {
		return s.drains.Online(r.Context(), ip)
	})
}

// serveCaller answers a call about the caller's own pod: the body read
// within its bounds, draind ready, the caller a pod address; then answer
// has the caller's address.
func (s *Server) serveCaller(w http.ResponseWriter, r *http.Request, path string, answer func(netip.Addr) Result) {
	if err := s.readBody(w, r); err != nil {
		s.reply(w, path, Result{Error: "reading the request body: " + err.Error(), Code: bodyErrorCode(err)})
		return
	}
	if !s.drains.Ready() {
		s.reply(w, path, Result{Error: ErrNotReady.Error(), Code: http.StatusServiceUnavailable})
		return
	}
	ip, err := callerOf(r)
	if err != nil {
		s.reply(w, path, Result{Error: "unknown caller", Code: http.StatusForbidden})
		return
	}
	s.reply(w, path, answer(ip))
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
func (s *Server) reply(w http.ResponseWriter, path string, r Result) {
	code := r.Code
	if code == 0 {
		code = http.StatusOK
	}
	if s.cfg.Requests != nil {
		s.cfg.Requests.WithLabelValues(path, strconv.Itoa(code)).Inc()
	}
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

// HTTPServer wraps Handler with limits against slow and greedy clients.
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:    addr,
		Handler: s.Handler(),
		// No ReadTimeout: it would also cancel the context of a long
		// ?wait= call. Every request's body has its own deadline
		// (withBodyDeadline), and bodies are capped by MaxBytesHandler.
		ReadHeaderTimeout: s.cfg.HeaderTimeout,
		WriteTimeout:      s.cfg.MaxWait + 30*time.Second,
		IdleTimeout:       localIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// Serve serves the API on l until ctx ends, with at most MaxConnections
// open at once (more are answered 503 and closed).
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	return Serve(ctx, s.HTTPServer(l.Addr().String()), CapListener(l, s.cfg.MaxConnections, s.cfg.ConnsRefused))
}

// readBody reads (and drops) the request body within BodyTimeout, then lifts
// the deadline. Until the body is read the server does not watch the
// connection, so a caller that went away would hold its wait slot until
// the wait ended; a body that never comes would hold the connection.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) error {
	rc := http.NewResponseController(w)
	// The kernel's clock: a socket deadline is wall time.
	if err := rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout)); err != nil {
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
