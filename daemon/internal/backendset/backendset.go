// Package backendset packs a service-port's selectable endpoints into a
// string: the model keeps one per active service-port, the reconciler the
// one it wrote, and comparing two sets is comparing two strings.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package backendset

import (
	"net/netip"
	"strings"
)

// Set is a service-port's selectable endpoints, sorted, packed into a
// string: 7 bytes per IPv4 endpoint (a family byte, the address, the
// port), 19 per IPv6 one, against 32 for a netip.AddrPort. The model and
// the reconciler keep one per active service-port (thousands while a large
// cluster rolls out); the datapath is handed the addresses (AppendAddrPorts).
type Set string

// A record is the family byte, the address (addrLen of the family) and the
// port, big-endian.
const (
	family4 = 4
	family6 = 6
	portLen = 2
)

// addrLen is the length of the address a record of the family holds.
func addrLen(family byte) int {
	if family == family4 {
		return 4
	}
	return 16
}

// Pack packs aps, in their order.
func Pack(aps []netip.AddrPort) Set {
	var b strings.Builder
	b.Grow((1 + addrLen(family4) + portLen) * len(aps))
	for _, ap := range aps {
		a := ap.Addr()
		if a.Is4() {
			b.WriteByte(family4)
			v := a.As4()
			b.Write(v[:])
		} else {
			// Endpoints have no zone (k8s.Slice keeps none).
			b.WriteByte(family6)
			v := a.As16()
			b.Write(v[:])
		}
		b.WriteByte(byte(ap.Port() >> 8))
		b.WriteByte(byte(ap.Port()))
	}
	return Set(b.String())
}

// AppendAddrPorts appends the set, unpacked, to out.
func (s Set) AppendAddrPorts(out []netip.AddrPort) []netip.AddrPort {
	for i := 0; i < len(s); {
		n := addrLen(s[i])
		i++
		var a netip.Addr
		if n == 4 {
			a = netip.AddrFrom4([4]byte([]byte(s[i : i+n])))
		} else {
			a = netip.AddrFrom16([16]byte([]byte(s[i : i+n])))
		}
		i += n
		out = append(out, netip.AddrPortFrom(a, uint16(s[i])<<8|uint16(s[i+1])))
		i += portLen
	}
	return out
}

// Len is how many endpoints the set holds.
func (s Set) Len() int {
	n := 0
	for i := 0; i < len(s); n++ {
		i += 1 + addrLen(s[i]) + portLen
	}
	return n
}
