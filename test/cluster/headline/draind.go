package headline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// MainModuleDir is the root of the draind module (two levels above
// test/cluster).
func MainModuleDir() (string, error) {
	d, err := kubebin.ModuleDir()
	if err != nil {
		return "", err
	}
	root := filepath.Dir(filepath.Dir(d))
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(b, []byte("module github.com/draind/draind\n")) {
		return "", fmt.Errorf("locating the draind module: %s/go.mod is not github.com/draind/draind (%v)", root, err)
	}
	return root, nil
}

// BuildDraind builds the draind binary (go build ./cmd/draind in the main
// module) into dir.
func BuildDraind(ctx context.Context, dir string) (string, error) {
	root, err := MainModuleDir()
	if err != nil {
		return "", err
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("building draind needs the go command on PATH: %w", err)
	}
	out := filepath.Join(dir, "draind")
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", out, "./cmd/draind")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building draind (go build ./cmd/draind in %s): %w: %s", root, err, b)
	}
	return out, nil
}

// draindProc is `draind run` on one node: a separate process started in the
// node's network namespace (so its offline API, metrics and conntrack are
// the node's), with the node's pods cgroup to hook, a private bpffs for its
// pins, and a kubeconfig of the draind ServiceAccount: it has exactly the
// rights of deploy/daemonset's RBAC.
type draindProc struct {
	node    *bed.Node
	cmd     *exec.Cmd
	pinDir  string
	unmount func() error
	LogPath string
	log     *os.File
	exited  chan struct{}
	waitErr error
}

func startDraind(ctx context.Context, bin string, node *bed.Node, kubeconfig, dir string, port uint16) (_ *draindProc, err error) {
	p := &draindProc{node: node, exited: make(chan struct{}), LogPath: filepath.Join(dir, "draind-"+node.Name+".log")}
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
	addr := netip.AddrPortFrom(node.IP4, port)
	p.cmd = exec.Command(bin, "run",
		"--node-name", node.Name,
		"--namespace", DraindNamespace,
		"--kubeconfig", kubeconfig,
		"--bpffs-dir", p.pinDir,
		"--cgroup-path", node.Pods.Path,
		"--offline-addr", addr.String(),
		"--metrics-addr", "127.0.0.1:9461",
		"--status-socket", filepath.Join(dir, "draind-"+node.Name+".sock"),
		"--log-format", "text",
	)
	// Only the flags above configure it: no DRAIND_* from this environment.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DRAIND_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := kube.StartCmd(node.NS.Path(), p.cmd); err != nil {
		p.cmd = nil
		return nil, fmt.Errorf("starting draind on %s: %w", node.Name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()

	// Ready: /readyz of the offline API answers ok (informers synced,
	// first datapath pass done, programs attached).
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: netnsDialer{node.NS.Do}.DialContext, DisableKeepAlives: true}}
	url := "http://" + addr.String() + "/readyz"
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("draind on %s exited before it was ready (%v): see %s", node.Name, p.waitErr, p.LogPath)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("draind on %s not ready after a minute: see %s", node.Name, p.LogPath)
		}
	}
}

// stop stops the daemon (SIGTERM, then SIGKILL after 15 s) and removes its
// datapath: programs detached, pins deleted, bpffs unmounted.
func (p *draindProc) stop() error {
	var errs []error
	if p.cmd != nil {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			p.cmd.Process.Kill()
			<-p.exited
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
