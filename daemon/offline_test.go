package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// httpFixture serves the offline API on 127.0.0.1 for a pod whose IP is
// 127.0.0.1 (the caller identity of a loopback client). It runs outside a
// synctest bubble (realTime): the API needs a real TCP socket, whose peer
// address is the caller's identity, and net.Pipe has none.
type httpFixture struct {
	*harness
	addr  string
	conns *countingListener
}

// openConnections is how many connections the offline API holds open.
func (f *httpFixture) openConnections() int { return int(f.conns.open.Load()) }

// countingListener counts the connections it accepted that are still open
// on the server's side.
type countingListener struct {
	net.Listener
	open atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

// countedConn leaves the count when first closed, before its socket
// closes: a client that sees the connection end finds it uncounted.
type countedConn struct {
	net.Conn
	l    *countingListener
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func newHTTPFixture(t *testing.T, mod ...func(*Config)) *httpFixture {
	h := startHarness(t, true, mod...)
	h.addService(webService())
	h.putSlice(slice("web-1", "web", v4, httpPorts(8080), ready("127.0.0.1", "p0"), onNode(ready("10.0.0.2", "p1"), "node-b")))
	h.putPod(pod("pod-p0", "p0", "127.0.0.1"))
	h.pass()
	h.d.firstDone.Store(true)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { h.d.API().Serve(ctx, cl); close(done) }()
	t.Cleanup(func() {
		h.d.hosted.Stop("the test is over") // pending waits answer, as at a stop
		cancel()
		<-done
	})
	return &httpFixture{harness: h, addr: l.Addr().String(), conns: cl}
}

func (f *httpFixture) get(t *testing.T, method, path string, from string) (int, OfflineResult) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	if from != "" {
		c.Transport = &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}).DialContext}
	}
	req, _ := http.NewRequest(method, "http://"+f.addr+path, nil)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r OfflineResult
	body, _ := io.ReadAll(resp.Body)
	json.Unmarshal(body, &r)
	return resp.StatusCode, r
}

func TestOfflineAPIStatusCodes(t *testing.T) {
	f := newHTTPFixture(t)
	for _, tc := range []struct {
		name, method, path, from string
		code                     int
	}{
		{"bad wait", "POST", "/v1/offline?wait=soon", "", 400},
		{"negative wait", "POST", "/v1/offline?wait=-5s", "", 400},
		{"quiet too long", "POST", "/v1/offline?quiet=1h", "", 400},
		{"unknown parameter", "POST", "/v1/offline?wiat=30s", "", 400},
		{"wrong method", "PUT", "/v1/offline", "", 405},
		{"online needs POST", "GET", "/v1/online", "", 405},
		{"foreign caller", "POST", "/v1/offline?wait=1s", "127.0.0.2", 403},
		{"foreign caller online", "POST", "/v1/online", "127.0.0.2", 403},
		{"huge query string", "GET", "/v1/offline?wait=1s&x=" + strings.Repeat("a", 64<<10), "", 431},
		{"health", "GET", "/healthz", "", 200},
		{"ready", "GET", "/readyz", "", 200},
		{"accepted without wait", "POST", "/v1/offline", "", 200},
		{"seconds as a number", "POST", "/v1/offline?wait=0&quiet=1.5", "", 200},
		{"GET never acts", "GET", "/v1/offline", "", 405},
		{"NaN wait", "POST", "/v1/offline?wait=NaN", "", 400},
		{"NaN quiet", "POST", "/v1/offline?quiet=NaN", "", 400},
		{"infinite quiet", "POST", "/v1/offline?quiet=Inf", "", 400},
		{"overflowing wait", "POST", "/v1/offline?wait=1e300", "", 400},
		{"overflowing Go duration", "POST", "/v1/offline?wait=9999999999h", "", 400},
		{"repeated parameter", "POST", "/v1/offline?wait=1s&wait=2s", "", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, r := f.get(t, tc.method, tc.path, tc.from)
			if code != tc.code {
				t.Errorf("%s %s: got %d %+v, want %d", tc.method, tc.path, code, r, tc.code)
			}
			if code >= 400 && code != 431 && tc.method != "GET" && r.Error == "" && code != 405 {
				t.Errorf("error answer without a message: %+v", r)
			}
		})
	}
	// Not ready: the API says so instead of pretending.
	f.d.SetAttached(false)
	if code, _ := f.get(t, "POST", "/v1/offline", ""); code != 503 {
		t.Errorf("offline while not ready: %d, want 503", code)
	}
	if code, _ := f.get(t, "GET", "/readyz", ""); code != 503 {
		t.Errorf("readyz while not ready: %d, want 503", code)
	}
}

func TestOfflineAPISlowClient(t *testing.T) {
	f := newHTTPFixture(t, func(c *Config) { c.HeaderTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Half a request line, then nothing: the server must hang up.
	io.WriteString(c, "POST /v1/offline?wait=30s HTTP/1.1\r\nHost: x\r\n")
	start := time.Now()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = bufio.NewReader(c).ReadByte()
	if err == nil {
		// A 408 answer is fine too, as long as the connection then ends.
		_, err = io.ReadAll(c)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("a slow client held a connection for %v", time.Since(start))
	}
}

func (f *httpFixture) openConn2(endpoint string) {
	f.ct.AddFlow(flowTo(endpoint))
}
