package headline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

// draindProc is `draind run` on one node: a separate process started in the
// node's network namespace (so its offline API, metrics and conntrack are
// the node's), with the node's pods cgroup to hook, a private bpffs for its
// pins, and a kubeconfig of the draind ServiceAccount: it has exactly the
// rights of deploy/daemonset's RBAC. A fault test can kill it and launch it
// again on the same pins, flags and log (Draind).
type draindProc struct {
	node    *bed.Node
	bin     string
	args    []string
	env     []string
	addr    netip.AddrPort
	pinDir  string
	unmount func() error
	LogPath string
	log     *os.File

	mu  sync.Mutex
	cur *draindRun // the latest launch
}

// draindRun is one launch of the process.
type draindRun struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

func startDraind(ctx context.Context, bin string, node *bed.Node, kubeconfig, dir string, port uint16) (*draindProc, error) {
	return startDraindArgs(ctx, bin, node, kubeconfig, dir, port, nil)
}

// startDraindArgs starts draind with extra flags after the bed's own (a
// later flag wins) and waits until it is ready.
func startDraindArgs(ctx context.Context, bin string, node *bed.Node, kubeconfig, dir string, port uint16, extra []string) (_ *draindProc, err error) {
	p := &draindProc{node: node, bin: bin, addr: netip.AddrPortFrom(node.IP4, port), LogPath: filepath.Join(dir, "draind-"+node.Name+".log")}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.stop())
		}
	}()
	if p.pinDir, p.unmount, err = bed.NewBPFFS(); err != nil {
		return nil, err
	}
	if p.log, err = os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err != nil {
		return nil, fmt.Errorf("creating the draind log: %w", err)
	}
	p.args = append([]string{"run",
		"--node-name", node.Name,
		"--namespace", DraindNamespace,
		"--kubeconfig", kubeconfig,
		"--bpffs-dir", p.pinDir,
		"--cgroup-path", node.Pods.Path,
		"--offline-addr", p.addr.String(),
		"--metrics-addr", "127.0.0.1:9461",
		"--status-socket", filepath.Join(dir, "draind-"+node.Name+".sock"),
		"--log-format", "text",
	}, extra...)
	// Only the flags above configure it: no DRAIND_* from this environment.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DRAIND_") {
			p.env = append(p.env, kv)
		}
	}
	if err := p.launch(); err != nil {
		return nil, err
	}
	if _, err := p.waitReady(ctx, 20*time.Millisecond); err != nil {
		return nil, err
	}
	return p, nil
}

// launch starts the process (again), without waiting for it to be ready.
func (p *draindProc) launch() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r := p.cur; r != nil {
		select {
		case <-r.exited:
		default:
			return fmt.Errorf("starting draind on %s: pid %d still runs", p.node.Name, r.cmd.Process.Pid)
		}
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = p.log, p.log
	if err := kube.StartCmd(p.node.NS.Path(), cmd); err != nil {
		return fmt.Errorf("starting draind on %s: %w", p.node.Name, err)
	}
	r := &draindRun{cmd: cmd, exited: make(chan struct{})}
	go func() {
		r.waitErr = cmd.Wait()
		close(r.exited)
	}()
	p.cur = r
	return nil
}

func (p *draindProc) run() *draindRun {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// waitReady waits until /readyz of the offline API answers ok (informers
// synced, first datapath pass done, programs attached), polling every
// interval, and returns when that answer came.
func (p *draindProc) waitReady(ctx context.Context, interval time.Duration) (time.Time, error) {
	r := p.run()
	if r == nil {
		return time.Time{}, fmt.Errorf("waiting for draind on %s: never started", p.node.Name)
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: netnsDialer{p.node.NS.Do}.DialContext, DisableKeepAlives: true}}
	url := "http://" + p.addr.String() + "/readyz"
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Now(), nil
			}
		}
		select {
		case <-r.exited:
			return time.Time{}, fmt.Errorf("draind on %s exited before it was ready (%v): see %s", p.node.Name, r.waitErr, p.LogPath)
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(interval):
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("draind on %s not ready after a minute: see %s", p.node.Name, p.LogPath)
		}
	}
}

// kill ends the process with SIGKILL — a crash: nothing is cleaned up, the
// pins and attached programs stay — and waits until it has exited.
func (p *draindProc) kill() error {
	r := p.run()
	if r == nil {
		return nil
	}
	select {
	case <-r.exited:
		return nil
	default:
	}
	if err := r.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("killing draind on %s: %w", p.node.Name, err)
	}
	select {
	case <-r.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("draind on %s (pid %d) did not exit within 10s of SIGKILL", p.node.Name, r.cmd.Process.Pid)
	}
}

// stop stops the daemon (SIGTERM, then SIGKILL after 15 s) and removes its
// datapath: programs detached, pins deleted, bpffs unmounted.
func (p *draindProc) stop() error {
	var errs []error
	if r := p.run(); r != nil {
		r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(15 * time.Second):
			r.cmd.Process.Kill()
			<-r.exited
			errs = append(errs, fmt.Errorf("draind on %s did not stop within 15s of SIGTERM", p.node.Name))
		}
	}
	if p.pinDir != "" {
		errs = append(errs, bpf.Remove(p.pinDir))
	}
	if p.unmount != nil {
		errs = append(errs, p.unmount())
	}
	if p.log != nil {
		errs = append(errs, p.log.Close())
	}
	return errors.Join(errs...)
}
