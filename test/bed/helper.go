package bed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Request is one command to a helper process.
type Request struct {
	Op       string        `json:"op"`
	ID       string        `json:"id,omitempty"`
	Addr     string        `json:"addr,omitempty"`
	Proto    string        `json:"proto,omitempty"` // tcp (default) or udp
	N        int           `json:"n,omitempty"`
	Interval time.Duration `json:"interval,omitempty"`
	Timeout  time.Duration `json:"timeout,omitempty"`
	Line     string        `json:"line,omitempty"`
}

// Response is a helper's answer.
type Response struct {
	Err     string           `json:"err,omitempty"`
	Server  string           `json:"server,omitempty"` // who answered
	OK      int              `json:"ok,omitempty"`
	Fails   map[string]int   `json:"fails,omitempty"` // by error class
	By      map[string]int   `json:"by,omitempty"`    // successes by server
	Last    map[string]int64 `json:"last,omitempty"`  // unix ns of the last success by server
	Elapsed time.Duration    `json:"elapsed,omitempty"`
	// Server statistics.
	Accepted int `json:"accepted,omitempty"`
	Active   int `json:"active,omitempty"`
	// HTTP answers.
	Code int    `json:"code,omitempty"`
	Body string `json:"body,omitempty"`
	// Timeline of a keep-alive client (keepalive.go).
	Timeline []Sample `json:"timeline,omitempty"`
}

// HelperMain runs the helper process if this process is one, and exits;
// otherwise it returns at once. Call it first in main and TestMain.
func HelperMain() {
	if os.Getenv(envHelper) != "1" {
		return
	}
	var err error
	switch {
	case len(os.Args) >= 3 && os.Args[1] == "serve":
		err = serveMain(os.Args[2], os.Args[3:])
	case len(os.Args) >= 2 && os.Args[1] == "client":
		err = clientMain()
	default:
		err = fmt.Errorf("unknown helper mode %q", os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bed helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type rpc struct {
	mu  sync.Mutex
	out *bufio.Writer
}

func (r *rpc) send(resp Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, _ := json.Marshal(resp)
	r.out.Write(append(b, '\n'))
	r.out.Flush()
}

func (r *rpc) loop(handle func(Request) Response) error {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<16), 1<<20)
	for in.Scan() {
		var req Request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			r.send(Response{Err: "bad request: " + err.Error()})
			continue
		}
		if req.Op == "exit" {
			r.send(Response{})
			return nil
		}
		r.send(handle(req))
	}
	return in.Err()
}

// --- server ---------------------------------------------------------------

// serveMain serves "name" on each spec ("tcp:addr" or "udp:addr"). A TCP
// connection is greeted with the name line; every line it sends is answered
// with the name ("sleep <ms>" first waits, an in-flight request).
func serveMain(name string, specs []string) error {
	r := &rpc{out: bufio.NewWriter(os.Stdout)}
	s := &server{name: name, conns: map[net.Conn]struct{}{}}
	for _, spec := range specs {
		proto, addr, ok := strings.Cut(spec, ":")
		if !ok {
			return fmt.Errorf("bad listen spec %q", spec)
		}
		switch proto {
		case "tcp":
			l, err := net.Listen("tcp", addr)
			if err != nil {
				r.send(Response{Err: err.Error()})
				return err
			}
			s.listeners = append(s.listeners, l)
			go s.accept(l)
		case "udp":
			pc, err := net.ListenPacket("udp", addr)
			if err != nil {
				r.send(Response{Err: err.Error()})
				return err
			}
			s.packets = append(s.packets, pc)
			go s.answerUDP(pc)
		default:
			return fmt.Errorf("bad listen spec %q", spec)
		}
	}
	r.send(Response{Server: name}) // ready
	return r.loop(s.handle)
}

type server struct {
	name      string
	listeners []net.Listener
	packets   []net.PacketConn

	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	accepted int
}

func (s *server) accept(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.accepted++
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *server) serveConn(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	if _, err := io.WriteString(c, s.name+"\n"); err != nil {
		return
	}
	in := bufio.NewScanner(c)
	for in.Scan() {
		if ms, ok := strings.CutPrefix(in.Text(), "sleep "); ok {
			n, _ := strconv.Atoi(ms)
			time.Sleep(time.Duration(n) * time.Millisecond)
		}
		if _, err := io.WriteString(c, s.name+"\n"); err != nil {
			return
		}
	}
}

// answerUDP answers every datagram with the name; a datagram "sleep <ms>"
// is answered that much later (a reply on its way meanwhile), without
// holding up the others.
func (s *server) answerUDP(pc net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		ms, ok := strings.CutPrefix(strings.TrimSpace(string(buf[:n])), "sleep ")
		if !ok {
			pc.WriteTo([]byte(s.name+"\n"), from)
			continue
		}
		d, _ := strconv.Atoi(ms)
		time.AfterFunc(time.Duration(d)*time.Millisecond, func() { pc.WriteTo([]byte(s.name+"\n"), from) })
	}
}

func (s *server) handle(req Request) Response {
	switch req.Op {
	case "stats":
		s.mu.Lock()
		defer s.mu.Unlock()
		return Response{Server: s.name, Accepted: s.accepted, Active: len(s.conns)}
	case "stop": // stop accepting: new connections are refused
		for _, l := range s.listeners {
			l.Close()
		}
		for _, pc := range s.packets {
			pc.Close()
		}
		return Response{Server: s.name}
	case "close_all":
		s.mu.Lock()
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		return Response{Server: s.name}
	}
	return Response{Err: "unknown op " + req.Op}
}

// --- client -----------------------------------------------------------------

func clientMain() error {
	r := &rpc{out: bufio.NewWriter(os.Stdout)}
	c := &client{conns: map[string]*bufio.ReadWriter{}, raw: map[string]net.Conn{}, loops: map[string]*loop{}}
	r.send(Response{}) // ready
	return r.loop(c.handle)
}

type client struct {
	conns map[string]*bufio.ReadWriter
	raw   map[string]net.Conn
	loops map[string]*loop
	kas   map[string]*keepalive
}

type loop struct {
	stop chan struct{}
	done chan Response
}

// ErrClass names an error the way the tables count it.
func ErrClass(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EPERM):
		return "eperm"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return err.Error()
}

func proto(req Request) string {
	if req.Proto == "" {
		return "tcp"
	}
	return req.Proto
}

// timeout is a request's own, or 2 s scaled by Slow.
func timeout(req Request) time.Duration {
	if req.Timeout > 0 {
		return req.Timeout
	}
	return Slow(2 * time.Second)
}

// Slow scales a bound on elapsed time for machines that run the tests
// emulated: the kernel matrix's TCG guests set DRAIND_TEST_SLOWDOWN (a
// factor, 1 when unset). A helper process inherits it from its test.
func Slow(d time.Duration) time.Duration {
	if f, err := strconv.Atoi(os.Getenv("DRAIND_TEST_SLOWDOWN")); err == nil && f > 1 {
		return d * time.Duration(f)
	}
	return d
}

// dialOnce opens a connection, reads the greeting (or, for UDP, sends a
// datagram, req.Line or "hi", and reads the answer) and closes it.
func dialOnce(req Request) (string, error) {
	c, err := net.DialTimeout(proto(req), req.Addr, timeout(req))
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout(req)))
	if proto(req) == "udp" {
		line := req.Line
		if line == "" {
			line = "hi"
		}
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			return "", err
		}
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(line), nil
}

func tally(resp *Response, name string, err error) {
	if err != nil {
		if resp.Fails == nil {
			resp.Fails = map[string]int{}
		}
		resp.Fails[ErrClass(err)]++
		return
	}
	resp.OK++
	if resp.By == nil {
		resp.By = map[string]int{}
		resp.Last = map[string]int64{}
	}
	resp.By[name]++
	resp.Last[name] = time.Now().UnixNano()
}

func (c *client) handle(req Request) Response {
	switch req.Op {
	case "dial":
		var resp Response
		start := time.Now()
		for i := 0; i < max(req.N, 1); i++ {
			name, err := dialOnce(req)
			tally(&resp, name, err)
		}
		resp.Elapsed = time.Since(start)
		return resp
	case "bench":
		// connect + close with plain blocking syscalls on one locked
		// thread: nothing but the kernel's path (and the hooks on it) is
		// timed, not Go's poller.
		ap, err := netip.ParseAddrPort(req.Addr)
		if err != nil {
			return Response{Err: err.Error()}
		}
		return benchConnect(ap, req.N)
	case "open":
		conn, err := net.DialTimeout(proto(req), req.Addr, timeout(req))
		if err != nil {
			return Response{Err: ErrClass(err)}
		}
		rw := bufio.NewReadWriter(bufio.NewReader(conn), bufio.NewWriter(conn))
		conn.SetReadDeadline(time.Now().Add(timeout(req)))
		if proto(req) == "udp" {
			rw.WriteString("hi\n")
			rw.Flush()
		}
		line, err := rw.ReadString('\n')
		if err != nil {
			conn.Close()
			return Response{Err: ErrClass(err)}
		}
		c.conns[req.ID], c.raw[req.ID] = rw, conn
		return Response{Server: strings.TrimSpace(line)}
	case "req":
		rw, ok := c.conns[req.ID]
		if !ok {
			return Response{Err: "no connection " + req.ID}
		}
		c.raw[req.ID].SetDeadline(time.Now().Add(timeout(req)))
		line := req.Line
		if line == "" {
			line = "hi"
		}
		if _, err := rw.WriteString(line + "\n"); err != nil {
			return Response{Err: ErrClass(err)}
		}
		if err := rw.Flush(); err != nil {
			return Response{Err: ErrClass(err)}
		}
		ans, err := rw.ReadString('\n')
		if err != nil {
			return Response{Err: ErrClass(err)}
		}
		return Response{Server: strings.TrimSpace(ans)}
	case "close":
		if conn, ok := c.raw[req.ID]; ok {
			conn.Close()
			delete(c.raw, req.ID)
			delete(c.conns, req.ID)
		}
		return Response{}
	case "http": // Line is the method (GET by default), Addr the URL
		method := req.Line
		if method == "" {
			method = http.MethodGet
		}
		hreq, err := http.NewRequest(method, req.Addr, nil)
		if err != nil {
			return Response{Err: err.Error()}
		}
		hc := &http.Client{Timeout: timeout(req), Transport: &http.Transport{DisableKeepAlives: true}}
		start := time.Now()
		resp, err := hc.Do(hreq)
		if err != nil {
			return Response{Err: ErrClass(err)}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return Response{Code: resp.StatusCode, Body: string(body), Elapsed: time.Since(start)}
	case "loop_start":
		l := &loop{stop: make(chan struct{}), done: make(chan Response, 1)}
		c.loops[req.ID] = l
		go runLoop(req, l)
		return Response{}
	case "keepalive_start":
		k := &keepalive{stop: make(chan struct{}), done: make(chan struct{})}
		if c.kas == nil {
			c.kas = map[string]*keepalive{}
		}
		c.kas[req.ID] = k
		go runKeepalive(req, k)
		return Response{}
	case "keepalive_stop":
		k, ok := c.kas[req.ID]
		if !ok {
			return Response{Err: "no keep-alive client " + req.ID}
		}
		delete(c.kas, req.ID)
		close(k.stop)
		<-k.done
		return Response{Timeline: k.timeline()}
	case "keepalive_peek":
		k, ok := c.kas[req.ID]
		if !ok {
			return Response{Err: "no keep-alive client " + req.ID}
		}
		return Response{Timeline: k.timeline()}
	case "loop_stop":
		l, ok := c.loops[req.ID]
		if !ok {
			return Response{Err: "no loop " + req.ID}
		}
		delete(c.loops, req.ID)
		close(l.stop)
		return <-l.done
	}
	return Response{Err: "unknown op " + req.Op}
}

func runLoop(req Request, l *loop) {
	var resp Response
	start := time.Now()
	t := time.NewTicker(max(req.Interval, time.Millisecond))
	defer t.Stop()
	for {
		name, err := dialOnce(req)
		tally(&resp, name, err)
		select {
		case <-l.stop:
			resp.Elapsed = time.Since(start)
			l.done <- resp
			return
		case <-t.C:
		}
	}
}

func benchConnect(ap netip.AddrPort, n int) Response {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fam, sa := unix.AF_INET, unix.Sockaddr(&unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()})
	if ap.Addr().Is6() {
		fam, sa = unix.AF_INET6, &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
	}
	var resp Response
	start := time.Now()
	for i := 0; i < n; i++ {
		fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return Response{Err: err.Error()}
		}
		// RST on close: no TIME_WAIT pile-up over many thousand runs.
		unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
		if err := unix.Connect(fd, sa); err != nil {
			tally(&resp, "", err)
		} else {
			resp.OK++
		}
		unix.Close(fd)
	}
	resp.Elapsed = time.Since(start)
	return resp
}
