package bed

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// ReleaseAddrs makes addrs free for a new pod on n (an IPAM handing a
// departed pod's address out again) and returns once the node routes none
// of them. Deleting a pod's namespace (Pod.Delete) frees its addresses only
// when the kernel has torn the namespace down, in a workqueue, some time
// later; until then the pod's veth, and the node's routes to its addresses
// through it, are still there. A route left to one of addrs through a pod
// veth (vp*) can only be such a leftover: its veth is deleted at once.
func (n *Node) ReleaseAddrs(ctx context.Context, addrs ...netip.Addr) error {
	h, err := n.NS.Handle()
	if err != nil {
		return err
	}
	defer h.Close()
	routed := func() ([]netlink.Route, error) {
		var out []netlink.Route
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := h.RouteList(nil, fam)
			if err != nil {
				return nil, fmt.Errorf("listing routes of node %s: %w", n.Name, err)
			}
			for _, r := range rs {
				if r.Dst == nil {
					continue
				}
				ones, bits := r.Dst.Mask.Size()
				a, ok := netip.AddrFromSlice(r.Dst.IP)
				if !ok || ones != bits {
					continue
				}
				for _, want := range addrs {
					if want.IsValid() && a.Unmap() == want.Unmap() {
						out = append(out, r)
					}
				}
			}
		}
		return out, nil
	}
	for {
		rs, err := routed()
		if err != nil {
			return err
		}
		if len(rs) == 0 {
			return nil
		}
		for _, r := range rs {
			l, err := h.LinkByIndex(r.LinkIndex)
			if err != nil || !strings.HasPrefix(l.Attrs().Name, "vp") {
				continue
			}
			h.LinkDel(l) // gone already if the namespace went meanwhile
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for node %s to stop routing %v (routes %v): %w", n.Name, addrs, rs, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
