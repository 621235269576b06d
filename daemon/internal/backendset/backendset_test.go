package backendset

import (
	"net/netip"
	"slices"
	"testing"
)

// TestRoundTrip: a packed set unpacks to the same endpoints in
// the same order, in every address form, holds as many (Len), and two sets
// are equal exactly when their endpoints are.
func TestRoundTrip(t *testing.T) {
	sets := [][]netip.AddrPort{
		nil,
		{netip.MustParseAddrPort("10.0.0.1:8080")},
		{netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:65535"), netip.MustParseAddrPort("[fd00::1]:443"),
			netip.MustParseAddrPort("[::ffff:10.0.0.3]:80"), netip.MustParseAddrPort("255.255.255.255:256")},
		{netip.MustParseAddrPort("10.0.0.2:65535"), netip.MustParseAddrPort("10.0.0.1:1")}, // order matters
		{netip.MustParseAddrPort("10.0.0.3:80")},
		{netip.MustParseAddrPort("[::ffff:10.0.0.3]:80")}, // not the IPv4 address
	}
	for i, s := range sets {
		p := Pack(s)
		if got := p.AppendAddrPorts(nil); !slices.Equal(got, s) {
			t.Errorf("set %d: %v unpacked to %v", i, s, got)
		}
		if got := p.Len(); got != len(s) {
			t.Errorf("set %d: Len %d, want %d", i, got, len(s))
		}
		for j, o := range sets {
			if same := p == Pack(o); same != slices.Equal(s, o) {
				t.Errorf("sets %d and %d: packed equal %v, equal %v", i, j, same, slices.Equal(s, o))
			}
		}
	}
	if got := len(Pack(sets[1])); got != 7 {
		t.Errorf("an IPv4 endpoint packs into %d bytes, want 7", got)
	}
}
