package conntrack

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/mdlayher/netlink"
	ctlib "github.com/ti-mo/conntrack"
	"golang.org/x/sync/errgroup"
)

// Tests fill and inspect tables through ti-mo/conntrack, an implementation
// independent of this package's encoder and parser: a flow this package
// deletes or counts was put there, and is checked afterwards, by other code.

// tiDial opens a ti-mo/conntrack connection in the namespace at nsPath.
func tiDial(nsPath string) (*ctlib.Conn, func(), error) {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil, nil, err
	}
	c, err := ctlib.Dial(&netlink.Config{NetNS: int(ns.Fd())})
	if err != nil {
		ns.Close()
		return nil, nil, fmt.Errorf("dialing conntrack in %s: %w", nsPath, err)
	}
	return c, func() { c.Close(); ns.Close() }, nil
}

// tiFlow is fl as ti-mo/conntrack creates it: both tuples given, so a flow
// can look DNATed (orig dst = VIP, reply src = pod).
func tiFlow(fl Flow, timeout uint32) ctlib.Flow {
	tuple := func(t Tuple) ctlib.Tuple {
		return ctlib.Tuple{
			IP:    ctlib.IPTuple{SourceAddress: t.Src.Addr(), DestinationAddress: t.Dst.Addr()},
			Proto: ctlib.ProtoTuple{Protocol: uint8(fl.Proto), SourcePort: t.Src.Port(), DestinationPort: t.Dst.Port()},
		}
	}
	f := ctlib.Flow{Timeout: timeout, Zone: fl.Zone, TupleOrig: tuple(fl.Orig), TupleReply: tuple(fl.Reply)}
	if fl.Proto == TCP {
		f.ProtoInfo.TCP = &ctlib.ProtoInfoTCP{State: uint8(fl.State)}
	}
	return f
}

// fromTi is a flow ti-mo/conntrack dumped, reduced to this package's Flow.
func fromTi(f ctlib.Flow) Flow {
	ap := func(a netip.Addr, p uint16) netip.AddrPort { return netip.AddrPortFrom(a, p) }
	fl := Flow{
		Proto: Proto(f.TupleOrig.Proto.Protocol),
		Orig:  Tuple{Src: ap(f.TupleOrig.IP.SourceAddress, f.TupleOrig.Proto.SourcePort), Dst: ap(f.TupleOrig.IP.DestinationAddress, f.TupleOrig.Proto.DestinationPort)},
		Reply: Tuple{Src: ap(f.TupleReply.IP.SourceAddress, f.TupleReply.Proto.SourcePort), Dst: ap(f.TupleReply.IP.DestinationAddress, f.TupleReply.Proto.DestinationPort)},
		Zone:  f.Zone,
		Start: f.Timestamp.Start,
	}
	if f.ProtoInfo.TCP != nil {
		fl.State = TCPState(f.ProtoInfo.TCP.State)
	}
	return fl
}

// createFlows inserts n flows (gen(i) for i in [0,n)) into the conntrack
// table of the namespace at nsPath, one ti-mo/conntrack connection per CPU,
// and fails on the first refused insert.
func createFlows(nsPath string, n int, timeout uint32, gen func(i int) Flow) error {
	workers := max(1, min(runtime.GOMAXPROCS(0), n/1000))
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			c, done, err := tiDial(nsPath)
			if err != nil {
				return err
			}
			defer done()
			for i := w; i < n; i += workers {
				if err := c.Create(tiFlow(gen(i), timeout)); err != nil {
					return fmt.Errorf("creating flow %d: %w", i, err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// tableFlows dumps the whole table of the namespace at nsPath through
// ti-mo/conntrack.
func tableFlows(tb testing.TB, nsPath string) []Flow {
	tb.Helper()
	c, done, err := tiDial(nsPath)
	if err != nil {
		tb.Fatal(err)
	}
	defer done()
	dumped, err := c.Dump(nil)
	if err != nil {
		tb.Fatalf("dumping the table with ti-mo/conntrack: %v", err)
	}
	out := make([]Flow, len(dumped))
	for i, f := range dumped {
		out[i] = fromTi(f)
	}
	return out
}
