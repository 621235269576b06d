package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/k8s/inject"
)

// events records, in order, what the fake draind and the fake application
// saw.
type events struct {
	mu  sync.Mutex
	got []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, s)
}

func (e *events) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.got)
}

// fakeDraind answers /v1/offline after delay (never, if delay < 0).
func fakeDraind(t *testing.T, ev *events, delay time.Duration) (host, port string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev.add("draind " + r.Method + " " + r.URL.Path)
		if delay < 0 {
			<-r.Context().Done()
			return
		}
		time.Sleep(delay)
		w.Write([]byte(`{"state":"drained","drained":true}`))
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u.Hostname(), u.Port()
}

func runOffline(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"offline"}, args...))
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestOfflineThenHTTPGet: the drain first, then the GET the kubelet would
// have sent for the pod's own httpGet handler, to the pod IP when the
// handler names no host, with its headers (Host included).
func TestOfflineThenHTTPGet(t *testing.T) {
	ev := &events{}
	host, port := fakeDraind(t, ev, 50*time.Millisecond)
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev.add("app " + r.Method + " " + r.URL.RequestURI() + " host=" + r.Host + " x-token=" + r.Header.Get("X-Token"))
	}))
	defer app.Close()
	au, _ := url.Parse(app.URL)
	t.Setenv(inject.PodIPEnv, au.Hostname())
	out, err := runOffline(t, "--host", host, "--port", port, "--wait=5s", "--fallback-sleep=1s",
		"--then-http-get=http://:"+au.Port()+"/shutdown?graceful=1", "--then-http-header=X-Token: a b", "--then-http-header=Host: cart.local")
	if err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	want := []string{"draind POST /v1/offline", "app GET /shutdown?graceful=1 host=cart.local x-token=a b"}
	if got := ev.list(); !slices.Equal(got, want) {
		t.Errorf("calls %q, want %q", got, want)
	}
	if !strings.Contains(out, "HTTP 200") {
		t.Errorf("output %q does not report the handler's answer", out)
	}
}

// TestOfflineThenRunsWhateverTheDrain: the pod's own handler runs when
// draind is unreachable (after the fallback sleep) and when draind never
// answers (the draind part stops at --wait + --fallback-sleep, not at the
// HTTP client's timeout of --wait + 15 s).
func TestOfflineThenRunsWhateverTheDrain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	t.Run("unreachable", func(t *testing.T) {
		start := time.Now()
		out, err := runOffline(t, "--host=127.0.0.1", "--port", strconv.Itoa(closedPort), "--wait=3s", "--retries=0", "--fallback-sleep=300ms", "--then-sleep=100ms")
		if err != nil {
			t.Fatalf("offline: %v\n%s", err, out)
		}
		if el := time.Since(start); el < 400*time.Millisecond || !strings.Contains(out, "sleeping 300ms instead") {
			t.Errorf("took %v, output %q: want the fallback sleep, then the handler's sleep", el, out)
		}
	})
	t.Run("draind never answers", func(t *testing.T) {
		ev := &events{}
		host, port := fakeDraind(t, ev, -1)
		app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ev.add("app") }))
		defer app.Close()
		start := time.Now()
		out, err := runOffline(t, "--host", host, "--port", port, "--wait=500ms", "--fallback-sleep=200ms", "--then-http-get="+app.URL+"/")
		if err == nil || !strings.Contains(err.Error(), "budget") {
			t.Errorf("err %v, want the draind part reported as stopped at its budget", err)
		}
		if got := ev.list(); !slices.Equal(got, []string{"draind POST /v1/offline", "app"}) {
			t.Errorf("calls %q (output %q): want the handler run after the stuck drain", got, out)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("took %v: the draind part was not bounded by --wait + --fallback-sleep", el)
		}
	})
}

// TestOfflineThenExecArgs: the command after -- is looked up on the PATH
// and replaces the process after the drain, with the argv as given.
func TestOfflineThenExecArgs(t *testing.T) {
	ev := &events{}
	host, port := fakeDraind(t, ev, 0)
	var gotPath string
	var gotArgv []string
	execve = func(path string, argv []string, _ []string) error {
		ev.add("exec")
		gotPath, gotArgv = path, argv
		return nil
	}
	defer func() { execve = realExecve }()
	out, err := runOffline(t, "--host", host, "--port", port, "--wait=2s", "--then-exec", "--", "sh", "-c", "nginx -s quit")
	if err != nil {
		t.Fatalf("offline: %v\n%s", err, out)
	}
	sh, _ := exec.LookPath("sh")
	if gotPath != sh || !slices.Equal(gotArgv, []string{"sh", "-c", "nginx -s quit"}) {
		t.Errorf("exec %s %q, want %s [sh -c nginx -s quit]", gotPath, gotArgv, sh)
	}
	if got := ev.list(); !slices.Equal(got, []string{"draind POST /v1/offline", "exec"}) {
		t.Errorf("order %q", got)
	}
}

var realExecve = execve

// TestOfflineThenExecReal runs the command for real in a child process:
// draind offline becomes the pod's own handler, whose output and exit
// status are the hook's.
func TestOfflineThenExecReal(t *testing.T) {
	if os.Getenv("DRAIND_TEST_THEN_EXEC") == "1" {
		cmd := newRootCmd()
		cmd.SetArgs(strings.Split(os.Getenv("DRAIND_TEST_ARGS"), "\x1f"))
		err := cmd.ExecuteContext(context.Background())
		// Reached only if the exec failed.
		os.Stderr.WriteString("not replaced: " + errString(err) + "\n")
		os.Exit(99)
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skipf("SKIP: no sh on the PATH to run as the handler: %v", err)
	}
	ev := &events{}
	host, port := fakeDraind(t, ev, 0)
	child := exec.Command(os.Args[0], "-test.run=^TestOfflineThenExecReal$")
	child.Env = append(os.Environ(), "DRAIND_TEST_THEN_EXEC=1", "DRAIND_TEST_ARGS="+strings.Join([]string{
		"offline", "--host", host, "--port", port, "--wait=2s", "--then-exec", "--", "sh", "-c", "echo handler ran; exit 7"}, "\x1f"))
	out, err := child.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("child: %v, want exit status 7 (the handler's)\n%s", err, out)
	}
	if !strings.Contains(string(out), `"drained":true`) || !strings.Contains(string(out), "handler ran") {
		t.Errorf("output %q: want draind's answer, then the handler's output", out)
	}
	if got := ev.list(); !slices.Equal(got, []string{"draind POST /v1/offline"}) {
		t.Errorf("draind saw %q", got)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestOfflineThenFlagErrors: bad combinations are refused before anything
// is drained.
func TestOfflineThenFlagErrors(t *testing.T) {
	ev := &events{}
	host, port := fakeDraind(t, ev, 0)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--then-exec"}, "needs the command after --"},
		{[]string{"--", "sh"}, "needs --then-exec"},
		{[]string{"--then-sleep=1s", "--then-http-get=http://:80/"}, "exclude each other"},
		{[]string{"--then-http-header=A: b"}, "needs --then-http-get"},
		{[]string{"--then-http-get=ftp://x:21/"}, "scheme"},
		{[]string{"--then-http-get=http://x/"}, "no port"},
		{[]string{"--then-http-get=http://:80/"}, inject.PodIPEnv},
		{[]string{"--then-http-get=http://x:80/", "--then-http-header=nocolon"}, "Name: value"},
	} {
		t.Setenv(inject.PodIPEnv, "")
		out, err := runOffline(t, append([]string{"--host", host, "--port", port, "--wait=1s"}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v (output %q), want %q", tc.args, err, out, tc.want)
		}
	}
	if got := ev.list(); len(got) != 0 {
		t.Errorf("draind was called %q despite bad flags", got)
	}
}
