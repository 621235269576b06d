package model

import (
	"net/netip"

	"github.com/draind/draind/bpf"
)

// testNode is the node the model runs on in these tests.
const testNode = "node-a"

// key is the endpoint key of ap ("ip:port").
func key(ap string, proto bpf.Protocol) bpf.EndpointKey {
	a := netip.MustParseAddrPort(ap)
	return bpf.EndpointKey{Addr: a.Addr(), Port: a.Port(), Proto: proto}
}

// aps parses "ip:port" addresses.
func aps(s ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(s))
	for i, x := range s {
		out[i] = netip.MustParseAddrPort(x)
	}
	return out
}
