package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestOfflineClient(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Query().Get("wait") != "5s" {
			http.Error(w, "bad", 400)
			return
		}
		if calls.Add(1) == 1 {
			// A draind restarting mid-wait: the connection breaks.
			hj, _ := w.(http.Hijacker)
			c, _, _ := hj.Hijack()
			c.Close()
			return
		}
		w.Write([]byte(`{"pod":"shop/cart-a","state":"drained","drained":true}`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	start := time.Now()
	if err := offline(context.Background(), &out, srv.URL+"/v1/offline?wait=5s", 5*time.Second, 3, time.Hour); err != nil {
		t.Fatalf("offline: %v", err)
	}
	if calls.Load() != 2 || !strings.Contains(out.String(), `"drained":true`) {
		t.Errorf("calls %d, output %q", calls.Load(), out.String())
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	// 503 (a draind stopping answers its waiters so, a new one until it
	// is ready): retried like a broken connection.
	calls.Store(0)
	srv503 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(503)
			w.Write([]byte(`{"error":"draind is stopping"}`))
			return
		}
		w.Write([]byte(`{"pod":"shop/cart-a","state":"drained","drained":true}`))
	}))
	defer srv503.Close()
	out.Reset()
	if err := offline(context.Background(), &out, srv503.URL, 5*time.Second, 3, time.Hour); err != nil || calls.Load() != 2 {
		t.Errorf("503 then 200: err %v after %d calls, output %q", err, calls.Load(), out.String())
	}
	// 504: reported as an error (the preStop logs it), no fallback sleep.
	srv504 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(504)
		w.Write([]byte(`{"state":"timed-out","live_connections":1}`))
	}))
	defer srv504.Close()
	if err := offline(context.Background(), &out, srv504.URL, time.Second, 3, time.Hour); err == nil || !strings.Contains(err.Error(), "504") {
		t.Errorf("504: %v", err)
	}
	// Unreachable: the fallback sleep, then success (never faster than
	// the old preStop).
	start = time.Now()
	out.Reset()
	if err := offline(context.Background(), &out, "http://127.0.0.1:1/v1/offline", 1500*time.Millisecond, 1, 300*time.Millisecond); err != nil {
		t.Errorf("unreachable: %v", err)
	}
	if el := time.Since(start); el < 300*time.Millisecond || !strings.Contains(out.String(), "unreachable") {
		t.Errorf("fallback not taken: %v %q", el, out.String())
	}
}

func TestCopySelf(t *testing.T) {
	dst := t.TempDir() + "/draind"
	cmd := newRootCmd()
	cmd.SetArgs([]string{"copy-self", dst})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dst)
	if err != nil || st.Mode().Perm() != 0o755 || st.Size() == 0 {
		t.Fatalf("copy: %v %v", st, err)
	}
}
