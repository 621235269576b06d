package bpf_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/test/bed"
	"golang.org/x/sys/unix"
)

// The socket helper: a process in a pod's network namespace and a cgroup
// that drives sockets with raw syscalls (sendto/recvfrom on unconnected UDP,
// connected UDP with recvfrom, TCP Fast Open), which the bed's client, built
// on package net, does not expose. It answers one JSON request per line.

const envSockHelper = "DRAIND_BPF_SOCKHELPER"

type sockReq struct {
	Op string `json:"op"`
	// Family of the socket: "4", "6" or "dual" (IPv6, v4-mapped allowed).
	Family string `json:"family,omitempty"`
	Addr   string `json:"addr,omitempty"`
	N      int    `json:"n,omitempty"`
	// Fresh: a new socket for every datagram (a new flow each time).
	Fresh bool `json:"fresh,omitempty"`
	// ID names a socket kept between requests (tcp_open, tcp_req, and
	// connect/exchange on a named UDP socket); "" is the default UDP socket.
	ID string `json:"id,omitempty"`
	// IDs and Addrs are the sockets and their destinations of bench.
	IDs   []string `json:"ids,omitempty"`
	Proto string   `json:"proto,omitempty"` // of bench: "udp" (default) or "tcp"
	Addrs []string `json:"addrs,omitempty"`
	// Timeout bounds a read (SO_RCVTIMEO); 2 s if zero.
	Timeout time.Duration `json:"timeout,omitempty"`
}

type sockResp struct {
	Err     string         `json:"err,omitempty"`
	OK      int            `json:"ok,omitempty"`
	By      map[string]int `json:"by,omitempty"`      // answers by server name
	Sources map[string]int `json:"sources,omitempty"` // answers by the source recvfrom reported
	Fails   map[string]int `json:"fails,omitempty"`
	Elapsed time.Duration  `json:"elapsed,omitempty"`
	// Paths are bench's round-trip times by socket.
	Paths []pathTime `json:"paths,omitempty"`
	// Local is the socket's own address (tcp_open, connect).
	Local string `json:"local,omitempty"`
}

// pathTime is one path's round trips in a bench request: their mean time
// and their median.
type pathTime struct {
	Mean   time.Duration `json:"mean"`
	Median time.Duration `json:"median"`
}

// sockHelperMain runs the helper if this process is one, and exits.
func sockHelperMain() {
	if os.Getenv(envSockHelper) != "1" {
		return
	}
	runtime.LockOSThread() // raw syscalls on one thread: nothing but the kernel path is timed
	h := &sockHelper{fd: -1, named: map[string]int{}, pools: map[string][]int{}}
	out := bufio.NewWriter(os.Stdout)
	send := func(r sockResp) {
		b, _ := json.Marshal(r)
		out.Write(append(b, '\n'))
		out.Flush()
	}
	send(sockResp{}) // ready
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var req sockReq
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			send(sockResp{Err: "bad request: " + err.Error()})
			continue
		}
		send(h.handle(req))
	}
	os.Exit(0)
}

type sockHelper struct {
	fd     int // the persistent UDP socket
	family string
	named  map[string]int   // sockets by ID
	pools  map[string][]int // unconnected TCP sockets by ID (tcp_pool), for bench
}

func sockaddrOf(family string, ap netip.AddrPort) (unix.Sockaddr, error) {
	switch family {
	case "4":
		if !ap.Addr().Is4() {
			return nil, fmt.Errorf("%s is no IPv4 address", ap)
		}
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
	case "6", "dual":
		return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}, nil
	}
	return nil, fmt.Errorf("unknown family %q", family)
}

func addrOfSockaddr(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

func newSocket(family string, typ int) (int, error) {
	dom := unix.AF_INET
	if family != "4" {
		dom = unix.AF_INET6
	}
	fd, err := unix.Socket(dom, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if family == "6" {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1)
	} else if family == "dual" {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	if err == nil {
		err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2})
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// retry repeats a system call the Go runtime's signals interrupted.
func retry(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func failClass(err error) string {
	switch {
	case errors.Is(err, unix.EAGAIN):
		return "timeout" // SO_RCVTIMEO: nothing came, the socket is fine
	case errors.Is(err, unix.ETIMEDOUT):
		return "etimedout" // the socket itself failed
	}
	return bed.ErrClass(err)
}

func tallySock(r *sockResp, name, src string, err error) {
	if err != nil {
		if r.Fails == nil {
			r.Fails = map[string]int{}
		}
		r.Fails[failClass(err)]++
		return
	}
	r.OK++
	if r.By == nil {
		r.By, r.Sources = map[string]int{}, map[string]int{}
	}
	r.By[name]++
	r.Sources[src]++
}

// exchange sends one datagram (to sa, or on the connected socket if sa is
// nil) and reads the answer with recvfrom.
func exchange(fd int, sa unix.Sockaddr) (name, src string, err error) {
	msg := []byte("hi\n")
	err = retry(func() error {
		if sa != nil {
			return unix.Sendto(fd, msg, 0, sa)
		}
		_, err := unix.Write(fd, msg)
		return err
	})
	if err != nil {
		return "", "", err
	}
	buf := make([]byte, 256)
	var n int
	var from unix.Sockaddr
	err = retry(func() (err error) {
		n, from, err = unix.Recvfrom(fd, buf, 0)
		return err
	})
	if err != nil {
		return "", "", err
	}
	return strings.TrimSpace(string(buf[:n])), addrOfSockaddr(from), nil
}

func (h *sockHelper) socket(family string) error {
	if h.fd >= 0 && h.family == family {
		return nil
	}
	if h.fd >= 0 {
		unix.Close(h.fd)
	}
	fd, err := newSocket(family, unix.SOCK_DGRAM)
	if err != nil {
		return err
	}
	h.fd, h.family = fd, family
	return nil
}

func (h *sockHelper) handle(req sockReq) sockResp {
	var r sockResp
	var sa unix.Sockaddr
	if req.Addr != "" {
		ap, err := netip.ParseAddrPort(req.Addr)
		if err != nil {
			return sockResp{Err: err.Error()}
		}
		if sa, err = sockaddrOf(req.Family, ap); err != nil {
			return sockResp{Err: err.Error()}
		}
	}
	n := max(req.N, 1)
	start := time.Now()
	switch req.Op {
	case "sendto": // unconnected UDP: sendto + recvfrom, n times
		for i := 0; i < n; i++ {
			if req.Fresh || h.fd < 0 || h.family != req.Family {
				if h.fd >= 0 {
					unix.Close(h.fd)
					h.fd = -1
				}
				if err := h.socket(req.Family); err != nil {
					return sockResp{Err: err.Error()}
				}
			}
			name, src, err := exchange(h.fd, sa)
			tallySock(&r, name, src, err)
		}
	case "tcp_open": // a TCP connection kept as ID; reads the greeting
		return h.tcpOpen(req, sa)
	case "tcp_req": // one request line on connection ID, one answer line
		fd, ok := h.named[req.ID]
		if !ok {
			return sockResp{Err: "no socket " + req.ID}
		}
		name, err := tcpRequest(fd, req.Timeout)
		tallySock(&r, name, "", err)
	case "close":
		if fd, ok := h.named[req.ID]; ok {
			unix.Close(fd)
			delete(h.named, req.ID)
		}
	case "connect", "exchange":
		if req.ID != "" {
			return h.namedUDP(req, sa)
		}
		if req.Op == "exchange" {
			for i := 0; i < n; i++ {
				name, src, err := exchange(h.fd, nil)
				tallySock(&r, name, src, err)
			}
			break
		}
		// connect the persistent UDP socket (a new one)
		if h.fd >= 0 {
			unix.Close(h.fd)
			h.fd = -1
		}
		if err := h.socket(req.Family); err != nil {
			return sockResp{Err: err.Error()}
		}
		if err := unix.Connect(h.fd, sa); err != nil {
			tallySock(&r, "", "", err)
		} else {
			r.OK = 1
		}
	case "tfo": // TCP: sendto(MSG_FASTOPEN) on a fresh socket, read the greeting
		for i := 0; i < n; i++ {
			name, err := fastOpen(req.Family, sa)
			tallySock(&r, name, "", err)
		}
	case "udp_open": // a new unconnected UDP socket named req.ID, in the helper's cgroup of now
		if fd, ok := h.named[req.ID]; ok {
			unix.Close(fd)
			delete(h.named, req.ID)
		}
		fd, err := newSocket(req.Family, unix.SOCK_DGRAM)
		if err != nil {
			return sockResp{Err: err.Error()}
		}
		h.named[req.ID] = fd
		r.OK = 1
	case "tcp_pool": // req.N new TCP sockets named req.ID, in the helper's cgroup of now
		for _, fd := range h.pools[req.ID] {
			unix.Close(fd)
		}
		delete(h.pools, req.ID)
		pool := make([]int, 0, n)
		for range n {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				for _, fd := range pool {
					unix.Close(fd)
				}
				return sockResp{Err: err.Error()}
			}
			// RST on close: no TIME_WAIT pile-up over many thousand runs.
			unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
			pool = append(pool, fd)
		}
		h.pools[req.ID] = pool
		r.OK = n
	case "bench": // interleaved round trips or connects, timed here
		return h.bench(req)
	default:
		return sockResp{Err: "unknown op " + req.Op}
	}
	r.Elapsed = time.Since(start)
	return r
}

// bench times req.N rounds of operations on the paths req.IDs, path i
// going to req.Addrs[i], in the order of the benchmarks' harness
// (interleave: one operation per path, forward then backward), so that the
// paths take turns operation by operation and the machine's noise, which
// comes in bursts far longer than that, hits them alike. The operation is
// a sendto + recvfrom round trip on the named UDP socket req.IDs[i], or
// (req.Proto "tcp") a connect + close of the next socket of the pool
// req.IDs[i] (tcp_pool; 20 + req.N sockets). Each socket keeps the cgroup
// it was created in, so one process on one thread times every path. 20
// rounds before are not timed (caches, neighbour entries).
func (h *sockHelper) bench(req sockReq) sockResp {
	if len(req.IDs) == 0 || len(req.IDs) != len(req.Addrs) {
		return sockResp{Err: fmt.Sprintf("bench: %d paths for %d addresses", len(req.IDs), len(req.Addrs))}
	}
	const warm = 20
	n := max(req.N, 1)
	fds := make([]int, len(req.IDs))
	pools := make([][]int, len(req.IDs))
	sas := make([]unix.Sockaddr, len(req.IDs))
	for i, id := range req.IDs {
		if req.Proto == "tcp" {
			if pools[i] = h.pools[id]; len(pools[i]) < warm+n {
				return sockResp{Err: fmt.Sprintf("bench: pool %s has %d sockets, want %d", id, len(pools[i]), warm+n)}
			}
			delete(h.pools, id) // used up: each socket connects once
		} else {
			fd, ok := h.named[id]
			if !ok {
				return sockResp{Err: "bench: no socket " + id}
			}
			fds[i] = fd
		}
		ap, err := netip.ParseAddrPort(req.Addrs[i])
		if err != nil {
			return sockResp{Err: err.Error()}
		}
		if sas[i], err = sockaddrOf(req.Family, ap); err != nil {
			return sockResp{Err: err.Error()}
		}
	}
	buf := make([]byte, 256)
	msg := []byte("hi\n")
	var failed error
	op := func(i int) error {
		if req.Proto == "tcp" {
			fd := pools[i][0]
			pools[i] = pools[i][1:]
			defer unix.Close(fd)
			if err := unix.Connect(fd, sas[i]); err != nil {
				return fmt.Errorf("connect %s: %w", req.Addrs[i], err)
			}
			return nil
		}
		if err := retry(func() error { return unix.Sendto(fds[i], msg, 0, sas[i]) }); err != nil {
			return fmt.Errorf("sendto %s: %w", req.Addrs[i], err)
		}
		if err := retry(func() error { _, _, err := unix.Recvfrom(fds[i], buf, 0); return err }); err != nil {
			return fmt.Errorf("recvfrom after sending to %s: %w", req.Addrs[i], err)
		}
		return nil
	}
	last := time.Now()
	timed := func(i int) float64 {
		if failed == nil {
			failed = op(i)
		}
		now := time.Now()
		d := now.Sub(last)
		last = now
		return float64(d)
	}
	interleave(warm, len(req.IDs), timed)
	last = time.Now()
	times := interleave(n, len(req.IDs), timed)
	for _, p := range pools {
		for _, fd := range p {
			unix.Close(fd)
		}
	}
	if failed != nil {
		return sockResp{Err: failed.Error()}
	}
	r := sockResp{OK: n}
	for _, t := range times {
		var sum float64
		for _, d := range t {
			sum += d
		}
		r.Paths = append(r.Paths, pathTime{Mean: time.Duration(sum / float64(len(t))), Median: time.Duration(median(t))})
	}
	return r
}

// namedUDP connects or uses the UDP socket named req.ID.
func (h *sockHelper) namedUDP(req sockReq, sa unix.Sockaddr) sockResp {
	var r sockResp
	if req.Op == "connect" {
		if fd, ok := h.named[req.ID]; ok {
			unix.Close(fd)
		}
		fd, err := newSocket(req.Family, unix.SOCK_DGRAM)
		if err != nil {
			return sockResp{Err: err.Error()}
		}
		h.named[req.ID] = fd
		if err := unix.Connect(fd, sa); err != nil {
			tallySock(&r, "", "", err)
			return r
		}
		r.OK = 1
		r.Local = localOf(fd)
		return r
	}
	fd, ok := h.named[req.ID]
	if !ok {
		return sockResp{Err: "no socket " + req.ID}
	}
	for i := 0; i < max(req.N, 1); i++ {
		name, src, err := exchange(fd, nil)
		tallySock(&r, name, src, err)
	}
	return r
}

func localOf(fd int) string {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return ""
	}
	return addrOfSockaddr(sa)
}

// tcpOpen connects a TCP socket (blocking connect), reads the server's
// greeting and keeps the socket as req.ID.
func (h *sockHelper) tcpOpen(req sockReq, sa unix.Sockaddr) sockResp {
	fd, err := newSocket(req.Family, unix.SOCK_STREAM)
	if err != nil {
		return sockResp{Err: err.Error()}
	}
	var r sockResp
	if err := retry(func() error { return unix.Connect(fd, sa) }); err != nil {
		unix.Close(fd)
		tallySock(&r, "", "", err)
		return r
	}
	name, err := readLine(fd, req.Timeout)
	if err != nil {
		unix.Close(fd)
		tallySock(&r, "", "", err)
		return r
	}
	if old, ok := h.named[req.ID]; ok {
		unix.Close(old)
	}
	h.named[req.ID] = fd
	tallySock(&r, name, "", nil)
	r.Local = localOf(fd)
	return r
}

// tcpRequest sends one line and reads the answer line.
func tcpRequest(fd int, timeout time.Duration) (string, error) {
	if err := retry(func() error { _, err := unix.Write(fd, []byte("hi\n")); return err }); err != nil {
		return "", err
	}
	return readLine(fd, timeout)
}

// readLine reads one line with SO_RCVTIMEO (2 s if timeout is zero).
func readLine(fd int, timeout time.Duration) (string, error) {
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	tv := unix.NsecToTimeval(timeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return "", err
	}
	var line []byte
	buf := make([]byte, 256)
	for {
		var n int
		err := retry(func() (err error) {
			n, err = unix.Read(fd, buf)
			return err
		})
		if err != nil {
			return "", err
		}
		if n == 0 {
			return "", io.EOF
		}
		line = append(line, buf[:n]...)
		if i := strings.IndexByte(string(line), '\n'); i >= 0 {
			return string(line[:i]), nil
		}
	}
}

func fastOpen(family string, sa unix.Sockaddr) (string, error) {
	fd, err := newSocket(family, unix.SOCK_STREAM)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	// No connect(): the SYN leaves from sendto.
	if err := unix.Sendto(fd, []byte("hi\n"), unix.MSG_FASTOPEN, sa); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	var n int
	err = retry(func() (err error) {
		n, err = unix.Read(fd, buf)
		return err
	})
	if err != nil {
		return "", err
	}
	if n == 0 {
		return "", errors.New("eof")
	}
	line, _, _ := strings.Cut(string(buf[:n]), "\n")
	return line, nil
}

// sockProc is a running socket helper.
type sockProc struct {
	cmd  *exec.Cmd
	in   *bufio.Writer
	out  *bufio.Scanner
	mu   sync.Mutex
	done chan struct{}
}

// startSockHelper starts the helper inside ns and cgroup cg.
func startSockHelper(tb testing.TB, ns *bed.NetNS, cg *bed.Cgroup) *sockProc {
	tb.Helper()
	self, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := ns.Command(self)
	cmd.Env = append(os.Environ(), envSockHelper+"=1")
	cmd.Stderr = os.Stderr
	f, err := cg.Open()
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, UseCgroupFD: true, CgroupFD: int(f.Fd())}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &sockProc{cmd: cmd, in: bufio.NewWriter(stdin), out: bufio.NewScanner(stdout), done: make(chan struct{})}
	p.out.Buffer(make([]byte, 1<<16), 1<<20)
	go func() { cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-p.done
	})
	if !p.out.Scan() {
		tb.Fatalf("socket helper did not start: %v", p.out.Err())
	}
	return p
}

// call sends one request and returns the answer; a helper error fails tb.
func (p *sockProc) call(tb testing.TB, req sockReq) sockResp {
	tb.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(req)
	p.in.Write(append(b, '\n'))
	if err := p.in.Flush(); err != nil {
		tb.Fatalf("%s: writing to the socket helper: %v", req.Op, err)
	}
	ch := make(chan bool, 1)
	go func() { ch <- p.out.Scan() }()
	select {
	case ok := <-ch:
		if !ok {
			tb.Fatalf("%s: socket helper exited: %v", req.Op, p.out.Err())
		}
	case <-time.After(2*time.Minute + time.Duration(req.N)*2*time.Second):
		p.cmd.Process.Kill()
		tb.Fatalf("%s: socket helper did not answer (stopped it)", req.Op)
	}
	var r sockResp
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		tb.Fatalf("%s: bad answer %q: %v", req.Op, p.out.Bytes(), err)
	}
	if r.Err != "" {
		tb.Fatalf("%s %s: %s", req.Op, req.Addr, r.Err)
	}
	return r
}
