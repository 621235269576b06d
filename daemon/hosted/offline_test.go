package hosted

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/daemon/nodeapi"
)

// The offline API's wait slots, over real sockets: a caller that goes
// away, a slow body, many callers of one pod, two pods.

// TestOfflineAPIManyWaitsBounded: a thousand callers of one pod at once
// take at most the cap of wait slots (the rest are refused at once); the
// pending waits are all answered when the pod drains, and leave no state,
// memory or goroutine behind.
func TestOfflineAPIManyWaitsBounded(t *testing.T) {
	const limit, callers = 100, 1000
	f := newHTTPFixture(t, nil, func(c *Config) { c.MaxWaiters, c.MaxWaitersPerPod = limit, limit })
	f.ct.setLive("127.0.0.1", 1) // keeps the pod from draining meanwhile
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()

	codes := make(chan int, callers)
	// One connection per call, as a preStop's curl makes.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, err := postCode(client, "http://"+f.addr+"/v1/offline?wait=60s&quiet=1s")
			if err != nil {
				t.Errorf("caller: %v", err)
			}
			codes <- code
		}()
	}
	// Every call beyond the limit is refused at once. (Waited for in real
	// time, here and below: the calls go over real sockets, no synctest
	// bubble.)
	n429 := 0
	deadline := time.After(30 * time.Second)
	for n429 < callers-limit {
		select {
		case c := <-codes:
			if c != 429 {
				t.Fatalf("while %d waits are pending, a call got %d", limit, c)
			}
			n429++
		case <-deadline:
			t.Fatalf("only %d of %d excess calls were refused", n429, callers-limit)
		}
	}
	if waiting := f.waits(); waiting != limit {
		t.Errorf("%d waits pending, want the limit %d", waiting, limit)
	}
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	// The pod drains: every pending wait is answered.
	f.ct.setLive("127.0.0.1", 0)
	f.tick(0)
	f.tick(2 * time.Second)
	ok := 0
	for i := 0; i < limit; i++ {
		select {
		case c := <-codes:
			if c == 200 {
				ok++
			}
		case <-time.After(20 * time.Second):
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			for _, g := range strings.Split(string(buf[:n]), "\n\n") {
				if strings.Contains(g, "hosted.(*Drains)") {
					t.Log(g)
				}
			}
			f.d.mu.Lock()
			for _, ld := range f.d.pods {
				t.Logf("drain %s: state %s waiters %d live %d checked %v started %v lastSYN %v now %v", ld.name, ld.state, len(ld.waiters), ld.live, ld.liveChecked, ld.started, ld.lastSYN, f.clock.Now())
				for _, w := range ld.waiters {
					t.Logf("  waiter quiet %v started %v deadline %v", w.quiet, w.started, w.deadline)
				}
			}
			f.d.mu.Unlock()
			t.Fatalf("pending waits not answered: %d of %d", ok, limit)
		}
	}
	wg.Wait()
	if ok != limit {
		t.Errorf("%d of %d pending waits got 200", ok, limit)
	}
	client.CloseIdleConnections()
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	growth := int64(during.HeapInuse) - int64(before.HeapInuse)
	left := int64(after.HeapInuse) - int64(before.HeapInuse)
	t.Logf("heap in use: before %d KiB, with %d callers %d KiB, after %d KiB", before.HeapInuse>>10, callers, during.HeapInuse>>10, after.HeapInuse>>10)
	if growth > 64<<20 {
		t.Errorf("heap grew by %d MiB under %d callers (client side included)", growth>>20, callers)
	}
	f.d.mu.Lock()
	if f.d.nwait != 0 || len(f.d.pods["p0"].waiters) != 0 {
		t.Errorf("waiter state left behind: %d waits", f.d.nwait)
	}
	f.d.mu.Unlock()
	if left > 16<<20 {
		t.Errorf("%d MiB of heap still held after every call ended", left>>20)
	}
	poll(5*time.Second, func() bool { return runtime.NumGoroutine() <= goroutines+20 }) // real sockets: no bubble
	if g := runtime.NumGoroutine(); g > goroutines+20 {
		t.Errorf("%d goroutines left, %d before", g, goroutines)
	}
}

// TestHostileOfflineSlowBody: a request body that never arrives is cut at
// the body deadline, not held for the whole wait.
func TestHostileOfflineSlowBody(t *testing.T) {
	f := newHTTPFixture(t, func(c *nodeapi.Config) { c.BodyTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", f.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "POST /v1/offline?wait=30s HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a slow body held the connection")
	}
	if !strings.Contains(string(b), "408") {
		t.Errorf("answer to a slow body: %q", b)
	}
	if n := f.waits(); n != 0 {
		t.Errorf("%d waits left by a slow body", n)
	}
}

// TestHostileOfflineDisconnect: a caller that goes away while waiting is
// noticed, with or without a request body, and gives its slot back.
func TestHostileOfflineDisconnect(t *testing.T) {
	for _, withBody := range []bool{false, true} {
		t.Run(fmt.Sprintf("body=%v", withBody), func(t *testing.T) {
			f := newHTTPFixture(t, nil)
			f.ct.setLive("127.0.0.1", 1)
			c, err := net.Dial("tcp", f.addr)
			if err != nil {
				t.Fatal(err)
			}
			req := "POST /v1/offline?wait=60s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
			if withBody {
				req = "POST /v1/offline?wait=60s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nwait"
			}
			io.WriteString(c, req)
			// Polled, here and below: a real socket (httpFixture), no
			// synctest bubble.
			eventually(t, 10*time.Second, "the wait to start", func() bool { return f.waits() == 1 })
			c.Close()
			eventually(t, 10*time.Second, "the disconnect to be noticed", func() bool { return f.waits() == 0 })
		})
	}
}

// TestHostileOfflineWaitsPerPod: one pod cannot take every wait slot: a
// second pod's preStop still gets its drain and its wait.
func TestHostileOfflineWaitsPerPod(t *testing.T) {
	f := newHTTPFixture(t, nil, func(c *Config) { c.MaxWaiters = 32; c.MaxWaitersPerPod = 4 })
	f.setPods(pod("pod-p0", "p0", "127.0.0.1"), pod("pod-p9", "p9", "127.0.0.9"))
	f.ct.setLive("127.0.0.1", 1)
	codes := make(chan int, 64)
	client := &http.Client{Timeout: time.Minute}
	for i := 0; i < 40; i++ {
		go func() { // reports through codes only: it may outlive a failed test
			code, _ := postCode(client, "http://"+f.addr+"/v1/offline?wait=30s")
			codes <- code
		}()
	}
	// Waited and polled in real time, here and below: the calls go over
	// real sockets (httpFixture), no synctest bubble.
	n429 := 0
	for n429 < 36 {
		select {
		case c := <-codes:
			if c != 429 {
				t.Fatalf("a call beyond the pod's 4 waits got %d", c)
			}
			n429++
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d calls refused", n429)
		}
	}
	call := f.offline(netip.MustParseAddr("127.0.0.9"), 30*time.Second, time.Second)
	if r, answered := call.answered(); answered {
		t.Fatalf("the other pod's wait was refused: %+v", r)
	}
	eventually(t, 10*time.Second, "both pods' drain Leases", func() bool { return len(f.leases()) == 2 })
	// The pod's 4 waits end with the test (503, as at a stop), once all
	// of them are queued.
	eventually(t, 20*time.Second, "the pod's 4 waits to queue", func() bool { return f.waiters("p0") == 4 })
	f.d.cancelAll("the test is over")
	for i := 0; i < 4; i++ {
		if c := <-codes; c != 503 {
			t.Errorf("a pending wait ended with %d", c)
		}
	}
	client.CloseIdleConnections()
}

// TestHostileOfflineCallerIdentity: when a finished pod and a running pod
// share an IP, the running one is the caller; a finished pod never is.
func TestHostileOfflineCallerIdentity(t *testing.T) {
	f := newFixture(t)
	running := pod("pod-p0", "p0", "10.0.0.1")
	done := pod("job-done", "j0", "10.0.0.1")
	done.Status.Phase = corev1.PodSucceeded
	f.setPods(running, done)
	ip := netip.MustParseAddr("10.0.0.1")
	for i := 0; i < 20; i++ {
		if p := f.d.podByIP(ip); p == nil || p.UID != "p0" {
			t.Fatalf("caller resolved to %+v, want the running pod p0", p)
		}
	}
	f.setPods(done) // pod-p0 deleted
	if p := f.d.podByIP(ip); p != nil {
		t.Fatalf("a finished pod was taken as the caller: %s", p.Name)
	}
}

// postCode posts an empty body to url and returns the answer's status code,
// or -1 and the error when there is no answer.
func postCode(client *http.Client, url string) (int, error) {
	resp, err := client.Post(url, "", nil)
	if err != nil {
		return -1, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
