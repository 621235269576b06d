package realnode

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/test/cluster/kube"
)

func randomSuffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func netnsPath(name string) string { return filepath.Join("/run/netns", name) }

// run runs a command (in the node's namespace when ns is set, started from
// the bed's spawner thread: no `ip netns exec`, which remounts /sys) and
// returns its output; the error quotes standard error.
func run(ctx context.Context, ns string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	nsPath := ""
	if ns != "" {
		nsPath = netnsPath(ns)
	}
	if err := kube.StartCmd(nsPath, cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := cmd.Wait(); err != nil {
		return out.Bytes(), fmt.Errorf("running %s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.Bytes(), nil
}

// netnsConfig is the node's network plan: a namespace joined to the host by
// a veth pair with a /30 between them.
type netnsConfig struct {
	name, hostVeth string
	hostIP, nodeIP netip.Addr
	// alsoAllowed are host addresses besides hostIP the node may reach
	// over eth0 (the apiserver's advertised address on another node's
	// link, which the "kubernetes" Service points at).
	alsoAllowed []netip.Addr
}

// pickLink chooses a /30 in 10.250.0.0/16 that no host interface uses.
func pickLink() (hostIP, nodeIP netip.Addr, err error) {
	used := map[byte]bool{}
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip4 := ipn.IP.To4(); ip4 != nil && ip4[0] == 10 && ip4[1] == 250 {
					used[ip4[2]] = true
				}
			}
		}
	}
	b := make([]byte, 1)
	for range 256 {
		rand.Read(b)
		if b[0] != 0 && !used[b[0]] {
			return netip.AddrFrom4([4]byte{10, 250, b[0], 1}), netip.AddrFrom4([4]byte{10, 250, b[0], 2}), nil
		}
	}
	return netip.Addr{}, netip.Addr{}, errors.New("choosing the node's link addresses: 10.250.0.0/16 is full on this host")
}

// createNetns builds the node's namespace: loopback up, eth0 (a veth whose
// peer is hostVeth on the host) with nodeIP, a default route to the host,
// forwarding on, conntrack timestamps on (the README asks operators to set
// them), and a guard: nothing but traffic to the host's end of the link may
// leave through eth0 (the host does not forward, and no bed traffic may
// leave the machine), and what does leave is masqueraded to nodeIP.
func createNetns(ctx context.Context, nc netnsConfig) error {
	steps := [][]string{
		{"ip", "netns", "add", nc.name},
		{"ip", "link", "add", nc.hostVeth, "type", "veth", "peer", "name", "eth0", "netns", nc.name},
		{"ip", "addr", "add", nc.hostIP.String() + "/30", "dev", nc.hostVeth},
		{"ip", "link", "set", nc.hostVeth, "up"},
		{"ip", "-n", nc.name, "link", "set", "lo", "up"},
		{"ip", "-n", nc.name, "addr", "add", nc.nodeIP.String() + "/30", "dev", "eth0"},
		{"ip", "-n", nc.name, "link", "set", "eth0", "up"},
		{"ip", "-n", nc.name, "route", "add", "default", "via", nc.hostIP.String()},
	}
	for _, s := range steps {
		if _, err := run(ctx, "", s[0], s[1:]...); err != nil {
			return fmt.Errorf("creating the node's network namespace: %w", err)
		}
	}
	var guard [][]string
	for _, a := range nc.alsoAllowed {
		guard = append(guard,
			[]string{"-A", "OUTPUT", "-o", "eth0", "-d", a.String(), "-j", "ACCEPT"},
			[]string{"-A", "FORWARD", "-o", "eth0", "-d", a.String(), "-j", "ACCEPT"},
			[]string{"-t", "mangle", "-A", "POSTROUTING", "-o", "eth0", "-d", a.String(), "-j", "ACCEPT"})
	}
	for _, rule := range append(guard, [][]string{
		// The node's own connection to a ClusterIP is routed (over eth0,
		// the default route) before kube-proxy's DNAT reroutes it, and
		// OUTPUT's -o keeps naming that first route's link: such a
		// connection is let through here and guarded in POSTROUTING,
		// which sees the link it really leaves by.
		{"-A", "OUTPUT", "-o", "eth0", "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"},
		{"-t", "mangle", "-A", "POSTROUTING", "-o", "eth0", "!", "-d", nc.hostIP.String(), "-m", "conntrack", "--ctstate", "DNAT", "-j", "DROP"},
		{"-A", "OUTPUT", "-o", "eth0", "!", "-d", nc.hostIP.String(), "-j", "REJECT"},
		{"-A", "FORWARD", "-o", "eth0", "!", "-d", nc.hostIP.String(), "-j", "REJECT"},
		// Pods reach the apiserver (the kubernetes Service) as the node:
		// the host has no route back to the pod network.
		{"-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"},
	}...) {
		if _, err := run(ctx, nc.name, "iptables", append([]string{"-w"}, rule...)...); err != nil {
			return fmt.Errorf("guarding the node's link: %w", err)
		}
	}
	return netnsDo(netnsPath(nc.name), func() error {
		for k, v := range map[string]string{
			"net/ipv4/ip_forward":                  "1",
			"net/ipv4/conf/all/rp_filter":          "0",
			"net/ipv4/conf/default/rp_filter":      "0",
			"net/netfilter/nf_conntrack_timestamp": "1",
		} {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
				return fmt.Errorf("setting %s in the node's namespace: %w", k, err)
			}
		}
		return nil
	})
}

// deleteNetns removes a node namespace (its veth goes with it).
func deleteNetns(name string) error {
	p := netnsPath(name)
	if _, err := os.Stat(p); err != nil {
		return nil
	}
	if _, err := run(context.Background(), "", "ip", "netns", "delete", name); err != nil {
		return err
	}
	return nil
}

// netnsDo runs fn on a thread inside the namespace at path. /proc/sys/net
// and new sockets follow the thread's namespace.
func netnsDo(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer self.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("entering %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(ferr, err) // the thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// DialContext opens a connection from inside the node's namespace: the
// only place bed addresses (pods, Services) may be reached from.
func (n *Node) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := netnsDo(n.NetnsPath, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// InNode runs a command in the node's network namespace (conntrack,
// iptables-save: what an operator on the node would run) and returns its
// standard output.
func (n *Node) InNode(ctx context.Context, name string, args ...string) ([]byte, error) {
	return run(ctx, filepath.Base(n.NetnsPath), name, args...)
}
