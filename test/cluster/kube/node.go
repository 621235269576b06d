package kube

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/draind/draind/test/cluster/kubebin"
)

// kube-proxy's metrics and health addresses inside a node's namespace. Each
// node has its own loopback, so fixed ports cannot collide.
const (
	proxyMetricsAddr = "127.0.0.1:10249"
	proxyHealthzAddr = "127.0.0.1:10256"
)

// NodeConfig describes a node: a network namespace that plays the host of
// some pods. The namespace's loopback must be up (test/bed's nodes are).
type NodeConfig struct {
	// Name of the Node object and kube-proxy's --hostname-override.
	Name string
	// NetnsPath is the node's network namespace, e.g. /proc/<pid>/ns/net
	// or /run/netns/<name>.
	NetnsPath string
	// InternalIPs are the node's addresses (primary first, at most one per
	// family), published as the Node's InternalIPs; kube-proxy takes its node
	// IPs from them.
	InternalIPs []netip.Addr
	// PodCIDRs, if set, become spec.podCIDRs (and the first spec.podCIDR).
	PodCIDRs []netip.Prefix
	// NoProxy starts no kube-proxy (for a node whose Services are handled by
	// something else); the relay and Node object are still created.
	NoProxy bool
	// ProxyArgs are appended to the bed's kube-proxy flags.
	ProxyArgs []string
	// Registered: a real kubelet registers the Node and reports its
	// status; AddNode then only starts the relay and kube-proxy.
	Registered bool
}

// Node is a node of the cluster: a Node object, a relay that makes the
// apiserver reachable from inside the node's namespace, and kube-proxy.
type Node struct {
	Name        string
	NetnsPath   string
	InternalIPs []netip.Addr

	c       *Cluster
	relay   *relay
	proxy   *process
	metrics *http.Client
}

// AddNode creates the Node object (Ready, with its InternalIP), starts the
// apiserver relay in the node's namespace and kube-proxy in iptables mode,
// and returns once kube-proxy has completed its first sync. Cluster.Stop
// stops the node; so does Node.Stop.
func (c *Cluster) AddNode(ctx context.Context, nc NodeConfig) (_ *Node, err error) {
	if nc.Name == "" || nc.NetnsPath == "" || len(nc.InternalIPs) == 0 {
		return nil, fmt.Errorf("adding node: Name, NetnsPath and InternalIPs are required (got %q, %q, %v)", nc.Name, nc.NetnsPath, nc.InternalIPs)
	}
	n := &Node{Name: nc.Name, NetnsPath: nc.NetnsPath, InternalIPs: nc.InternalIPs, c: c}
	defer func() {
		if err != nil {
			n.stop()
		}
	}()
	if !nc.Registered {
		if err := c.createNodeObject(ctx, nc); err != nil {
			return nil, err
		}
	}
	if n.relay, err = startRelay(c.log, nc.NetnsPath, "127.0.0.1:0", c.apiserverAddr); err != nil {
		return nil, fmt.Errorf("adding node %s: %w", nc.Name, err)
	}
	if !nc.NoProxy {
		if err := n.startProxy(ctx, nc.ProxyArgs); err != nil {
			return nil, fmt.Errorf("adding node %s: %w", nc.Name, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, fmt.Errorf("adding node %s: cluster stopped", nc.Name)
	}
	c.nodes = append(c.nodes, n)
	return n, nil
}

func (c *Cluster) createNodeObject(ctx context.Context, nc NodeConfig) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   nc.Name,
			Labels: map[string]string{corev1.LabelHostname: nc.Name, corev1.LabelOSStable: "linux"},
		},
	}
	for _, p := range nc.PodCIDRs {
		node.Spec.PodCIDRs = append(node.Spec.PodCIDRs, p.String())
	}
	if len(node.Spec.PodCIDRs) > 0 {
		node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
	}
	created, err := c.Admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating node %s: %w", nc.Name, err)
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			Reason: "DraindTestBed", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
	for _, ip := range nc.InternalIPs {
		created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip.String()})
	}
	created.Status.Addresses = append(created.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: nc.Name})
	if _, err := c.Admin.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("setting status of node %s: %w", nc.Name, err)
	}
	return nil
}

func (n *Node) startProxy(ctx context.Context, extra []string) error {
	c := n.c
	// system:kube-proxy is bound to system:node-proxier by the apiserver's
	// bootstrap RBAC policy: kube-proxy runs with its real rights.
	cfg, err := c.UserConfig("system:kube-proxy")
	if err != nil {
		return err
	}
	kubeconfig := c.path("kube-proxy-" + n.Name + ".kubeconfig")
	if err := WriteKubeconfig(kubeconfig, n.Config(cfg)); err != nil {
		return err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--proxy-mode=iptables",
		"--hostname-override=" + n.Name,
		"--detect-local-mode=ClusterCIDR",
		"--cluster-cidr=" + c.cfg.ClusterCIDR,
		"--nodeport-addresses=primary",
		// kube-proxy would otherwise size the conntrack table, a global
		// setting shared with the host.
		"--conntrack-max-per-core=0",
		"--metrics-bind-address=" + proxyMetricsAddr,
		"--healthz-bind-address=" + proxyHealthzAddr,
		"--v=2",
	}
	args = append(args, extra...)
	n.metrics = &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
				return dialInNetns(ctx, n.NetnsPath, addr)
			},
			DisableKeepAlives: true,
		},
	}
	n.proxy, err = startProcess(c.log, kubebin.Proxy+"-"+n.Name, n.NetnsPath, c.path("kube-proxy-"+n.Name+".log"), c.bins.Path(kubebin.Proxy), args...)
	if err != nil {
		return err
	}
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	err = Poll(wctx, 50*time.Millisecond, func() (bool, error) {
		if err := n.proxy.deadErr(); err != nil {
			return false, err
		}
		last, err := n.ProxyLastSync(wctx)
		if err != nil {
			return false, nil // not serving metrics yet
		}
		return !last.IsZero(), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-proxy's first sync: %w", err)
	}
	c.log.Info("kube-proxy synced", "node", n.Name, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// APIServerURL is the apiserver's URL as seen from inside the node's
// namespace (the relay on the namespace's loopback).
func (n *Node) APIServerURL() string { return "https://" + n.relay.addr }

// Config returns a copy of cfg that reaches the apiserver from inside the
// node's namespace, for a process (draind) running on this node.
func (n *Node) Config(cfg *rest.Config) *rest.Config {
	cp := rest.CopyConfig(cfg)
	cp.Host = n.APIServerURL()
	return cp
}

// ProxyMetrics fetches kube-proxy's Prometheus metrics from inside the
// node's namespace: series name (with labels, as exposed) → value.
func (n *Node) ProxyMetrics(ctx context.Context) (map[string]float64, error) {
	if n.metrics == nil {
		return nil, fmt.Errorf("reading kube-proxy metrics on %s: node runs no kube-proxy", n.Name)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+proxyMetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("building kube-proxy metrics request: %w", err)
	}
	resp, err := n.metrics.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading kube-proxy metrics on %s: %w", n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading kube-proxy metrics on %s: status %d: %v", n.Name, resp.StatusCode, err)
	}
	return parseMetrics(string(body)), nil
}

// ProxyLastSync is when kube-proxy last finished programming the data path
// (kubeproxy_sync_proxy_rules_last_timestamp_seconds; the latest over IP
// families), zero before its first sync.
func (n *Node) ProxyLastSync(ctx context.Context) (time.Time, error) {
	m, err := n.ProxyMetrics(ctx)
	if err != nil {
		return time.Time{}, err
	}
	var latest float64
	for series, v := range m {
		if metricName(series) == "kubeproxy_sync_proxy_rules_last_timestamp_seconds" && v > latest {
			latest = v
		}
	}
	if latest == 0 {
		return time.Time{}, nil
	}
	sec, frac := math.Modf(latest)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// WaitProxyQuiet waits until kube-proxy's last sync (of any IP family) is at
// least quiet ago. kube-proxy syncs at most once per
// --iptables-min-sync-period (1 s by default), so a change made within that
// long of the previous sync waits for the period to end; a measurement of
// kube-proxy's reaction "when isolated" must start from a quiet proxy.
func (n *Node) WaitProxyQuiet(ctx context.Context, quiet time.Duration) error {
	err := Poll(ctx, 50*time.Millisecond, func() (bool, error) {
		if err := n.c.Healthy(); err != nil {
			return false, err
		}
		last, err := n.ProxyLastSync(ctx)
		if err != nil {
			return false, err
		}
		return !last.IsZero() && time.Since(last) >= quiet, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for kube-proxy on %s to be quiet for %v: %w", n.Name, quiet, err)
	}
	return nil
}

// Stop stops the node's kube-proxy and relay. The Node object stays.
func (n *Node) Stop() error {
	c := n.c
	c.mu.Lock()
	for i, m := range c.nodes {
		if m == n {
			c.nodes = append(c.nodes[:i], c.nodes[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	return n.stop()
}

func (n *Node) stop() error {
	var errs []error
	if n.proxy != nil {
		errs = append(errs, n.proxy.stop(stopGrace))
	}
	if n.relay != nil {
		errs = append(errs, n.relay.close())
	}
	if n.metrics != nil {
		n.metrics.CloseIdleConnections()
	}
	return errors.Join(errs...)
}

// parseMetrics reads the Prometheus text format: every sample line becomes
// series → value; comments and malformed lines are skipped.
func parseMetrics(text string) map[string]float64 {
	out := map[string]float64{}
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

func metricName(series string) string {
	name, _, _ := strings.Cut(series, "{")
	return name
}

// relay makes the apiserver, listening on the host's loopback, reachable on
// the loopback of a node's namespace: its listening socket is created inside
// that namespace, and each accepted connection is piped to the apiserver from
// the host side.
type relay struct {
	ln     net.Listener
	addr   string
	target string
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// Relay forwards TCP connections accepted on an address (in a network
// namespace) to a target reached from the test's own namespace.
type Relay struct{ r *relay }

// StartRelay listens on listen inside the namespace at nsPath ("" for the
// test's own) and pipes every connection to target.
func StartRelay(log *slog.Logger, nsPath, listen, target string) (*Relay, error) {
	r, err := startRelay(log, nsPath, listen, target)
	if err != nil {
		return nil, err
	}
	return &Relay{r: r}, nil
}

// Addr is the address the relay listens on.
func (r *Relay) Addr() string { return r.r.addr }

// Close stops listening and closes every relayed connection.
func (r *Relay) Close() error { return r.r.close() }

func startRelay(log *slog.Logger, nsPath, listen, target string) (*relay, error) {
	ln, err := listenInNetns(nsPath, listen)
	if err != nil {
		return nil, fmt.Errorf("starting apiserver relay: %w", err)
	}
	r := &relay{ln: ln, addr: ln.Addr().String(), target: target, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	log.Debug("apiserver relay started", "netns", nsPath, "addr", r.addr, "target", target)
	return r, nil
}

func (r *relay) serve() {
	defer r.wg.Done()
	for {
		in, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		out, err := net.DialTimeout("tcp", r.target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		if !r.track(in, out) {
			return
		}
		r.wg.Add(2)
		go r.pipe(in, out)
		go r.pipe(out, in)
	}
}

func (r *relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	io.Copy(dst, src)
	// Closing both ends of a pair makes the other direction end too.
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
	dst.Close()
	src.Close()
}

func (r *relay) close() error {
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	err := r.ln.Close()
	r.wg.Wait()
	return err
}
