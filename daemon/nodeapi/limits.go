package nodeapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits of every HTTP listener draind opens: the offline API on the node,
// the metrics and health endpoints, the status socket and the webhook. A
// client gets a bounded time for its headers, its body and between
// requests, a bounded header and body size, and a listener past its
// connection cap answers 503 and closes rather than leaving connections
// queued in the kernel.
const (
	maxHeaderBytes = 8 << 10
	maxBodyBytes   = 4 << 10

	localHeaderTimeout = 5 * time.Second
	localReadTimeout   = 10 * time.Second
	localWriteTimeout  = 30 * time.Second
	localIdleTimeout   = 60 * time.Second
)

// BoundedServer returns a server for a small API without long calls
// (metrics, health, status): headers, the whole request, the answer and
// idle keep-alives each have a deadline, and bodies and headers are capped.
func BoundedServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           http.MaxBytesHandler(h, maxBodyBytes),
		ReadHeaderTimeout: localHeaderTimeout,
		ReadTimeout:       localReadTimeout,
		WriteTimeout:      localWriteTimeout,
		IdleTimeout:       localIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// withBodyDeadline gives every request's body d to arrive, whatever the
// path or method: a handler that never reads the body (an unknown path, a
// 405) would otherwise leave the server draining it after the answer with
// no deadline. readBody lifts the deadline once an offline call's body is
// in, so its wait can notice a caller that goes away. The server resets
// the connection's deadline for the next request.
func withBodyDeadline(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The kernel's clock: a socket deadline is wall time.
		// A connection without deadlines (a test's pipe) serves on
		// unbounded: every listener draind opens has them.
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}

// capListener accepts at most cap connections at once; one more is
// answered 503 and closed at once, so a client past the cap learns it
// instead of waiting in the accept queue behind slow clients.
type capListener struct {
	net.Listener
	slots   chan struct{}
	refused func()
}

// CapListener wraps l with a connection cap; refused (may be nil) is told
// of every connection turned away.
func CapListener(l net.Listener, max int, refused func()) net.Listener {
	return &capListener{Listener: l, slots: make(chan struct{}, max), refused: refused}
}

// overCapAnswer is what a connection past the cap gets.
var overCapAnswer = []byte("HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n" +
	"Content-Length: 26\r\n\r\ntoo many open connections\n")

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &capConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
		}
		// A fresh socket's send buffer takes the answer without waiting;
		// the deadline only guards against the unexpected.
		// Counted before the answer: a client that reads the 503 then
		// finds it counted.
		if l.refused != nil {
			l.refused()
		}
		// Best effort: the connection is closed either way.
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = c.Write(overCapAnswer)
		c.Close()
	}
}

// capConn gives its slot back when closed (once).
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

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
