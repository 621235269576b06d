package conntrack

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// createFlows inserts n flows (gen(i) for i in [0,n)) into the conntrack
// table of the namespace at nsPath, batch messages per sendmsg, and fails
// on the first refused insert.
func createFlows(nsPath string, n, batch int, timeout uint32, gen func(i int) Flow) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return err
	}
	defer ns.Close()
	var s *nlSock
	if err := inNetNS(ns, func() (err error) { s, err = openSock(); return err }); err != nil {
		return err
	}
	defer s.close()
	var e encoder
	for i := 0; i < n; {
		e.b = e.b[:0]
		first := s.seq + 1
		var last int
		j := 0
		for ; j < batch && i < n; j, i = j+1, i+1 {
			last = encodeNew(&e, s.nextSeq(), gen(i), timeout)
		}
		setAck(e.b, last)
		lastSeq := s.seq
		if err := s.send(e.b); err != nil {
			return fmt.Errorf("sending %d creates: %w", j, err)
		}
		for done := false; !done; {
			buf, err := s.recv(context.Background())
			if err != nil {
				return fmt.Errorf("reading create replies: %w", err)
			}
			it := msgIter{b: buf}
			for it.next() {
				if it.m.typ != unix.NLMSG_ERROR || it.m.seq < first || it.m.seq > lastSeq {
					continue
				}
				errno, err := errnoOf(it.m.payload)
				if err != nil {
					return err
				}
				if errno != 0 {
					return fmt.Errorf("creating flow %d: %w", i-j+int(it.m.seq-first), errno)
				}
				if it.m.seq == lastSeq {
					done = true
				}
			}
			if it.err != nil {
				return it.err
			}
		}
	}
	return nil
}
