package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	ctlib "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"
)

// Options configures Open.
type Options struct {
	// NetNS is the network namespace whose conntrack table is managed, as a
	// path (/run/netns/NAME, /proc/PID/ns/net). Empty means the namespace of
	// the calling thread at Open; only then does Open need no CAP_SYS_ADMIN.
	NetNS string
	// BatchSize is the number of delete messages sent per sendmsg; 0 means
	// DefaultBatchSize.
	BatchSize int
	// Zone is the conntrack zone whose flows Expire and Count act on (0,
	// the default zone, unless the node puts pod traffic in another one).
	// A flow with the same tuple in another zone is never touched.
	Zone uint16
}

// DefaultBatchSize keeps one batch's worst-case error replies (one per
// message when every flow vanished on its own) well inside the socket's
// receive buffer, while making the per-syscall cost negligible.
const DefaultBatchSize = 256

// Netlink expires and counts flows through ctnetlink.
//
// It holds two netlink connections in the target namespace: one for
// filtered dumps and one for batched deletes, so deletions are sent while
// the dump is still streaming and at most one batch of flows is ever held
// in memory. Methods are serialised; a connection that saw an error or a
// cancellation is replaced on the next call, so an interrupted dump never
// poisons the next one.
type Netlink struct {
	mu         sync.Mutex
	ns         *os.File
	dump, del  *netlink.Conn
	batch      int
	zone       uint16
	timestamps bool
	closed     bool
	// v6Filter caches the IPv6 address-filter probe: 0 not run yet,
	// 1 the kernel filters IPv6 addresses correctly, 2 it does not.
	v6Filter int
	// enc is the delete encoder's buffer, reused by every batch.
	enc encoder
}

var _ Interface = (*Netlink)(nil)

const timestampSysctl = "/proc/sys/net/netfilter/nf_conntrack_timestamp"

// Socket buffer sizes. recvBufSize is larger than any datagram the kernel
// builds for us (dump skbs are capped near 32 KiB, errors and acks are
// tiny); a fixed buffer also spares a peek per datagram. rcvBufBytes makes
// room for a batch in which every delete draws an error reply.
const (
	recvBufSize = 64 << 10
	rcvBufBytes = 4 << 20
)

// Open opens the ctnetlink connections inside opts.NetNS and turns
// conntrack timestamps on there (best effort; see Timestamps).
func Open(opts Options) (*Netlink, error) {
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
	n := &Netlink{ns: ns, batch: opts.BatchSize, zone: opts.Zone}
	if n.batch <= 0 {
		n.batch = DefaultBatchSize
	}
	err := inNetNS(ns, func() error {
		n.timestamps = enableTimestamps()
		return nil
	})
	if err == nil {
		_, _, err = n.sockets()
	}
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

// inNetNS runs fn on a dedicated OS thread that has joined the network
// namespace ns: the timestamp sysctl has no netlink interface, and
// /proc/sys/net resolves to the namespace of the thread that opens it.
// If the thread cannot return to its original namespace it is left locked,
// so the runtime discards it instead of running other goroutines there.
//
// A nil ns means the calling thread's namespace: fn runs right there.
func inNetNS(ns *os.File, fn func() error) error {
	if ns == nil {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("opening current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering network namespace %s: %w", ns.Name(), err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("returning from network namespace %s: %w", ns.Name(), err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// Timestamps reports whether conntrack timestamps were on after Open. When
// they are off, Filter.CreatedBefore cannot protect a new pod on a reused
// IP (every flow looks old), and the caller should not rely on it.
func (n *Netlink) Timestamps() bool { return n.timestamps }

// netlinkConfig places a connection (ours or ti-mo/conntrack's) in the
// target namespace; without one the socket is made on the calling thread,
// with no setns.
func (n *Netlink) netlinkConfig() *netlink.Config {
	cfg := &netlink.Config{MessageBufferSize: recvBufSize}
	if n.ns != nil {
		cfg.NetNS = int(n.ns.Fd())
	}
	return cfg
}

// dial opens one NETLINK_NETFILTER connection.
func (n *Netlink) dial() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, n.netlinkConfig())
	if err != nil {
		return nil, fmt.Errorf("opening netfilter netlink socket: %w", err)
	}
	// Errors for a delete batch then cost 36 bytes each instead of echoing
	// the whole request; best effort (old kernels lack it).
	_ = c.SetOption(netlink.CapAcknowledge, true)
	// A batch can draw one error per message (ENOENT when flows vanished
	// on their own); make room so none is dropped. SO_RCVBUFFORCE needs
	// CAP_NET_ADMIN, which every caller of this package has.
	forced := false
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			forced = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvBufBytes) == nil
		})
	}
	if !forced {
		_ = c.SetReadBuffer(rcvBufBytes)
	}
	return c, nil
}

// Close releases the connections and the namespace handle.
func (n *Netlink) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	var errs []error
	for _, c := range []*netlink.Conn{n.dump, n.del} {
		if c != nil {
			errs = append(errs, c.Close())
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

// sockets returns the dump and delete connections, reopening any that an
// earlier error discarded.
func (n *Netlink) sockets() (dump, del *netlink.Conn, err error) {
	if n.closed {
		return nil, nil, errors.New("conntrack handle is closed")
	}
	if n.dump == nil {
		if n.dump, err = n.dial(); err != nil {
			return nil, nil, err
		}
	}
	if n.del == nil {
		if n.del, err = n.dial(); err != nil {
			return nil, nil, err
		}
	}
	return n.dump, n.del, nil
}

// discard drops a connection after an error; the next call opens a fresh one.
func (n *Netlink) discard(c *netlink.Conn) {
	if c == nil {
		return
	}
	c.Close()
	if n.dump == c {
		n.dump = nil
	}
	if n.del == c {
		n.del = nil
	}
}

// bound makes reads on c fail once ctx is done and, when limit > 0, after
// limit; release undoes it before c is used again.
func bound(ctx context.Context, c *netlink.Conn, limit time.Duration) (release func()) {
	if limit > 0 {
		_ = c.SetReadDeadline(time.Now().Add(limit))
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		_ = c.SetReadDeadline(time.Unix(1, 0))
		close(fired)
	})
	return func() {
		if !stop() {
			<-fired // never clear the deadline before the callback set it
		}
		_ = c.SetReadDeadline(time.Time{})
	}
}

// readErr reports a read that a cancelled context cut short as the
// context's error.
func readErr(ctx context.Context, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// filterGroup is the filters of a set that share a reply-source address:
// one kernel-filtered dump serves all of them, so a pod with several ports
// and protocols costs one walk of the table, not one per port.
type filterGroup struct {
	kf    kernelFilter
	set   FilterSet // the group's filters, in the set's zone
	index []int     // position of each filter in the whole set
}

// groupFilters groups a set's filters by reply-source address, in
// first-seen order, and gives each group the kernel filter made of the
// fields all its filters agree on, in the set's zone. Userspace re-checks
// every flow against the exact filters (the group's set).
func groupFilters(s FilterSet) []filterGroup {
	var groups []filterGroup
	pos := map[netip.Addr]int{}
	for i, f := range s.filters {
		a := f.ReplySrc.Addr()
		g, ok := pos[a]
		if !ok {
			g = len(groups)
			pos[a] = g
			groups = append(groups, filterGroup{set: FilterSet{zone: s.zone}, kf: kernelFilter{
				replySrc:     a,
				replySrcPort: f.ReplySrc.Port(),
				proto:        f.Proto,
				origDst:      f.OrigDst.Addr(),
				origDstPort:  f.OrigDst.Port(),
				zone:         s.zone,
			}})
		}
		grp := &groups[g]
		grp.set.filters = append(grp.set.filters, f)
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

// Expire deletes every flow of the handle's zone that a filter selects and
// that is old enough for it. For each group of filters sharing an endpoint
// address it runs one kernel-filtered dump and, while the dump streams,
// deletes the selected flows in batches of Options.BatchSize messages per
// sendmsg. A flow that is already gone when its delete arrives (ENOENT) is
// not an error. On error the result still counts what was deleted before it.
func (n *Netlink) Expire(ctx context.Context, filters []Filter) (ExpireResult, error) {
	res := ExpireResult{PerFilter: make([]int, len(filters))}
	set, err := NewFilterSet(n.zone, filters)
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	if len(set.filters) == 0 {
		return res, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	dump, del, err := n.sockets()
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	b := &deleteBatch{ctx: ctx, conn: del, e: &n.enc, max: n.batch, res: &res}
	for _, g := range groupFilters(set) {
		kf := g.kf
		if kf.replySrc.Is6() {
			// The probe may replace the connections: send what is pending
			// first, so a batch never spans two of them.
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
			b.conn = del
		}
		err := n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
			switch v, i := g.set.Classify(ent.Flow); v {
			case VerdictExpire:
				b.add(ent, g.index[i])
				if b.full() {
					return b.flush()
				}
			case VerdictKeep:
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

// Count returns the flows of the handle's zone whose reply-direction source
// is addr, by protocol and TCP state, from one kernel-filtered dump. For an
// IPv6 address on a kernel whose IPv6 filter is broken (see
// kernelFilter.noAddr) the dump holds every IPv6 flow, filtered here:
// correct, but it costs a walk of the IPv6 part of the table through
// userspace.
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
	kf := kernelFilter{replySrc: addr, zone: n.zone}
	if addr.Is6() {
		kf.noAddr = !n.ipv6AddrFilter(ctx)
		if dump, _, err = n.sockets(); err != nil {
			return c, fmt.Errorf("counting flows of %s: %w", addr, err)
		}
	}
	err = n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
		if CountedFor(n.zone, addr, ent.Flow) {
			c.Add(ent.Flow)
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
// addresses correctly. It inserts ipv6Probe in the handle's zone (through
// ti-mo/conntrack), dumps with a filter on its reply source, and deletes
// it; the answer is cached once the probe ran. When the probe cannot run,
// it answers false: the dump is then wider but still exact, because
// userspace re-checks every flow.
func (n *Netlink) ipv6AddrFilter(ctx context.Context) bool {
	if n.v6Filter != 0 {
		return n.v6Filter == 1
	}
	dump, _, err := n.sockets()
	if err != nil {
		return false
	}
	tc, err := ctlib.Dial(n.netlinkConfig())
	if err != nil {
		return false
	}
	defer tc.Close()
	o := ipv6Probe.Orig
	probe := ctlib.NewFlow(uint8(ipv6Probe.Proto), 0, o.Src.Addr(), o.Dst.Addr(), o.Src.Port(), o.Dst.Port(), 10, 0)
	probe.Zone = n.zone
	if err := tc.Create(probe); err != nil && !errors.Is(err, unix.EEXIST) {
		return false
	}
	defer func() { _ = tc.Delete(probe) }() // best effort: it times out on its own
	found := false
	kf := kernelFilter{replySrc: ipv6Probe.Reply.Src.Addr(), proto: UDP, zone: n.zone}
	err = n.dumpFlows(ctx, dump, kf, func(ent *ctEntry) error {
		if ent.Orig == ipv6Probe.Orig {
			found = true
		}
		return nil
	})
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
// Any error, including cancellation, discards the connection, because the
// kernel would otherwise keep the half-done dump attached to it.
func (n *Netlink) dumpFlows(ctx context.Context, c *netlink.Conn, kf kernelFilter, fn func(*ctEntry) error) (err error) {
	defer func() {
		if err != nil {
			n.discard(c)
		}
	}()
	if err := ctx.Err(); err != nil {
		return err
	}
	req, err := dumpRequest(kf)
	if err != nil {
		return err
	}
	sent, err := c.Send(req)
	if err != nil {
		return fmt.Errorf("requesting dump: %w", err)
	}
	release := bound(ctx, c, 0)
	defer release()
	// Leaving the loop early makes the iterator read the rest of the dump;
	// an expired deadline makes it stop at once instead.
	abort := func(err error) error {
		_ = c.SetReadDeadline(time.Unix(1, 0))
		return err
	}
	var ent ctEntry
	for m, err := range c.ReceiveIter() {
		if err != nil {
			return fmt.Errorf("reading dump: %w", readErr(ctx, err))
		}
		if m.Header.Sequence != sent.Header.Sequence {
			return abort(fmt.Errorf("reading dump: reply to another request (sequence %d, want %d)", m.Header.Sequence, sent.Header.Sequence))
		}
		ok, err := decodeFlow(m, &ent)
		if err != nil {
			return abort(fmt.Errorf("parsing flow: %w", err))
		}
		if !ok {
			continue
		}
		if err := fn(&ent); err != nil {
			return abort(err)
		}
	}
	return nil
}

// deleteBatch accumulates delete messages and sends them in one sendmsg.
//
// Only the last message of a batch asks for an ACK: the kernel answers the
// others only when they fail, so a batch of N deletes costs one syscall out
// and, when nothing failed, one small read back. The kernel handles the
// whole datagram inside sendmsg, in order, so once the reply to the last
// message is read, every error of the batch has been read too. The
// connection numbers a batch's messages consecutively (Netlink serialises
// its methods, so nothing else sends on it meanwhile): a reply's sequence
// number minus the first one is the message's index.
type deleteBatch struct {
	ctx     context.Context
	conn    *netlink.Conn
	e       *encoder
	max     int
	res     *ExpireResult
	offs    []int // start of each message's payload in e.b
	filter  []int // filter credited for each message
	msgs    []netlink.Message
	failed  []bool
	sendErr error // a socket-level failure: the connection must be replaced
	// failures counts deletes the kernel refused for a reason other than
	// ENOENT; firstFailure is the first of them. They do not stop the pass:
	// the other flows still need to go.
	failures     int
	firstFailure error
}

func (b *deleteBatch) full() bool { return len(b.filter) >= b.max }

func (b *deleteBatch) add(ent *ctEntry, filterIdx int) {
	if len(b.filter) == 0 {
		b.e.b = b.e.b[:0]
		b.offs = b.offs[:0]
	}
	b.offs = append(b.offs, len(b.e.b))
	encodeDelete(b.e, ent)
	b.filter = append(b.filter, filterIdx)
}

// flush sends the batch and reads the kernel's answers. Deleted and
// PerFilter count only flows whose delete succeeded.
func (b *deleteBatch) flush() error {
	n := len(b.filter)
	if n == 0 {
		return nil
	}
	defer func() { b.filter = b.filter[:0] }()
	// The messages point into e.b only now that it no longer grows.
	b.msgs = b.msgs[:0]
	for i, start := range b.offs {
		end := len(b.e.b)
		if i+1 < n {
			end = b.offs[i+1]
		}
		b.msgs = append(b.msgs, netlink.Message{Header: deleteHeader(i == n-1), Data: b.e.b[start:end]})
	}
	sent, err := b.conn.SendMessages(b.msgs)
	if err != nil {
		b.sendErr = err
		return fmt.Errorf("sending %d deletes: %w", n, err)
	}
	first, last := sent[0].Header.Sequence, sent[n-1].Header.Sequence
	b.failed = slices.Grow(b.failed[:0], n)[:n]
	clear(b.failed)
	release := bound(b.ctx, b.conn, replyTimeout)
	defer release()
	for done := false; !done; {
		replies, err := b.conn.Receive()
		var oe *netlink.OpError
		if err != nil && errors.As(err, &oe) {
			// An error reply from the kernel carries the errno as is; a
			// failed read wraps it in an *os.SyscallError.
			if errno, ok := oe.Err.(syscall.Errno); ok {
				i := oe.Sequence - first
				if i >= uint32(n) {
					continue // a stale reply of an earlier batch
				}
				done = oe.Sequence == last
				b.failed[i] = true
				if errno != unix.ENOENT {
					// ENOENT: gone already (timed out, closed, or a
					// duplicate the dump returned twice); anything else
					// is a failure, reported once the pass is done.
					b.failures++
					if b.firstFailure == nil {
						b.firstFailure = errno
					}
				}
				continue
			}
		}
		if err != nil {
			// ENOBUFS means replies were dropped, so the outcome of this
			// batch is unknown; either way the connection is replaced.
			b.sendErr = err
			return fmt.Errorf("reading replies to %d deletes: %w", n, readErr(b.ctx, err))
		}
		for _, m := range replies {
			if m.Header.Type == netlink.Error && m.Header.Sequence == last {
				done = true
			}
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
