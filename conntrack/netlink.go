package conntrack

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Options configures Open.
type Options struct {
	// NetNS is the network namespace whose conntrack table is managed, as a
	// path (/run/netns/NAME, /proc/PID/ns/net). Empty means the namespace of
	// the calling thread at Open.
	NetNS string
	// BatchSize is the number of delete messages sent per sendmsg; 0 means
	// DefaultBatchSize.
	BatchSize int
}

// DefaultBatchSize keeps one batch's worst-case error replies (one per
// message when every flow vanished on its own) well inside the socket's
// receive buffer, while making the per-syscall cost negligible.
const DefaultBatchSize = 256

// Netlink expires and counts flows through ctnetlink.
//
// It holds two sockets in the target namespace: one for filtered dumps and
// one for batched deletes, so deletions are sent while the dump is still
// streaming and at most one batch of flows is ever held in memory. Methods
// are serialised; a socket that saw an error or a cancellation is replaced
// on the next call, so an interrupted dump never poisons the next one.
type Netlink struct {
	mu         sync.Mutex
	ns         *os.File
	dump, del  *nlSock
	batch      int
	timestamps bool
	closed     bool
	// v6Filter caches the IPv6 address-filter probe: 0 not run yet,
	// 1 the kernel filters IPv6 addresses correctly, 2 it does not.
	v6Filter int
}

var _ Interface = (*Netlink)(nil)

const timestampSysctl = "/proc/sys/net/netfilter/nf_conntrack_timestamp"

// Open opens the ctnetlink sockets inside opts.NetNS and turns conntrack
// timestamps on there (best effort; see Timestamps).
func Open(opts Options) (*Netlink, error) {
	// Without NetNS the sockets are made right here: entering a namespace
	// (setns) needs CAP_SYS_ADMIN, which the DaemonSet does not grant.
	path := opts.NetNS
	var ns *os.File
	if path != "" {
		var err error
		if ns, err = os.Open(path); err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", path, err)
		}
	} else {
		path = "the current network namespace"
	}
	n := &Netlink{ns: ns, batch: opts.BatchSize}
	if n.batch <= 0 {
		n.batch = DefaultBatchSize
	}
	err := inNetNS(ns, func() error {
		var err error
		if n.dump, err = openSock(); err != nil {
			return err
		}
		if n.del, err = openSock(); err != nil {
			return err
		}
		n.timestamps = enableTimestamps()
		return nil
	})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("opening conntrack in %s: %w", path, err)
	}
	return n, nil
}

// enableTimestamps sets nf_conntrack_timestamp=1 in the calling thread's
// namespace (/proc/sys/net resolves per thread) and reports whether it is
// on. Only flows created afterwards carry a start time.
func enableTimestamps() bool {
	if b, err := os.ReadFile(timestampSysctl); err == nil && strings.TrimSpace(string(b)) == "1" {
		return true
	}
	if err := os.WriteFile(timestampSysctl, []byte("1"), 0); err != nil {
		return false
	}
	b, err := os.ReadFile(timestampSysctl)
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

// Timestamps reports whether conntrack timestamps were on after Open. When
// they are off, Filter.CreatedBefore cannot protect a new pod on a reused
// IP (every flow looks old), and the caller should not rely on it.
func (n *Netlink) Timestamps() bool { return n.timestamps }

// Close releases the sockets and the namespace handle.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	var errs []error
	for _, s := range []*nlSock{n.dump, n.del} {
		if s != nil {
			errs = append(errs, s.close())
		}
	}
	n.dump, n.del = nil, nil
	if n.ns != nil {
		errs = append(errs, n.ns.Close())
		n.ns = nil
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing conntrack sockets: %w", err)
	}
	return nil
}

// sockets returns the dump and delete sockets, reopening any that an
// earlier error discarded.
func (n *Netlink) sockets() (dump, del *nlSock, err error) {
	if n.closed {
		return nil, nil, errors.New("conntrack handle is closed")
	}
	if n.dump == nil || n.del == nil {
		err = inNetNS(n.ns, func() error {
			var err error
			if n.dump == nil {
				if n.dump, err = openSock(); err != nil {
					return err
				}
			}
			if n.del == nil {
				n.del, err = openSock()
			}
			return err
		})
		if err != nil {
			return nil, nil, fmt.Errorf("reopening conntrack sockets: %w", err)
		}
	}
	return n.dump, n.del, nil
}

// discard drops a socket after an error; the next call opens a fresh one.
func (n *Netlink) discard(s *nlSock) {
	if s == nil {
		return
	}
	s.close()
	if n.dump == s {
		n.dump = nil
	}
	if n.del == s {
		n.del = nil
	}
}

// filterGroup is the set of filters that share a reply-source address: one
// kernel-filtered dump serves all of them, so a pod with several ports and
// protocols costs one walk of the table, not one per port.
type filterGroup struct {
	kf      kernelFilter
	filters []Filter
	index   []int // position of each filter in the caller's slice
}

// groupFilters groups filters by reply-source address, in first-seen order,
// and gives each group the kernel filter made of the fields all its filters
// agree on. Userspace re-checks every flow against the exact filters.
func groupFilters(filters []Filter) []filterGroup {
	var groups []filterGroup
	pos := map[netip.Addr]int{}
	for i, f := range filters {
		a := f.ReplySrc.Addr()
		g, ok := pos[a]
		if !ok {
			g = len(groups)
			pos[a] = g
			groups = append(groups, filterGroup{kf: kernelFilter{
				replySrc:     a,
				replySrcPort: f.ReplySrc.Port(),
				proto:        f.Proto,
				origDst:      f.OrigDst.Addr(),
				origDstPort:  f.OrigDst.Port(),
			}})
		}
		grp := &groups[g]
		grp.filters = append(grp.filters, f)
		grp.index = append(grp.index, i)
		kf := &grp.kf
		if kf.proto != f.Proto {
			kf.proto, kf.replySrcPort, kf.origDstPort = 0, 0, 0
		}
		if kf.replySrcPort != f.ReplySrc.Port() {
			kf.replySrcPort = 0
		}
		if kf.origDst != f.OrigDst.Addr() {
			kf.origDst, kf.origDstPort = netip.Addr{}, 0
		}
		if kf.origDstPort != f.OrigDst.Port() {
			kf.origDstPort = 0
		}
	}
	return groups
}

// Expire deletes every flow that a filter selects and that is old enough
// for it. For each group of filters sharing an endpoint address it runs one
// kernel-filtered dump and, while the dump streams, deletes the selected
// flows in batches of Options.BatchSize messages per sendmsg. A flow that is
// already gone when its delete arrives (ENOENT) is not an error. On error
// the result still counts what was deleted before it.
func (n *Netlink) Expire(ctx context.Context, filters []Filter) (ExpireResult, error) {
	res := ExpireResult{PerFilter: make([]int, len(filters))}
	fs, err := validateFilters(filters)
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	if len(fs) == 0 {
		return res, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dump, del, err := n.sockets()
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	b := &deleteBatch{ctx: ctx, sock: del, max: n.batch, res: &res}
	for _, g := range groupFilters(fs) {
		kf := g.kf
		if kf.replySrc.Is6() {
			// The probe uses the delete socket (and may replace it): send
			// what is pending first, so a batch never spans two sockets.
			if err := b.flush(); err != nil {
				if b.sendErr != nil {
					n.discard(del)
				}
				return res, fmt.Errorf("expiring flows: %w", err)
			}
			kf.noAddr = !n.ipv6AddrFilter(ctx)
			if dump, del, err = n.sockets(); err != nil {
				return res, fmt.Errorf("expiring flows: %w", err)
			}
			b.sock = del
		}
		err := n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
			switch v, i := classify(g.filters, ent.Flow); v {
			case expire:
				b.add(ent, g.index[i])
				if b.full() {
					return b.flush()
				}
			case keep:
				res.Kept++
			}
			return nil
		})
		if err != nil {
			if b.sendErr != nil {
				n.discard(del)
			}
			return res, fmt.Errorf("expiring flows of %s: %w", g.kf.replySrc, err)
		}
	}
	if err := b.flush(); err != nil {
		if b.sendErr != nil {
			n.discard(del)
		}
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	if b.failures > 0 {
		return res, fmt.Errorf("expiring flows: %d deletes failed, the first with: %w", b.failures, b.firstFailure)
	}
	return res, nil
}

// Count returns the flows whose reply-direction source is addr, by protocol
// and TCP state, from one kernel-filtered dump. For an IPv6 address on a
// kernel whose IPv6 filter is broken (see kernelFilter.noAddr) the dump
// holds every IPv6 flow, filtered here: correct, but it costs a walk of the
// IPv6 part of the table through userspace.
func (n *Netlink) Count(ctx context.Context, addr netip.Addr) (Counts, error) {
	var c Counts
	if !addr.IsValid() {
		return c, errors.New("counting flows: address is not set")
	}
	addr = addr.Unmap()
	n.mu.Lock()
	defer n.mu.Unlock()
	dump, _, err := n.sockets()
	if err != nil {
		return c, fmt.Errorf("counting flows of %s: %w", addr, err)
	}
	kf := kernelFilter{replySrc: addr}
	if addr.Is6() {
		kf.noAddr = !n.ipv6AddrFilter(ctx)
		if dump, _, err = n.sockets(); err != nil {
			return c, fmt.Errorf("counting flows of %s: %w", addr, err)
		}
	}
	err = n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
		if countedFor(addr, ent.Flow) {
			c.add(ent.Flow)
		}
		return nil
	})
	if err != nil {
		return Counts{}, fmt.Errorf("counting flows of %s: %w", addr, err)
	}
	return c, nil
}

// ipv6Probe is the throwaway flow the IPv6 filter probe inserts: UDP in
// the discard-only prefix 100::/64 (RFC 6666), so it can never shadow or
// match real traffic, with a short timeout in case the delete is lost.
var ipv6Probe = Flow{
	Proto: UDP,
	Orig:  Tuple{Src: netip.MustParseAddrPort("[100::d1a1]:9"), Dst: netip.MustParseAddrPort("[100::d1a2]:9")},
	Reply: Tuple{Src: netip.MustParseAddrPort("[100::d1a2]:9"), Dst: netip.MustParseAddrPort("[100::d1a1]:9")},
}

// ipv6AddrFilter reports whether the kernel's CTA_FILTER compares IPv6
// addresses correctly. It inserts ipv6Probe, dumps with a filter on its
// reply source, and deletes it; the answer is cached once the probe ran.
// When the probe cannot run, it answers false: the dump is then wider but
// still exact, because userspace re-checks every flow.
func (n *Netlink) ipv6AddrFilter(ctx context.Context) bool {
	if n.v6Filter != 0 {
		return n.v6Filter == 1
	}
	dump, del, err := n.sockets()
	if err != nil {
		return false
	}
	var e encoder
	seq := del.nextSeq()
	off := encodeNew(&e, seq, ipv6Probe, 10)
	setAck(e.b, off)
	if errno, err := del.request(ctx, e.b, seq); err != nil {
		n.discard(del)
		return false
	} else if errno != 0 && errno != unix.EEXIST {
		return false
	}
	found := false
	err = n.dumpFlows(ctx, dump, kernelFilter{replySrc: ipv6Probe.Reply.Src.Addr(), proto: UDP}, func(ent *ctEntry) error {
		if ent.Orig == ipv6Probe.Orig {
			found = true
		}
		return nil
	})
	e.b = e.b[:0]
	seq = del.nextSeq()
	encodeDelete(&e, seq, &ctEntry{Flow: ipv6Probe}, true)
	if _, derr := del.request(ctx, e.b, seq); derr != nil {
		n.discard(del)
	}
	if err != nil {
		return false
	}
	if found {
		n.v6Filter = 1
	} else {
		n.v6Filter = 2
	}
	return found
}

// dumpFlows runs one filtered dump and calls fn for every flow, in the
// order the kernel returns them. fn's entry is reused; fn must not keep it.
// Any error, including cancellation, discards the dump socket, because the
// kernel would otherwise keep the half-done dump attached to it.
func (n *Netlink) dumpFlows(ctx context.Context, s *nlSock, kf kernelFilter, fn func(*ctEntry) error) (err error) {
	defer func() {
		if err != nil {
			n.discard(s)
		}
	}()
	seq := s.nextSeq()
	e := encoder{b: s.wb[:0]}
	encodeDump(&e, seq, kf)
	s.wb = e.b
	if err := s.send(e.b); err != nil {
		return fmt.Errorf("requesting dump: %w", err)
	}
	var ent ctEntry
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		buf, err := s.recv(ctx)
		if err != nil {
			return fmt.Errorf("reading dump: %w", err)
		}
		it := msgIter{b: buf}
		for it.next() {
			m := it.m
			if m.seq != seq {
				continue // a stale reply of an earlier request
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				errno, err := errnoOf(m.payload)
				if err != nil {
					return fmt.Errorf("reading end of dump: %w", err)
				}
				if errno != 0 {
					return fmt.Errorf("reading dump: kernel ended it with: %w", errno)
				}
				return nil
			case unix.NLMSG_ERROR:
				errno, err := errnoOf(m.payload)
				if err != nil {
					return fmt.Errorf("reading dump error: %w", err)
				}
				if errno == 0 {
					continue
				}
				return fmt.Errorf("requesting dump: kernel refused it: %w", errno)
			case ctMsgType(ctMsgNew):
				if len(m.payload) < nfgenHdrLen {
					return errors.New("short conntrack message")
				}
				if err := parseFlow(m.payload[0], m.payload[nfgenHdrLen:], &ent); err != nil {
					return fmt.Errorf("parsing flow: %w", err)
				}
				if err := fn(&ent); err != nil {
					return err
				}
			}
		}
		if it.err != nil {
			return fmt.Errorf("reading dump: %w", it.err)
		}
	}
}

// deleteBatch accumulates delete messages and sends them in one sendmsg.
//
// Only the last message of a batch asks for an ACK: the kernel answers the
// others only when they fail, so a batch of N deletes costs one syscall out
// and, when nothing failed, one small read back. The kernel handles the
// whole datagram inside sendmsg, in order, so once the reply to the last
// message is read, every error of the batch has been read too.
type deleteBatch struct {
	ctx       context.Context
	sock      *nlSock
	max       int
	res       *ExpireResult
	e         encoder
	first     uint32 // seq of the first message in the batch
	lastStart int    // offset of the last message in e.b
	filter    []int  // filter credited for each message, by seq-first
	failed    []bool // by seq-first
	sendErr   error  // a socket-level failure: the socket must be replaced
	// failures counts deletes the kernel refused for a reason other than
	// ENOENT; firstFailure is the first of them. They do not stop the pass:
	// the other flows still need to go.
	failures     int
	firstFailure error
}

func (b *deleteBatch) full() bool { return len(b.filter) >= b.max }

func (b *deleteBatch) add(ent *ctEntry, filterIdx int) {
	// A batch's sequence numbers are consecutive: flush finds a reply's
	// message by seq-first and waits for first+n-1.
	if len(b.filter) == 0 {
		b.first = b.sock.seq + 1
		b.e.b = b.e.b[:0]
	}
	seq := b.first + uint32(len(b.filter))
	b.filter = append(b.filter, filterIdx)
	b.lastStart = len(b.e.b)
	encodeDelete(&b.e, seq, ent, false)
}

// flush sends the batch and reads the kernel's answers. Deleted and
// PerFilter count only flows whose delete succeeded.
func (b *deleteBatch) flush() error {
	n := len(b.filter)
	if n == 0 {
		return nil
	}
	defer func() { b.filter = b.filter[:0] }()
	setAck(b.e.b, b.lastStart)
	last := b.first + uint32(n) - 1
	b.sock.seq = last
	if err := b.sock.send(b.e.b); err != nil {
		b.sendErr = err
		return fmt.Errorf("sending %d deletes: %w", n, err)
	}
	b.failed = slices.Grow(b.failed[:0], n)[:n]
	clear(b.failed)
	ctx, cancel := context.WithTimeout(b.ctx, replyTimeout)
	defer cancel()
	for done := false; !done; {
		buf, err := b.sock.recv(ctx)
		if err != nil {
			// ENOBUFS means replies were dropped, so the outcome of this
			// batch is unknown; either way the socket is replaced.
			b.sendErr = err
			return fmt.Errorf("reading replies to %d deletes: %w", n, err)
		}
		it := msgIter{b: buf}
		for it.next() {
			m := it.m
			if m.typ != unix.NLMSG_ERROR || m.seq-b.first >= uint32(n) {
				continue
			}
			errno, err := errnoOf(m.payload)
			if err != nil {
				b.sendErr = err
				return fmt.Errorf("reading replies to %d deletes: %w", n, err)
			}
			if m.seq == last {
				done = true
			}
			switch errno {
			case 0:
			case unix.ENOENT:
				// Gone already (timed out, closed, or a duplicate that the
				// dump returned twice): nothing left to delete.
				b.failed[m.seq-b.first] = true
			default:
				b.failed[m.seq-b.first] = true
				b.failures++
				if b.firstFailure == nil {
					b.firstFailure = errno
				}
			}
		}
		if it.err != nil {
			b.sendErr = it.err
			return fmt.Errorf("reading replies to %d deletes: %w", n, it.err)
		}
	}
	for i, idx := range b.filter {
		if !b.failed[i] {
			b.res.Deleted++
			b.res.PerFilter[idx]++
		}
	}
	return nil
}

// replyTimeout bounds the wait for the kernel's answers to requests it has
// already processed (inside sendmsg): they are queued before send returns,
// so only a lost reply can make the wait long, and then it must not hang.
const replyTimeout = 10 * time.Second

// setAck sets NLM_F_ACK on the message that starts at off.
func setAck(b []byte, off int) {
	f := binary.NativeEndian.Uint16(b[off+6:])
	binary.NativeEndian.PutUint16(b[off+6:], f|unix.NLM_F_ACK)
}
