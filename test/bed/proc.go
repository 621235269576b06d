package bed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// envHelper marks a re-executed helper process.
const envHelper = "DRAIND_BED_HELPER"

// Proc is a helper process (a server or a client) answering JSON requests
// on its stdin with one JSON line each on its stdout.
type Proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *bufio.Reader
	mu     sync.Mutex
	waitCh chan error
}

// StartProc re-executes the current binary as a helper inside ns (if not
// nil) and cgroup cg (if not nil). args[0] is the mode: "serve" or "client".
func StartProc(ns *NetNS, cg *Cgroup, args ...string) (*Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("finding own executable: %w", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Env = append(os.Environ(), envHelper+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cg != nil {
		f, err := cg.Open()
		if err != nil {
			return nil, fmt.Errorf("opening cgroup %s: %w", cg.Path, err)
		}
		defer f.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(f.Fd())
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	// A child starts in the network namespace of the thread that forks it:
	// start it from a thread inside ns (no `ip netns exec`, no iproute2).
	start := cmd.Start
	if ns != nil {
		start = func() error { return ns.Do(cmd.Start) }
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("starting helper %v: %w", args, err)
	}
	p := &Proc{cmd: cmd, stdin: stdin, out: bufio.NewReaderSize(stdout, 1<<16), waitCh: make(chan error, 1)}
	go func() { p.waitCh <- cmd.Wait() }()
	// The first line says the helper is ready (listeners bound, etc.).
	var hello Response
	if err := p.read(&hello, 30*time.Second); err != nil {
		p.Kill()
		return nil, fmt.Errorf("waiting for helper %v: %w", args, err)
	}
	if hello.Err != "" {
		p.Kill()
		return nil, fmt.Errorf("helper %v: %s", args, hello.Err)
	}
	return p, nil
}

// Pid returns the helper's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

func (p *Proc) read(v any, timeout time.Duration) error {
	type result struct {
		line []byte
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		l, err := p.out.ReadBytes('\n')
		ch <- result{l, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return fmt.Errorf("reading helper output: %w", r.err)
		}
		return json.Unmarshal(r.line, v)
	case err := <-p.waitCh:
		p.waitCh <- err
		return fmt.Errorf("helper exited: %v", err)
	case <-time.After(timeout):
		// The reader goroutine would take the next answer as this one's:
		// a helper that missed its deadline is unusable, stop it.
		p.cmd.Process.Kill()
		return errors.New("helper did not answer in time (stopped it)")
	}
}

// Call sends one request and waits for its response.
func (p *Proc) Call(req Request) (Response, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := json.Marshal(req)
	if _, err := p.stdin.Write(append(b, '\n')); err != nil {
		return Response{}, fmt.Errorf("sending %s to helper: %w", req.Op, err)
	}
	timeout := 60 * time.Second
	if req.Timeout > 0 {
		timeout += req.Timeout
	}
	var resp Response
	if err := p.read(&resp, timeout); err != nil {
		return resp, fmt.Errorf("%s: %w", req.Op, err)
	}
	if resp.Err != "" {
		return resp, fmt.Errorf("%s: %s", req.Op, resp.Err)
	}
	return resp, nil
}

// Kill stops the helper at once.
func (p *Proc) Kill() error {
	p.cmd.Process.Kill()
	select {
	case <-p.waitCh:
	case <-time.After(5 * time.Second):
	}
	return nil
}
