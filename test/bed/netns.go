package bed

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetNS is a named network namespace (visible under /run/netns, so tools
// like `ip netns exec`, iptables and conntrack can enter it).
type NetNS struct {
	Name string
}

// Path is the bind-mount path of the namespace.
func (n *NetNS) Path() string { return filepath.Join(netnsDir, n.Name) }

// RandSuffix returns n random hex characters (unique names per run).
func RandSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)[:n]
}

// netnsDir is where named network namespaces are mounted.
const netnsDir = "/run/netns"

// sharedNetnsDir makes netnsDir a shared mount point of its own before this
// process names its first namespace there, as iproute2 and containerd do
// before theirs. Otherwise the first `ip netns add` of another process
// (the real-node bed's, running alongside) makes it one then, bind-mounting
// the directory onto itself with the namespaces named so far: copies that
// hide the originals, so deleting those namespaces fails (EBUSY).
var sharedNetnsDir = sync.OnceValue(func() error {
	if err := os.MkdirAll(netnsDir, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL { // not a mount point yet
		if err = unix.Mount(netnsDir, netnsDir, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", netnsDir, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("making %s a shared mount point: %w", netnsDir, err)
	}
	return nil
})

// NewNetNS creates a named namespace with loopback up, IPv6 duplicate address
// detection off (addresses usable at once) and forwarding on.
func NewNetNS(name string) (*NetNS, error) {
	if err := sharedNetnsDir(); err != nil {
		return nil, err
	}
	n := &NetNS{Name: name}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("getting current netns: %w", err)
	}
	defer orig.Close()
	h, err := netns.NewNamed(name)
	if err != nil {
		netns.Set(orig)
		return nil, fmt.Errorf("creating netns %s: %w", name, err)
	}
	h.Close()
	if err := netns.Set(orig); err != nil {
		// This thread is unusable; lock it forever so the runtime drops it.
		runtime.LockOSThread()
		return nil, fmt.Errorf("returning from netns %s: %w", name, err)
	}
	err = n.Do(func() error {
		for _, kv := range [][2]string{
			{"net/ipv6/conf/all/accept_dad", "0"},
			{"net/ipv6/conf/default/accept_dad", "0"},
			{"net/ipv4/ip_forward", "1"},
			{"net/ipv6/conf/all/forwarding", "1"},
		} {
			if err := writeSysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("setting up netns %s: %w", name, err)
	}
	return n, nil
}

func writeSysctl(key, val string) error {
	return os.WriteFile(filepath.Join("/proc/sys", key), []byte(val), 0o644)
}

// Do runs fn on an OS thread that is inside the namespace. Sockets fn creates
// stay in the namespace after it returns.
func (n *NetNS) Do(fn func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("getting current netns: %w", err)
	}
	defer orig.Close()
	target, err := netns.GetFromName(n.Name)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("opening netns %s: %w", n.Name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("entering netns %s: %w", n.Name, err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		// Leave the thread locked: the runtime terminates it with the
		// goroutine instead of reusing a thread in the wrong namespace.
		return errors.Join(ferr, fmt.Errorf("leaving netns %s: %w", n.Name, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

// Sysctl sets a sysctl (path below /proc/sys, e.g. "net/ipv4/ip_forward")
// inside the namespace.
func (n *NetNS) Sysctl(key, val string) error {
	return n.Do(func() error { return writeSysctl(key, val) })
}

// Handle returns a netlink handle bound to the namespace.
func (n *NetNS) Handle() (*netlink.Handle, error) {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return nil, fmt.Errorf("opening netns %s: %w", n.Name, err)
	}
	defer h.Close()
	return netlink.NewHandleAt(h)
}

// Command returns a command that runs inside the namespace.
func (n *NetNS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Run runs a command inside the namespace and returns its output.
func (n *NetNS) Run(name string, args ...string) (string, error) {
	out, err := n.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s in netns %s: %w: %s", name, strings.Join(args, " "), n.Name, err, out)
	}
	return string(out), nil
}

// Close deletes the namespace (its veths go with it).
func (n *NetNS) Close() error {
	if err := netns.DeleteNamed(n.Name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deleting netns %s: %w", n.Name, err)
	}
	return nil
}

func (n *NetNS) nsHandle() (netns.NsHandle, error) {
	h, err := netns.GetFromName(n.Name)
	if err != nil {
		return 0, fmt.Errorf("opening netns %s: %w", n.Name, err)
	}
	return h, nil
}
