package bed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"sync"
	"syscall"

	"github.com/vishvananda/netlink"
)

// Pod is a "pod": a network namespace behind a routed veth on its node, and
// a cgroup under the node's pods cgroup for its processes.
type Pod struct {
	Node     *Node
	Name     string
	NS       *NetNS
	IP4, IP6 netip.Addr
	HostVeth string
	Cgroup   *Cgroup

	deleteOnce sync.Once
	deleteErr  error
}

// AddPod creates a pod with the node's next free addresses.
func (n *Node) AddPod(name string) (*Pod, error) {
	n.mu.Lock()
	n.nips++
	i := n.nips
	n.mu.Unlock()
	if i+9 > 254 {
		return nil, fmt.Errorf("node %s has no free pod address left (%d pods)", n.Name, i-1)
	}
	ip4 := netip.AddrFrom4([4]byte{10, 244, byte(n.Index), byte(i + 9)})
	ip6 := netip.MustParseAddr(fmt.Sprintf("fd00:244:%x::%x", n.Index, i+9))
	return n.AddPodIPs(name, ip4, ip6)
}

// AddPodIPs creates a pod with the given addresses (reuse of a departed
// pod's IP, say). Either address may be invalid (single-stack pod).
func (n *Node) AddPodIPs(name string, ip4, ip6 netip.Addr) (*Pod, error) {
	n.mu.Lock()
	n.npods++
	i := n.npods
	n.mu.Unlock()
	p := &Pod{Node: n, Name: name, IP4: ip4, IP6: ip6, HostVeth: fmt.Sprintf("vp%d-%d", n.Index, i)}
	ns, err := NewNetNS(fmt.Sprintf("db%s-%s-%s", n.Bed.ID, n.Name, name))
	if err != nil {
		return nil, err
	}
	p.NS = ns
	n.Bed.OnClose(func() error { return p.Delete() })
	cg, err := n.Pods.Child(fmt.Sprintf("pod-%s-%d", name, i))
	if err != nil {
		return nil, err
	}
	p.Cgroup = cg
	if err := vethPair(n.NS, p.HostVeth, ns, "eth0"); err != nil {
		return nil, err
	}
	// Pod side: its /32 and /128, default routes to the node.
	hp, err := ns.Handle()
	if err != nil {
		return nil, err
	}
	defer hp.Close()
	eth0, err := hp.LinkByName("eth0")
	if err != nil {
		return nil, err
	}
	for _, a := range []netip.Addr{ip4, ip6} {
		if a.IsValid() {
			if err := hp.AddrAdd(eth0, addrOf(a)); err != nil {
				return nil, fmt.Errorf("adding %s to pod %s: %w", a, name, err)
			}
		}
	}
	routes := []*netlink.Route{
		{LinkIndex: eth0.Attrs().Index, Gw: gatewayV4.AsSlice(), Flags: int(netlink.FLAG_ONLINK)},
		{LinkIndex: eth0.Attrs().Index, Gw: gatewayV6.AsSlice()},
	}
	for _, r := range routes {
		if err := hp.RouteAdd(r); err != nil {
			return nil, fmt.Errorf("adding default route in pod %s: %w", name, err)
		}
	}
	// Node side: the gateway addresses on the veth, a route per pod address.
	hn, err := n.NS.Handle()
	if err != nil {
		return nil, err
	}
	defer hn.Close()
	hv, err := hn.LinkByName(p.HostVeth)
	if err != nil {
		return nil, err
	}
	if err := hn.AddrAdd(hv, addrOf(gatewayV4)); err != nil {
		return nil, fmt.Errorf("adding gateway address on %s: %w", p.HostVeth, err)
	}
	if err := hn.AddrAdd(hv, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(gatewayV6, 64)), Flags: addrOf(gatewayV6).Flags}); err != nil {
		return nil, fmt.Errorf("adding gateway address on %s: %w", p.HostVeth, err)
	}
	for _, a := range []netip.Addr{ip4, ip6} {
		if !a.IsValid() {
			continue
		}
		r := &netlink.Route{LinkIndex: hv.Attrs().Index, Dst: prefixNet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK}
		if err := hn.RouteAdd(r); err != nil {
			return nil, fmt.Errorf("routing %s to pod %s: %w", a, name, err)
		}
	}
	return p, nil
}

// Start runs a helper process inside the pod (its netns and cgroup).
func (p *Pod) Start(args ...string) (*Proc, error) {
	return StartProc(p.NS, p.Cgroup, args...)
}

// Exec runs a program inside the pod, as a container's process would run:
// in the pod's network namespace and cgroup (so draind's hooks apply), with
// env as its whole environment. It returns the combined output.
func (p *Pod) Exec(ctx context.Context, env []string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.Cgroup != nil {
		f, err := p.Cgroup.Open()
		if err != nil {
			return nil, fmt.Errorf("opening cgroup %s: %w", p.Cgroup.Path, err)
		}
		defer f.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(f.Fd())
	}
	// The child starts in the namespace of the thread that forks it.
	if err := p.NS.Do(cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s in pod %s: %w", name, p.Name, err)
	}
	err := cmd.Wait()
	return out.Bytes(), err
}

// Delete removes the pod: its processes are killed, its namespace (and so
// its veth and the node's routes to it) and its cgroup are removed.
// It is safe to call more than once, concurrently.
func (p *Pod) Delete() error {
	p.deleteOnce.Do(func() { p.deleteErr = p.delete() })
	return p.deleteErr
}

func (p *Pod) delete() error {
	var errs []error
	if p.Cgroup != nil {
		errs = append(errs, p.Cgroup.Remove())
	}
	if p.NS != nil {
		errs = append(errs, p.NS.Close())
	}
	return errors.Join(errs...)
}

// Addr returns the pod's address of the family of like.
func (p *Pod) Addr(v6 bool) netip.Addr {
	if v6 {
		return p.IP6
	}
	return p.IP4
}
