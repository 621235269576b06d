package kube

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// process is one running component. Its output goes to a log file that error
// messages quote the end of, so a component that dies says why.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	waitErr error
	log     *slog.Logger
}

// startProcess starts bin with args in the namespace at nsPath ("" for the
// host), logging to logPath.
func startProcess(log *slog.Logger, name, nsPath, logPath, bin string, args ...string) (*process, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("creating log for %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = f
	cmd.Stderr = f
	if err := startCmd(nsPath, cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: f, done: make(chan struct{}), log: log}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	log.Debug("started component", "component", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// exited reports whether the process has ended, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// deadErr returns a descriptive error if the process has exited, else nil.
func (p *process) deadErr() error {
	if gone, err := p.exited(); gone {
		return fmt.Errorf("%s exited (%v); last log lines:\n%s", p.name, err, p.tail(20))
	}
	return nil
}

// tail returns the last n lines of the process's log.
func (p *process) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.logPath, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stop ends the process: SIGTERM, then SIGKILL to its process group after
// grace. It is safe to call more than once.
func (p *process) stop(grace time.Duration) error {
	if gone, _ := p.exited(); !gone {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			p.log.Warn("component ignored SIGTERM, killing it", "component", p.name, "grace", grace)
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	p.logFile.Close()
	return nil
}

// limitedBuffer keeps the first 1 MiB written to it, for a command's
// standard error quoted in an error message.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

const limitedBufferMax = 1 << 20

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := limitedBufferMax - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}

func (b *limitedBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}
func (b *limitedBuffer) String() string { return string(b.Bytes()) }
