package nodeapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeDrains records the calls the API makes.
type fakeDrains struct {
	ready       bool
	ip          netip.Addr
	wait, quiet time.Duration
	answer      Result
}

func (f *fakeDrains) Offline(_ context.Context, ip netip.Addr, wait, quiet time.Duration) Result {
	f.ip, f.wait, f.quiet = ip, wait, quiet
	return f.answer
}

func (f *fakeDrains) Online(_ context.Context, ip netip.Addr) Result {
	f.ip = ip
	return f.answer
}

func (f *fakeDrains) Ready() bool { return f.ready }

// TestAPI: the handler asks Drains only once the request is well formed,
// from a known caller, and the agent ready; it answers with the Result's
// code and counts every answer.
func TestAPI(t *testing.T) {
	reqs := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "requests"}, []string{"path", "code"})
	f := &fakeDrains{answer: Result{Pod: "shop/web-1", State: "drained", Drained: true}}
	s := New(f, Config{Quiet: 2 * time.Second, MaxWait: time.Minute, BodyTimeout: time.Second, Requests: reqs})
	do := func(method, target, remote string) (int, Result) {
		t.Helper()
		r := httptest.NewRequest(method, target, strings.NewReader(""))
		r.RemoteAddr = remote
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		var res Result
		if w.Body.Len() > 0 && strings.HasPrefix(w.Header().Get("Content-Type"), "application/json") {
			if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
				t.Fatalf("%s %s: %v in %q", method, target, err, w.Body)
			}
		}
		return w.Code, res
	}
	if code, res := do("POST", "/v1/offline", "10.0.0.1:40000"); code != 503 || res.Error != ErrNotReady.Error() || f.ip.IsValid() {
		t.Errorf("not ready: %d %+v, drains asked for %v", code, res, f.ip)
	}
	if code, _ := do("GET", "/readyz", "10.0.0.1:40000"); code != 503 {
		t.Errorf("readyz not ready: %d", code)
	}
	f.ready = true
	for _, tc := range []struct {
		method, target, remote string
		code                   int
	}{
		{"GET", "/v1/offline", "10.0.0.1:40000", 405},
		{"POST", "/v1/offline?wait=1e3", "10.0.0.1:40000", 400},
		{"POST", "/v1/offline?when=now", "10.0.0.1:40000", 400},
		{"POST", "/v1/offline", "not-an-address", 403},
	} {
		if code, _ := do(tc.method, tc.target, tc.remote); code != tc.code || f.ip.IsValid() {
			t.Errorf("%s %s from %s: %d, want %d; drains asked for %v", tc.method, tc.target, tc.remote, code, tc.code, f.ip)
		}
	}
	code, res := do("POST", "/v1/offline?wait=2h&quiet=1.5", "[::ffff:10.0.0.1]:40000")
	if code != 200 || !res.Drained || f.ip != netip.MustParseAddr("10.0.0.1") || f.wait != time.Minute || f.quiet != 1500*time.Millisecond {
		t.Errorf("offline: %d %+v; drains got ip %v wait %v quiet %v (want 10.0.0.1, the 1m cap, 1.5s)", code, res, f.ip, f.wait, f.quiet)
	}
	f.answer = Result{Error: "the pod is being deleted", Code: http.StatusConflict}
	if code, res := do("POST", "/v1/online", "10.0.0.1:40000"); code != 409 || res.Error == "" {
		t.Errorf("online refused: %d %+v", code, res)
	}
	if got := testutil.ToFloat64(reqs.WithLabelValues("/v1/offline", "400")); got != 2 {
		t.Errorf("400 answers counted: %v, want 2", got)
	}
}
