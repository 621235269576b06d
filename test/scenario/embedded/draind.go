package embedded

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/test/bed"
)

// DraindNamespace holds the drain Leases.
const DraindNamespace = "draind-system"

// nodeDaemon is the real draind of one node, in this process: the real
// datapath attached to the node's pods cgroup (pinned on a private bpffs),
// conntrack of the node's namespace, the offline API on the node IP inside
// the node's namespace, and informers over the node's view of the fake API.
type nodeDaemon struct {
	node    *bed.Node
	pinDir  string
	unmount func() error
	dp      *bpf.Datapath
	ct      *conntrack.Netlink
	d       *daemon.Daemon
	cancel  context.CancelFunc
	done    chan struct{}
}

func startDaemon(ctx context.Context, api *fake.Clientset, node *bed.Node, offlinePort uint16, log *slog.Logger) (_ *nodeDaemon, err error) {
	n := &nodeDaemon{node: node, done: make(chan struct{})}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.stop())
		}
	}()
	if n.pinDir, n.unmount, err = bed.NewBPFFS(); err != nil {
		return nil, err
	}
	if n.dp, err = bpf.Load(bpf.Options{PinDir: n.pinDir}); err != nil {
		return nil, fmt.Errorf("loading the datapath of %s: %w", node.Name, err)
	}
	if n.ct, err = conntrack.Open(conntrack.Options{NetNS: node.NS.Path()}); err != nil {
		return nil, fmt.Errorf("opening conntrack of %s: %w", node.Name, err)
	}
	if n.d, err = daemon.New(daemon.Config{
		Node: node.Name, Namespace: DraindNamespace, Version: "demo",
		RegistryOnlyPolicy: bpf.PolicyRefuse, // as `draind run`
		Logger:             log.With("node", node.Name),
	}, nodeView{api}, n.dp, n.ct); err != nil {
		return nil, fmt.Errorf("configuring draind on %s: %w", node.Name, err)
	}
	if err := n.dp.Attach(node.Pods.Path); err != nil {
		return nil, fmt.Errorf("attaching the datapath on %s: %w", node.Name, err)
	}
	n.d.SetAttached(true)
	// The offline API listens on the node IP inside the node's namespace,
	// as a hostNetwork DaemonSet pod does.
	addr := netip.AddrPortFrom(node.IP4, offlinePort).String()
	var l net.Listener
	if err := node.NS.Do(func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		return nil, fmt.Errorf("listening for the offline API on %s in %s: %w", addr, node.Name, err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	runDone, serveDone := make(chan error, 1), make(chan error, 1)
	go func() { runDone <- n.d.Run(rctx) }()
	go func() { serveDone <- nodeapi.Serve(rctx, n.d.API().HTTPServer(addr), l) }()
	go func() {
		defer close(n.done)
		if err := errors.Join(<-runDone, <-serveDone); err != nil {
			log.Error("draind stopped with an error", "node", node.Name, "err", err)
		}
	}()
	// Ready: informers synced, first datapath pass done, programs attached.
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	deadline := time.After(30 * time.Second)
	for !n.d.Ready() {
		select {
		case <-t.C:
		case <-n.done:
			return nil, fmt.Errorf("draind on %s stopped before it was ready", node.Name)
		case <-deadline:
			return nil, fmt.Errorf("draind on %s not ready after 30s", node.Name)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return n, nil
}

// stop ends the daemon and removes its datapath: programs detached, pins
// deleted, the private bpffs unmounted.
func (n *nodeDaemon) stop() error {
	if n.cancel != nil {
		n.cancel()
		<-n.done
	}
	var errs []error
	if n.dp != nil {
		errs = append(errs, n.dp.Close())
	}
	if n.pinDir != "" {
		errs = append(errs, bpf.Remove(n.pinDir))
	}
	if n.ct != nil {
		errs = append(errs, n.ct.Close())
	}
	if n.unmount != nil {
		errs = append(errs, n.unmount())
	}
	return errors.Join(errs...)
}
