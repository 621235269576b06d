package headline

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
)

// DraindOptions configure one node's draind for a test that drives it
// itself (the fault tests: kill -9, restart, odd flags).
type DraindOptions struct {
	// Binary is the draind binary (draindbin.Build).
	Binary string
	// Node is the bed node it runs on (its namespace, pods cgroup, IP).
	Node *bed.Node
	// Kubeconfig is the draind ServiceAccount's, as seen from the node
	// (WriteDraindKubeconfig).
	Kubeconfig string
	// Dir holds its log and status socket.
	Dir string
	// Port of the offline API on the node IP; 0 means 9460.
	Port uint16
	// Args are extra flags of `draind run`, after the bed's own: a later
	// flag wins (--lease-duration=10s, --linger=10s, ...).
	Args []string
}

// Draind is `draind run` on one node, under a test's control: Kill ends it
// like a crash (SIGKILL: pins and attached programs stay), Start runs it
// again with the same pin directory, flags and log — what a DaemonSet does
// after a crash or during a rolling update.
type Draind struct {
	p *draindProc
}

// StartDraind starts draind on o.Node with a private bpffs and waits until
// it is ready. Stop removes it.
func StartDraind(ctx context.Context, o DraindOptions) (*Draind, error) {
	if o.Port == 0 {
		o.Port = 9460
	}
	p, err := startDraindArgs(ctx, o.Binary, o.Node, o.Kubeconfig, o.Dir, o.Port, o.Args)
	if err != nil {
		return nil, err
	}
	return &Draind{p: p}, nil
}

// WriteDraindKubeconfig writes a kubeconfig for draind on node n: a token of
// the draind ServiceAccount (ApplyRBAC), reaching the apiserver through the
// node's relay.
func WriteDraindKubeconfig(ctx context.Context, kc *kube.Cluster, n *kube.Node, path string) error {
	cfg, err := kc.ServiceAccountConfig(ctx, DraindNamespace, DraindServiceAccount, time.Hour)
	if err != nil {
		return err
	}
	return kube.WriteKubeconfig(path, n.Config(cfg))
}

// Kill ends the running process with SIGKILL and waits until it has exited.
// Killing a stopped one does nothing.
func (d *Draind) Kill() error { return d.p.kill() }

// Start launches the process again (same pins, flags and log) and returns
// at once: WaitReady says when it is ready.
func (d *Draind) Start() error { return d.p.launch() }

// WaitReady waits until the current process answers ok on /readyz, polling
// every interval, and returns when it did (late by at most interval).
func (d *Draind) WaitReady(ctx context.Context, interval time.Duration) (time.Time, error) {
	return d.p.waitReady(ctx, interval)
}

// Pid is the current process's id.
func (d *Draind) Pid() int { return d.p.run().cmd.Process.Pid }

// PinDir is its bpffs directory: read it with bpf.OpenPinned.
func (d *Draind) PinDir() string { return d.p.pinDir }

// LogPath is its log file, appended to by every launch.
func (d *Draind) LogPath() string { return d.p.LogPath }

// OfflineAddr is its offline API on the node IP (what pods call as
// $HOST_IP).
func (d *Draind) OfflineAddr() netip.AddrPort { return d.p.addr }

// Node is the bed node it runs on.
func (d *Draind) Node() *bed.Node { return d.p.node }

// Stop stops the daemon (SIGTERM) and removes its datapath: programs
// detached, pins deleted, bpffs unmounted.
func (d *Draind) Stop() error {
	if err := d.p.stop(); err != nil {
		return fmt.Errorf("stopping draind on %s: %w", d.p.node.Name, err)
	}
	return nil
}
