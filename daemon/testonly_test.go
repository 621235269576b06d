package daemon

import "net/netip"

// Helpers only tests need, kept out of the production package.

// addrPorts unpacks the set.
func (s backendSet) addrPorts() []netip.AddrPort {
	if s == "" {
		return nil
	}
	return s.appendAddrPorts(make([]netip.AddrPort, 0, len(s)/7))
}

// openConnections is how many connections the offline API holds open.
func (d *Daemon) openConnections() int { return d.api.OpenConnections() }
