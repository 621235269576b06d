package realnode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/test/cluster/files"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// A multi-node bed: one control plane and N real nodes on this host, each
// a network namespace with its own containerd, kubelet and kube-proxy.
//
//	host namespace                       node namespaces (one per node)
//	kube-apiserver 127.0.0.1:P <- relay <- hostIP_i:P <--veth--> eth0 nodeIP_i  kubelet, containerd,
//	kube-controller-manager, scheduler                                          kube-proxy, cni0 10.244.i.0/24
//	                                                                  eth1 10.251.0.(i+1)
//	                                       fabric namespace: bridge br0 <--------'
//
// Pod networks are routed between nodes over eth1, through a bridge in a
// namespace of its own: traffic between nodes never enters the host's
// namespace, and nothing leaves the machine. The apiserver advertises the
// first node's hostIP (the "kubernetes" Service), which every node's link
// guard lets through.

// Proxy modes of kube-proxy the bed runs (this kernel has no IPVS).
const (
	ProxyIPTables = "iptables"
	ProxyNFTables = "nftables"
)

// MultiConfig describes a multi-node bed. The zero value is 3 nodes with
// kube-proxy in iptables mode.
type MultiConfig struct {
	// Nodes is the number of nodes (default 3).
	Nodes int
	// ProxyMode is kube-proxy's mode: ProxyIPTables (default) or
	// ProxyNFTables.
	ProxyMode string
	// Binaries to run; nil builds or finds them with kubebin.Ensure.
	Binaries *kubebin.Set
	// Log receives progress; nil means slog.Default().
	Log *slog.Logger
}

// Multi is a running control plane and its nodes.
type Multi struct {
	// Cluster is the control plane; Cluster.Admin is a system:masters client.
	Cluster *kube.Cluster
	// Nodes are the nodes, in order; each runs its own containerd, kubelet
	// and kube-proxy.
	Nodes []*Node
	// Dir holds every file of the run; each node's are in Dir/<node>.
	Dir string
	// Kubeconfig is an admin kubeconfig for kubectl.
	Kubeconfig string

	log       *slog.Logger
	lock      net.Listener
	state     *hostState
	cp        *Node // the control plane's own processes (kube-scheduler)
	proxyMode string
	stopOnce  sync.Once
	stopErr   error
}

// ProxyMode is the mode kube-proxy runs in on every node.
func (m *Multi) ProxyMode() string { return m.proxyMode }

// PinDir is where the draind pod of node keeps its pins: draind pods of
// nodes sharing a host need a directory each.
func PinDir(node string) string { return "/sys/fs/bpf/draind-" + node }

// fabricNet is the nodes' link to each other: node i has .(i+1).
var fabricNet = netip.MustParsePrefix("10.251.0.0/24")

func fabricIP(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 251, 0, byte(i + 1)}) }

// nodePodCIDR is node i's pod network, inside ClusterCIDR.
func nodePodCIDR(i int) string { return fmt.Sprintf("10.244.%d.0/24", i) }

// StartMulti brings up the control plane and the nodes and returns once
// every Node is Ready and untainted, every kube-proxy has synced and the
// test images are imported on every node. On error, everything started
// so far is stopped and removed.
func StartMulti(ctx context.Context, cfg MultiConfig) (_ *Multi, err error) {
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.Nodes < 1 || cfg.Nodes > 200 {
		return nil, fmt.Errorf("a multi-node bed has 1 to 200 nodes, not %d", cfg.Nodes)
	}
	if cfg.ProxyMode == "" {
		cfg.ProxyMode = ProxyIPTables
	}
	if err := checkProxyMode(cfg.ProxyMode); err != nil {
		return nil, err
	}
	if missing := Tools(); len(missing) > 0 {
		return nil, fmt.Errorf("a real node needs %s (Debian: apt-get install containerd runc containernetworking-plugins iproute2 iptables nftables)", strings.Join(missing, ", "))
	}
	m := &Multi{log: cfg.Log, proxyMode: cfg.ProxyMode}
	if m.log == nil {
		m.log = slog.Default()
	}
	start := time.Now()
	if m.lock, m.Dir, m.state, err = prepareHost(m.log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, m.Stop())
		}
	}()
	if err := m.createNetwork(ctx, randomSuffix(), cfg.Nodes); err != nil {
		return nil, err
	}
	if err := m.startControlPlane(ctx, cfg.Binaries); err != nil {
		return nil, err
	}
	m.log.Info("control plane ready", "took", time.Since(start).Round(time.Millisecond))
	images, err := BuildTestImages(ctx, filepath.Join(m.Dir, "images"))
	if err != nil {
		return nil, err
	}
	if err := m.eachNode(func(n *Node) error {
		if err := n.startContainerd(ctx); err != nil {
			return err
		}
		if err := n.ImportImages(ctx, images); err != nil {
			return err
		}
		return n.startKubelet(ctx)
	}); err != nil {
		return nil, err
	}
	m.log.Info("kubelets ready", "nodes", len(m.Nodes), "took", time.Since(start).Round(time.Millisecond))
	if err := m.eachNode(func(n *Node) error { return m.startProxy(ctx, n) }); err != nil {
		return nil, err
	}
	m.log.Info("multi-node bed ready", "nodes", len(m.Nodes), "proxy_mode", m.proxyMode, "took", time.Since(start).Round(time.Millisecond), "dir", m.Dir)
	return m, nil
}

func checkProxyMode(mode string) error {
	switch mode {
	case ProxyIPTables:
		return nil
	case ProxyNFTables:
		if _, err := exec.LookPath("nft"); err != nil {
			return errors.New("kube-proxy's nftables mode needs the nft command (Debian: apt-get install nftables)")
		}
		return nil
	}
	return fmt.Errorf("kube-proxy mode %q: the bed runs %s or %s (this kernel has no IPVS)", mode, ProxyIPTables, ProxyNFTables)
}

// createNetwork creates the fabric and the nodes' namespaces, links and
// cgroup roots, recording each in the state file before creating it.
func (m *Multi) createNetwork(ctx context.Context, suffix string, count int) error {
	fabric := "rnf-" + suffix
	m.state.MoreNetns = append(m.state.MoreNetns, fabric)
	if err := m.state.save(); err != nil {
		return err
	}
	if err := runSteps(ctx, "creating the nodes' fabric", [][]string{
		{"ip", "netns", "add", fabric},
		{"ip", "-n", fabric, "link", "set", "lo", "up"},
		{"ip", "-n", fabric, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", fabric, "link", "set", "br0", "up"},
	}); err != nil {
		return err
	}
	for i := range count {
		name := fmt.Sprintf("rn-%s-%c", suffix, 'a'+i)
		n := &Node{Name: name, log: m.log, Dir: filepath.Join(m.Dir, name),
			podCIDR: nodePodCIDR(i), cgroupRoot: "/" + name, multi: m}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return err
		}
		var err error
		if n.HostIP, n.NodeIP, err = pickLink(); err != nil {
			return err
		}
		nc := netnsConfig{name: name, hostVeth: fmt.Sprintf("rnh-%s%c", suffix, 'a'+i), hostIP: n.HostIP, nodeIP: n.NodeIP}
		if i > 0 {
			nc.alsoAllowed = []netip.Addr{m.Nodes[0].HostIP}
		}
		m.state.MoreNetns = append(m.state.MoreNetns, name)
		m.state.CgroupRoots = append(m.state.CgroupRoots, name)
		m.state.PinDirs = append(m.state.PinDirs, PinDir(name))
		if err := m.state.save(); err != nil {
			return err
		}
		if err := createNetns(ctx, nc); err != nil {
			return err
		}
		n.NetnsPath = netnsPath(name)
		port := fmt.Sprintf("f%d", i)
		if err := runSteps(ctx, "joining "+name+" to the fabric", [][]string{
			{"ip", "-n", name, "link", "add", "eth1", "type", "veth", "peer", "name", port, "netns", fabric},
			{"ip", "-n", fabric, "link", "set", port, "master", "br0", "up"},
			{"ip", "-n", name, "addr", "add", netip.PrefixFrom(fabricIP(i), fabricNet.Bits()).String(), "dev", "eth1"},
			{"ip", "-n", name, "link", "set", "eth1", "up"},
		}); err != nil {
			return err
		}
		if err := createCgroupRoot(name); err != nil {
			return err
		}
		m.Nodes = append(m.Nodes, n)
	}
	// Every node routes the other nodes' pod networks over the fabric.
	var routes [][]string
	for i, n := range m.Nodes {
		for j := range m.Nodes {
			if i != j {
				routes = append(routes, []string{"ip", "-n", filepath.Base(n.NetnsPath), "route", "add", nodePodCIDR(j), "via", fabricIP(j).String(), "dev", "eth1"})
			}
		}
	}
	return runSteps(ctx, "routing the pod networks", routes)
}

func runSteps(ctx context.Context, what string, steps [][]string) error {
	for _, s := range steps {
		if _, err := run(ctx, "", s[0], s[1:]...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// createCgroupRoot creates a kubelet's cgroup root in every hierarchy (the
// kubelet requires it to exist), with the cpuset hierarchy's CPUs and
// memory nodes copied from its parent (a new v1 cpuset has none).
func createCgroupRoot(name string) error {
	for _, root := range cgroupMounts() {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(root, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
				return fmt.Errorf("setting %s of %s: %w", f, d, err)
			}
		}
	}
	return nil
}

// startControlPlane starts the control plane (serving on every node's
// hostIP through relays), the scheduler, and gives every node its view of
// it.
func (m *Multi) startControlPlane(ctx context.Context, bins *kubebin.Set) error {
	first := m.Nodes[0]
	var hosts []string
	for _, n := range m.Nodes {
		hosts = append(hosts, n.HostIP.String())
	}
	dir := filepath.Join(m.Dir, "cluster")
	c, err := kube.Start(ctx, kube.Config{
		Binaries:     bins,
		Dir:          dir,
		ServiceCIDR:  ServiceCIDR,
		ClusterCIDR:  ClusterCIDR,
		ServingHosts: hosts,
		APIServerArgs: []string{
			"--advertise-address=" + first.HostIP.String(),
			"--endpoint-reconciler-type=lease",
			"--kubelet-preferred-address-types=InternalIP",
		},
		ControllerManagerArgs: []string{
			"--controllers=" + strings.Join(Controllers, ","),
			"--service-account-private-key-file=" + filepath.Join(dir, "pki/sa.key"),
			"--root-ca-file=" + filepath.Join(dir, "pki/ca.crt"),
		},
		Log: m.log,
	})
	if c != nil {
		m.Cluster = c
	}
	if err != nil {
		return err
	}
	m.Kubeconfig = filepath.Join(m.Dir, "admin.kubeconfig")
	if err := kube.WriteKubeconfig(m.Kubeconfig, c.AdminConfig); err != nil {
		return err
	}
	_, port, _ := net.SplitHostPort(c.APIServerAddr())
	for _, n := range m.Nodes {
		n.Cluster, n.Kubeconfig = c, m.Kubeconfig
		n.apiPort, _ = strconv.Atoi(port)
		n.ContainerdSocket = n.path("containerd/containerd.sock")
		if n.hostRelay, err = kube.StartRelay(m.log, "", net.JoinHostPort(n.HostIP.String(), port), c.APIServerAddr()); err != nil {
			return err
		}
	}
	m.cp = &Node{Cluster: c, Dir: m.Dir, log: m.log}
	return m.cp.startScheduler()
}

// eachNode runs f for every node at once and joins the errors.
func (m *Multi) eachNode(f func(n *Node) error) error {
	errs := make([]error, len(m.Nodes))
	var wg sync.WaitGroup
	for i, n := range m.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(n); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", n.Name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (m *Multi) startProxy(ctx context.Context, n *Node) error {
	var err error
	n.proxyNode, err = m.Cluster.AddNode(ctx, kube.NodeConfig{
		Name: n.Name, NetnsPath: n.NetnsPath, InternalIPs: []netip.Addr{n.NodeIP}, Registered: true,
		ProxyArgs: []string{"--proxy-mode=" + m.proxyMode},
	})
	return err
}

// SetProxyMode restarts kube-proxy on every node in mode, after
// `kube-proxy --cleanup` removed the previous mode's rules, and returns
// once every kube-proxy has synced again. Pods keep running.
func (m *Multi) SetProxyMode(ctx context.Context, mode string) error {
	if err := checkProxyMode(mode); err != nil {
		return err
	}
	if mode == m.proxyMode {
		return nil
	}
	start := time.Now()
	err := m.eachNode(func(n *Node) error {
		if n.proxyNode != nil {
			if err := n.proxyNode.Stop(); err != nil {
				return err
			}
			n.proxyNode = nil
		}
		if _, err := n.InNode(ctx, m.Cluster.Binaries().Path(kubebin.Proxy), "--cleanup", "--proxy-mode="+m.proxyMode); err != nil {
			return fmt.Errorf("cleaning up kube-proxy's %s rules: %w", m.proxyMode, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	m.proxyMode = mode
	if err := m.eachNode(func(n *Node) error { return m.startProxy(ctx, n) }); err != nil {
		return err
	}
	m.log.Info("kube-proxy mode switched", "mode", mode, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// Kubectl runs the module's kubectl as the cluster admin.
func (m *Multi) Kubectl(ctx context.Context, args ...string) ([]byte, error) {
	return m.Nodes[0].Kubectl(ctx, args...)
}

// Node returns the node named name, or nil.
func (m *Multi) Node(name string) *Node {
	for _, n := range m.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Healthy reports an error if a component has exited.
func (m *Multi) Healthy() error {
	for _, n := range m.Nodes {
		for _, p := range []*proc{n.containerd, n.kubelet} {
			if p != nil {
				if err := p.deadErr(); err != nil {
					return fmt.Errorf("node %s: %w", n.Name, err)
				}
			}
		}
	}
	if m.cp != nil && m.cp.scheduler != nil {
		if err := m.cp.scheduler.deadErr(); err != nil {
			return err
		}
	}
	return m.Cluster.Healthy()
}

// Stop removes the pods, stops every node's kubelet and containerd, the
// control plane, and restores the host. Safe to call twice.
func (m *Multi) Stop() error {
	m.stopOnce.Do(func() { m.stopErr = m.stop() })
	return m.stopErr
}

func (m *Multi) stop() error {
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if m.Cluster != nil && len(m.Nodes) > 0 && m.Nodes[0].kubelet != nil && m.Nodes[0].kubelet.deadErr() == nil {
		if err := m.Nodes[0].removeWorkloads(ctx, m.Nodes...); err != nil {
			m.log.Warn("removing workloads before stopping the kubelets", "err", err)
		}
	}
	errs = append(errs, m.eachNode(func(n *Node) error { return errors.Join(n.stopRuntime(ctx)...) }))
	for _, n := range m.Nodes {
		if n.hostRelay != nil {
			errs = append(errs, n.hostRelay.Close())
		}
	}
	if m.cp != nil && m.cp.scheduler != nil {
		errs = append(errs, m.cp.scheduler.stop(10*time.Second))
	}
	if m.Cluster != nil {
		errs = append(errs, m.Cluster.Stop())
	}
	if m.state != nil {
		errs = append(errs, m.state.undo(m.log))
	}
	if m.lock != nil {
		m.lock.Close()
	}
	return errors.Join(errs...)
}

// KeepLogs copies into dst, which outlives the bed, what explains a failure
// on it: each node's component logs (containerd, kubelet, kube-proxy) and
// its pods' container logs (draind's among them), in dst/<node>.
func (m *Multi) KeepLogs(dst string) error {
	var errs []error
	for _, n := range m.Nodes {
		errs = append(errs, n.keepLogs(filepath.Join(dst, n.Name)))
	}
	return errors.Join(errs...)
}

func (n *Node) keepLogs(dst string) error {
	logs, err := filepath.Glob(n.path("*.log"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	var errs []error
	for _, l := range logs {
		errs = append(errs, files.CopyFile(filepath.Join(dst, filepath.Base(l)), l))
	}
	errs = append(errs, files.CopyTree(filepath.Join(dst, "pod-logs"), n.path("pod-logs")))
	return errors.Join(errs...)
}

// On returns the node named name of n's bed: for a node of a multi-node
// bed, its sibling (to read that node's kubelet log, say); otherwise, or
// when no node has that name, n itself.
func (n *Node) On(name string) *Node {
	if n.multi != nil {
		if o := n.multi.Node(name); o != nil {
			return o
		}
	}
	return n
}

// AcceptedFlows returns, by address, the TCP flows conntrack of n's
// namespace holds whose reply comes from one of addrs and that the server
// accepted (past the handshake): each the start of a connection from this
// node that reached the pod at that address. Closed connections stay
// listed for TIME_WAIT (2 min). One conntrack socket serves them all.
func (n *Node) AcceptedFlows(ctx context.Context, addrs ...netip.Addr) (map[netip.Addr][]conntrack.Flow, error) {
	ct, err := conntrack.Open(conntrack.Options{NetNS: n.NetnsPath})
	if err != nil {
		return nil, err
	}
	defer ct.Close()
	out := map[netip.Addr][]conntrack.Flow{}
	for _, addr := range addrs {
		flows, err := ct.EndpointFlows(ctx, addr, conntrack.TCP)
		if err != nil {
			return nil, err
		}
		for _, f := range flows {
			switch f.State {
			case conntrack.TCPEstablished, conntrack.TCPFinWait, conntrack.TCPCloseWait, conntrack.TCPLastAck, conntrack.TCPTimeWait:
				out[addr] = append(out[addr], f)
			}
		}
	}
	return out, nil
}
