package prom

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Bin returns Debian's Prometheus server (package prometheus, installed by
// test/deps.sh). Without it the test skips, saying why, except under
// PRIVILEGED_TESTS=1 (CI), where it fails.
func Bin(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("PRIVILEGED_TESTS") == "1" {
			t.Fatalf("prometheus not found (test/deps.sh installs the Debian package prometheus): %v", err)
		}
		t.Skipf("SKIP: prometheus not found (apt-get install prometheus, or test/deps.sh): %v", err)
	}
	return p
}

// Server is a Prometheus server a test started.
type Server struct {
	Client
	// Log is the server's output.
	Log string
}

// Start runs Prometheus with the configuration config (prometheus.yml),
// answering on addr (host:port); start starts the command (nil: in this
// process's network namespace). It is stopped when the test ends, and its
// log's last lines are printed if the test failed.
func Start(t testing.TB, config, addr string, start func(*exec.Cmd) error) *Server {
	t.Helper()
	bin := Bin(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &Server{Client: Client{Base: "http://" + addr}, Log: filepath.Join(dir, "prometheus.log")}
	logf, err := os.Create(s.Log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		logf.Close()
		t.Fatalf("starting prometheus: %v", err)
	}
	t.Cleanup(func() {
		stop(cmd)
		logf.Close()
		if t.Failed() {
			s.TailLog(t, 40)
		}
	})
	return s
}

// stop ends the server: SIGTERM, then SIGKILL to its process group after
// 10 s.
func stop(cmd *exec.Cmd) {
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Process.Kill()
		<-done
	}
}

// TailLog prints the last lines of the server's log.
func (s *Server) TailLog(t testing.TB, lines int) {
	t.Helper()
	b, err := os.ReadFile(s.Log)
	if err != nil {
		t.Logf("reading %s: %v", s.Log, err)
		return
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	t.Logf("--- last lines of %s:\n%s", s.Log, strings.Join(ls, "\n"))
}
