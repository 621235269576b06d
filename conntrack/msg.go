package conntrack

// Wire format of the ctnetlink messages draind sends and reads.
//
// ti-mo/conntrack cannot express CTA_FILTER (tuple filtering of dumps), and
// its decoder allocates per attribute, which costs more than the kernel's
// own work on a large table. The handful of messages draind needs is small
// enough to encode and parse here, without allocations on the hot path.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// Netlink and nfnetlink constants (linux/netlink.h, linux/netfilter/nfnetlink.h).
const (
	nlmsgHdrLen  = 16
	nfgenHdrLen  = 4
	nlaHdrLen    = 4
	nlaFNested   = 1 << 15
	nlaTypeMask  = ^uint16(3 << 14) // clears NLA_F_NESTED and NLA_F_NET_BYTEORDER
	nfnlSubsysCT = 1                // NFNL_SUBSYS_CTNETLINK
)

// ctnetlink message types (enum cntl_msg_types).
const (
	ctMsgNew    = 0
	ctMsgGet    = 1
	ctMsgDelete = 2
)

// ctnetlink attributes (linux/netfilter/nfnetlink_conntrack.h).
const (
	ctaTupleOrig  = 1
	ctaTupleReply = 2
	ctaProtoinfo  = 4
	ctaTimeout    = 7
	ctaID         = 12
	ctaZone       = 18
	ctaTimestamp  = 20
	ctaFilter     = 25

	ctaTupleIP    = 1
	ctaTupleProto = 2
	ctaTupleZone  = 3

	ctaIPv4Src = 1
	ctaIPv4Dst = 2
	ctaIPv6Src = 3
	ctaIPv6Dst = 4

	ctaProtoNum     = 1
	ctaProtoSrcPort = 2
	ctaProtoDstPort = 3

	ctaProtoinfoTCP      = 1
	ctaProtoinfoTCPState = 1

	ctaTimestampStart = 1

	ctaFilterOrigFlags  = 1
	ctaFilterReplyFlags = 2
)

// CTA_FILTER flag bits (net/netfilter/nf_internals.h): which fields of the
// CTA_TUPLE_ORIG / CTA_TUPLE_REPLY given with a dump request the kernel
// compares. Port flags need the protocol flag too.
const (
	filterIPSrc        = 1 << 0
	filterIPDst        = 1 << 1
	filterProtoNum     = 1 << 3
	filterProtoSrcPort = 1 << 4
	filterProtoDstPort = 1 << 5
)

func ctMsgType(t uint16) uint16 { return nfnlSubsysCT<<8 | t }

// family returns the nfgenmsg family of an address.
func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// encoder appends netlink messages to a buffer that is reused across
// batches, so encoding a delete costs no allocation.
type encoder struct {
	b []byte
}

// begin starts a message and returns its offset for end.
func (e *encoder) begin(typ, flags uint16, seq uint32, fam uint8) int {
	start := len(e.b)
	var h [nlmsgHdrLen + nfgenHdrLen]byte
	binary.NativeEndian.PutUint16(h[4:], typ)
	binary.NativeEndian.PutUint16(h[6:], flags)
	binary.NativeEndian.PutUint32(h[8:], seq)
	h[16] = fam // nfgen_family; version 0 (NFNETLINK_V0), res_id 0
	e.b = append(e.b, h[:]...)
	return start
}

// end fills in the length of the message started at start.
func (e *encoder) end(start int) {
	binary.NativeEndian.PutUint32(e.b[start:], uint32(len(e.b)-start))
}

func (e *encoder) attr(typ uint16, data []byte) {
	l := nlaHdrLen + len(data)
	var h [nlaHdrLen]byte
	binary.NativeEndian.PutUint16(h[0:], uint16(l))
	binary.NativeEndian.PutUint16(h[2:], typ)
	e.b = append(e.b, h[:]...)
	e.b = append(e.b, data...)
	for pad := align4(l) - l; pad > 0; pad-- {
		e.b = append(e.b, 0)
	}
}

func (e *encoder) u8(typ uint16, v uint8) { e.attr(typ, []byte{v}) }

func (e *encoder) be16(typ uint16, v uint16) {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	e.attr(typ, b[:])
}

func (e *encoder) be32(typ uint16, v uint32) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	e.attr(typ, b[:])
}

// u32 encodes a host-order u32 (CTA_FILTER flags are NLA_U32, not big-endian).
func (e *encoder) u32(typ uint16, v uint32) {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	e.attr(typ, b[:])
}

func (e *encoder) addr(typ4, typ6 uint16, a netip.Addr) {
	if a.Is4() {
		b := a.As4()
		e.attr(typ4, b[:])
		return
	}
	b := a.As16()
	e.attr(typ6, b[:])
}

// nest opens a nested attribute; NLA_F_NESTED is set because the kernel
// parses CTA_FILTER strictly and rejects a nest without it.
func (e *encoder) nest(typ uint16) int {
	start := len(e.b)
	e.b = append(e.b, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(e.b[start+2:], typ|nlaFNested)
	return start
}

func (e *encoder) endNest(start int) {
	binary.NativeEndian.PutUint16(e.b[start:], uint16(len(e.b)-start))
}

func align4(n int) int { return (n + 3) &^ 3 }

// kernelFilter is the part of one or more Filters the kernel evaluates
// during a dump. ReplySrc is always set (it also gives the dump's address
// family); the rest is optional (zero = any).
type kernelFilter struct {
	replySrc     netip.Addr
	replySrcPort uint16
	proto        Proto
	origDst      netip.Addr
	origDstPort  uint16
	// noAddr leaves the addresses out of the kernel filter. Kernels up to
	// at least 6.18 compare IPv6 addresses in ctnetlink_filter_match_tuple
	// with !ipv6_addr_cmp(), which rejects exactly the flows that match;
	// where a probe shows that, IPv6 dumps are narrowed by protocol and
	// ports only and the address is checked in userspace.
	noAddr bool
}

// flags returns the CTA_FILTER orig and reply flag words for kf. Port flags
// always come with the protocol flag: the kernel refuses ports without it.
func (kf kernelFilter) flags() (orig, reply uint32) {
	if !kf.noAddr {
		reply |= filterIPSrc
	}
	if kf.proto != 0 {
		reply |= filterProtoNum
		if kf.replySrcPort != 0 {
			reply |= filterProtoSrcPort
		}
	}
	if kf.origDst.IsValid() {
		if !kf.noAddr {
			orig |= filterIPDst
		}
		if kf.proto != 0 && kf.origDstPort != 0 {
			orig |= filterProtoNum | filterProtoDstPort
		}
	}
	return orig, reply
}

// encodeDump appends an IPCTNL_MSG_CT_GET dump request that the kernel
// filters by kf (ctnetlink_alloc_filter / ctnetlink_filter_match_tuple):
// only flows that match are copied to userspace, so a pass over a table of a
// million flows moves only the endpoint's flows across the socket. The
// nfgen_family alone already restricts the dump to IPv4 or IPv6.
func encodeDump(e *encoder, seq uint32, kf kernelFilter) {
	origFlags, replyFlags := kf.flags()
	m := e.begin(ctMsgType(ctMsgGet), unix.NLM_F_REQUEST|unix.NLM_F_DUMP, seq, family(kf.replySrc))
	if origFlags != 0 {
		encodeFilterTuple(e, ctaTupleOrig, origFlags, kf.proto, kf.origDst, kf.origDstPort)
	}
	if replyFlags != 0 {
		encodeFilterTuple(e, ctaTupleReply, replyFlags, kf.proto, kf.replySrc, kf.replySrcPort)
	}
	if origFlags != 0 || replyFlags != 0 {
		f := e.nest(ctaFilter)
		e.u32(ctaFilterOrigFlags, origFlags)
		e.u32(ctaFilterReplyFlags, replyFlags)
		e.endNest(f)
	}
	e.end(m)
}

// encodeFilterTuple writes the tuple fields named by flags: the address and
// port are the source of a reply tuple or the destination of an original one.
func encodeFilterTuple(e *encoder, typ uint16, flags uint32, proto Proto, a netip.Addr, port uint16) {
	t := e.nest(typ)
	if flags&(filterIPSrc|filterIPDst) != 0 {
		ip := e.nest(ctaTupleIP)
		if typ == ctaTupleReply {
			e.addr(ctaIPv4Src, ctaIPv6Src, a)
		} else {
			e.addr(ctaIPv4Dst, ctaIPv6Dst, a)
		}
		e.endNest(ip)
	}
	if flags&filterProtoNum != 0 {
		p := e.nest(ctaTupleProto)
		e.u8(ctaProtoNum, uint8(proto))
		if flags&filterProtoSrcPort != 0 {
			e.be16(ctaProtoSrcPort, port)
		}
		if flags&filterProtoDstPort != 0 {
			e.be16(ctaProtoDstPort, port)
		}
		e.endNest(p)
	}
	e.endNest(t)
}

// encodeTuple appends a full tuple (addresses, protocol, ports).
func encodeTuple(e *encoder, typ uint16, proto Proto, t Tuple, zone uint16, withZone bool) {
	n := e.nest(typ)
	ip := e.nest(ctaTupleIP)
	e.addr(ctaIPv4Src, ctaIPv6Src, t.Src.Addr())
	e.addr(ctaIPv4Dst, ctaIPv6Dst, t.Dst.Addr())
	e.endNest(ip)
	p := e.nest(ctaTupleProto)
	e.u8(ctaProtoNum, uint8(proto))
	e.be16(ctaProtoSrcPort, t.Src.Port())
	e.be16(ctaProtoDstPort, t.Dst.Port())
	e.endNest(p)
	if withZone {
		e.be16(ctaTupleZone, zone)
	}
	e.endNest(n)
}

// encodeDelete appends an IPCTNL_MSG_CT_DELETE for one dumped flow. The
// flow is named by its original tuple and zone exactly as the kernel
// reported them, plus its CTA_ID when known, so a different flow that took
// the same tuple since the dump is not deleted. A delete message without a
// tuple would flush the whole table; this encoder always writes one.
func encodeDelete(e *encoder, seq uint32, ent *ctEntry, ack bool) {
	flags := uint16(unix.NLM_F_REQUEST)
	if ack {
		flags |= unix.NLM_F_ACK
	}
	m := e.begin(ctMsgType(ctMsgDelete), flags, seq, family(ent.Orig.Src.Addr()))
	encodeTuple(e, ctaTupleOrig, ent.Proto, ent.Orig, ent.Zone, ent.zoneInTuple)
	if ent.zoneTop {
		e.be16(ctaZone, ent.Zone)
	}
	if ent.hasID {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], ent.id) // opaque, echoed as received
		e.attr(ctaID, b[:])
	}
	e.end(m)
}

// encodeNew appends an IPCTNL_MSG_CT_NEW that creates fl with the given
// timeout (seconds) and returns the message's offset. Both tuples are given,
// so a flow can look DNATed (orig dst = VIP, reply src = pod). The IPv6
// filter probe uses it; tests use it to fill a table without traffic.
func encodeNew(e *encoder, seq uint32, fl Flow, timeout uint32) int {
	start := e.begin(ctMsgType(ctMsgNew), unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_EXCL, seq, family(fl.Orig.Src.Addr()))
	encodeTuple(e, ctaTupleOrig, fl.Proto, fl.Orig, 0, false)
	encodeTuple(e, ctaTupleReply, fl.Proto, fl.Reply, 0, false)
	e.be32(ctaTimeout, timeout)
	if fl.Proto == TCP {
		pi := e.nest(ctaProtoinfo)
		tcp := e.nest(ctaProtoinfoTCP)
		e.u8(ctaProtoinfoTCPState, uint8(fl.State))
		e.endNest(tcp)
		e.endNest(pi)
	}
	if fl.Zone != 0 {
		e.be16(ctaZone, fl.Zone)
	}
	e.end(start)
	return start
}

// ctEntry is a dumped flow plus what is needed to delete exactly that flow.
type ctEntry struct {
	Flow
	id    uint32 // CTA_ID, in the byte order the kernel sent it
	hasID bool
	// zoneTop / zoneInTuple record where the kernel reported the zone
	// (CTA_ZONE for both directions, CTA_TUPLE_ZONE in the original tuple
	// for a directional zone) so the delete names it the same way.
	zoneTop     bool
	zoneInTuple bool
}

// attrIter walks a run of netlink attributes without allocating.
type attrIter struct {
	b    []byte
	typ  uint16
	data []byte
	err  error
}

func (it *attrIter) next() bool {
	if len(it.b) == 0 || it.err != nil {
		return false
	}
	if len(it.b) < nlaHdrLen {
		it.err = errors.New("truncated attribute header")
		return false
	}
	l := int(binary.NativeEndian.Uint16(it.b))
	if l < nlaHdrLen || l > len(it.b) {
		it.err = fmt.Errorf("attribute length %d out of range (%d bytes left)", l, len(it.b))
		return false
	}
	it.typ = binary.NativeEndian.Uint16(it.b[2:]) & nlaTypeMask
	it.data = it.b[nlaHdrLen:l]
	if a := align4(l); a < len(it.b) {
		it.b = it.b[a:]
	} else {
		it.b = nil
	}
	return true
}

// parseFlow decodes the attributes of an IPCTNL_MSG_CT_NEW message (what a
// dump returns per flow) into ent. fam is the message's nfgen_family.
func parseFlow(fam uint8, b []byte, ent *ctEntry) error {
	*ent = ctEntry{}
	var haveOrig, haveReply bool
	it := attrIter{b: b}
	for it.next() {
		switch it.typ {
		case ctaTupleOrig:
			proto, zone, hasZone, err := parseTuple(fam, it.data, &ent.Orig)
			if err != nil {
				return fmt.Errorf("parsing original tuple: %w", err)
			}
			ent.Proto = proto
			if hasZone {
				ent.Zone, ent.zoneInTuple = zone, true
			}
			haveOrig = true
		case ctaTupleReply:
			if _, _, _, err := parseTuple(fam, it.data, &ent.Reply); err != nil {
				return fmt.Errorf("parsing reply tuple: %w", err)
			}
			haveReply = true
		case ctaZone:
			if len(it.data) != 2 {
				return fmt.Errorf("zone attribute has %d bytes", len(it.data))
			}
			ent.Zone, ent.zoneTop = binary.BigEndian.Uint16(it.data), true
		case ctaID:
			if len(it.data) != 4 {
				return fmt.Errorf("id attribute has %d bytes", len(it.data))
			}
			ent.id, ent.hasID = binary.NativeEndian.Uint32(it.data), true
		case ctaTimestamp:
			ts := attrIter{b: it.data}
			for ts.next() {
				if ts.typ == ctaTimestampStart && len(ts.data) == 8 {
					if ns := binary.BigEndian.Uint64(ts.data); ns != 0 {
						ent.Start = time.Unix(0, int64(ns))
					}
				}
			}
			if ts.err != nil {
				return fmt.Errorf("parsing timestamp: %w", ts.err)
			}
		case ctaProtoinfo:
			pi := attrIter{b: it.data}
			for pi.next() {
				if pi.typ != ctaProtoinfoTCP {
					continue
				}
				tcp := attrIter{b: pi.data}
				for tcp.next() {
					if tcp.typ == ctaProtoinfoTCPState && len(tcp.data) == 1 {
						ent.State = TCPState(tcp.data[0])
					}
				}
				if tcp.err != nil {
					return fmt.Errorf("parsing tcp protoinfo: %w", tcp.err)
				}
			}
			if pi.err != nil {
				return fmt.Errorf("parsing protoinfo: %w", pi.err)
			}
		}
	}
	if it.err != nil {
		return it.err
	}
	if !haveOrig || !haveReply {
		return errors.New("flow without original or reply tuple")
	}
	return nil
}

// parseTuple decodes a CTA_TUPLE_* nest.
func parseTuple(fam uint8, b []byte, t *Tuple) (proto Proto, zone uint16, hasZone bool, err error) {
	var src, dst netip.Addr
	var sport, dport uint16
	it := attrIter{b: b}
	for it.next() {
		switch it.typ {
		case ctaTupleIP:
			ip := attrIter{b: it.data}
			for ip.next() {
				var a netip.Addr
				switch {
				case (ip.typ == ctaIPv4Src || ip.typ == ctaIPv4Dst) && len(ip.data) == 4:
					a = netip.AddrFrom4([4]byte(ip.data))
				case (ip.typ == ctaIPv6Src || ip.typ == ctaIPv6Dst) && len(ip.data) == 16:
					a = netip.AddrFrom16([16]byte(ip.data))
				default:
					return 0, 0, false, fmt.Errorf("address attribute %d has %d bytes", ip.typ, len(ip.data))
				}
				if ip.typ == ctaIPv4Src || ip.typ == ctaIPv6Src {
					src = a
				} else {
					dst = a
				}
			}
			if ip.err != nil {
				return 0, 0, false, ip.err
			}
		case ctaTupleProto:
			p := attrIter{b: it.data}
			for p.next() {
				switch {
				case p.typ == ctaProtoNum && len(p.data) == 1:
					proto = Proto(p.data[0])
				case p.typ == ctaProtoSrcPort && len(p.data) == 2:
					sport = binary.BigEndian.Uint16(p.data)
				case p.typ == ctaProtoDstPort && len(p.data) == 2:
					dport = binary.BigEndian.Uint16(p.data)
				}
			}
			if p.err != nil {
				return 0, 0, false, p.err
			}
		case ctaTupleZone:
			if len(it.data) == 2 {
				zone, hasZone = binary.BigEndian.Uint16(it.data), true
			}
		}
	}
	if it.err != nil {
		return 0, 0, false, it.err
	}
	if !src.IsValid() || !dst.IsValid() {
		return 0, 0, false, errors.New("tuple without addresses")
	}
	if (fam == unix.AF_INET) != src.Is4() {
		return 0, 0, false, fmt.Errorf("tuple address %s does not match family %d", src, fam)
	}
	t.Src = netip.AddrPortFrom(src, sport)
	t.Dst = netip.AddrPortFrom(dst, dport)
	return proto, zone, hasZone, nil
}

// nlMsg is one netlink message in a received buffer.
type nlMsg struct {
	typ, flags uint16
	seq        uint32
	payload    []byte
}

// msgIter walks the netlink messages of one datagram.
type msgIter struct {
	b   []byte
	m   nlMsg
	err error
}

func (it *msgIter) next() bool {
	if len(it.b) == 0 || it.err != nil {
		return false
	}
	if len(it.b) < nlmsgHdrLen {
		it.err = errors.New("truncated netlink header")
		return false
	}
	l := int(binary.NativeEndian.Uint32(it.b))
	if l < nlmsgHdrLen || l > len(it.b) {
		it.err = fmt.Errorf("netlink message length %d out of range (%d bytes left)", l, len(it.b))
		return false
	}
	it.m = nlMsg{
		typ:     binary.NativeEndian.Uint16(it.b[4:]),
		flags:   binary.NativeEndian.Uint16(it.b[6:]),
		seq:     binary.NativeEndian.Uint32(it.b[8:]),
		payload: it.b[nlmsgHdrLen:l],
	}
	if a := align4(l); a < len(it.b) {
		it.b = it.b[a:]
	} else {
		it.b = nil
	}
	return true
}

// errnoOf returns the error code of an NLMSG_ERROR or NLMSG_DONE payload
// (0 for an ACK / a clean end of dump).
func errnoOf(payload []byte) (unix.Errno, error) {
	if len(payload) < 4 {
		return 0, errors.New("truncated error message")
	}
	code := int32(binary.NativeEndian.Uint32(payload))
	if code >= 0 {
		return 0, nil
	}
	return unix.Errno(-code), nil
}
