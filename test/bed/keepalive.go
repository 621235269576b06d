package bed

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A keep-alive client: one TCP connection reused for request after
// request, as an HTTP client with keep-alive does, redialled at once when a
// request fails. Its timeline says when each request ended and how, so a
// test can tell how long a client took from an event (its server vanished)
// to its next successful request.
//
//	keepalive_start  ID, Addr, Interval (between requests), Timeout (per
//	                 request and per dial; 2 s if zero)
//	keepalive_peek   ID: the timeline so far (it keeps running)
//	keepalive_stop   ID: stops it and returns the timeline

// Sample is one request of a keep-alive client.
type Sample struct {
	At     int64  `json:"at"`   // unix ns when the request ended
	Sent   int64  `json:"sent"` // unix ns when it was sent (or its dial began)
	Server string `json:"server,omitempty"`
	Err    string `json:"err,omitempty"`  // error class (etimedout: the socket itself timed out)
	Conn   int    `json:"conn"`           // which connection (1, 2, ...)
	Dial   bool   `json:"dial,omitempty"` // the error came from dialing
}

type keepalive struct {
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	samples []Sample
}

func (k *keepalive) add(s Sample) {
	k.mu.Lock()
	k.samples = append(k.samples, s)
	k.mu.Unlock()
}

// timeline returns a copy of the samples so far.
func (k *keepalive) timeline() []Sample {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]Sample(nil), k.samples...)
}

// kaErrClass is ErrClass, telling the socket's own timeout (ETIMEDOUT:
// the kernel gave up on the connection) from the client's deadline.
func kaErrClass(err error) string {
	if errors.Is(err, syscall.ETIMEDOUT) {
		return "etimedout"
	}
	return ErrClass(err)
}

func runKeepalive(req Request, k *keepalive) {
	to := timeout(req)
	var conn net.Conn
	var rd *bufio.Reader
	n := 0
	defer func() {
		if conn != nil {
			conn.Close()
		}
		close(k.done)
	}()
	for {
		select {
		case <-k.stop:
			return
		default:
		}
		sent := time.Now().UnixNano()
		if conn == nil {
			c, err := net.DialTimeout("tcp", req.Addr, to)
			if err != nil {
				k.add(Sample{At: time.Now().UnixNano(), Sent: sent, Err: kaErrClass(err), Conn: n + 1, Dial: true})
				continue
			}
			n++
			conn, rd = c, bufio.NewReader(c)
			conn.SetReadDeadline(time.Now().Add(to))
			if _, err := rd.ReadString('\n'); err != nil { // the greeting
				k.add(Sample{At: time.Now().UnixNano(), Sent: sent, Err: kaErrClass(err), Conn: n})
				conn.Close()
				conn = nil
				continue
			}
		}
		sent = time.Now().UnixNano()
		conn.SetDeadline(time.Now().Add(to))
		line, err := "", error(nil)
		if _, err = conn.Write([]byte("hi\n")); err == nil {
			line, err = rd.ReadString('\n')
		}
		if err != nil {
			k.add(Sample{At: time.Now().UnixNano(), Sent: sent, Err: kaErrClass(err), Conn: n})
			conn.Close()
			conn = nil
			continue // redial at once
		}
		k.add(Sample{At: time.Now().UnixNano(), Sent: sent, Server: strings.TrimSpace(line), Conn: n})
		select {
		case <-k.stop:
			return
		case <-time.After(req.Interval):
		}
	}
}

// FirstSuccessAfter returns the first successful request sent after t, and
// whether there is one. Not the first that ended after t: the answer to a
// request sent before t may be read after it (on a loaded machine the
// client runs late) though the server that sent it was gone by t.
func FirstSuccessAfter(samples []Sample, t time.Time) (Sample, bool) {
	for _, s := range samples {
		if s.Err == "" && s.Sent > t.UnixNano() {
			return s, true
		}
	}
	return Sample{}, false
}

// WaitServed waits until keep-alive client id has been answered a few times
// in a row on one connection (at most timeout) and returns its timeline so
// far: its connection exists and has a server.
func WaitServed(p *Proc, id string, timeout time.Duration) ([]Sample, error) {
	const inRow = 3
	deadline := time.Now().Add(timeout)
	for {
		r, err := p.Call(Request{Op: "keepalive_peek", ID: id})
		if err != nil {
			return nil, err
		}
		tl := r.Timeline
		if n := len(tl); n >= inRow {
			last := tl[n-inRow:]
			ok := true
			for _, s := range last {
				ok = ok && s.Err == "" && s.Conn == last[0].Conn && s.Server == last[0].Server
			}
			if ok {
				return tl, nil
			}
		}
		if time.Now().After(deadline) {
			return tl, fmt.Errorf("keep-alive client %s not served %d times in a row within %v: %v", id, inRow, timeout, tl)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
