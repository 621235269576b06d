package conntrack

// Wire format of the ctnetlink messages draind builds and reads itself.
//
// The netlink layer (headers, sequence numbers, batching, multipart dumps,
// error replies) is mdlayher/netlink's. Three pieces stay here because no
// library offers them: the dump request filtered on the reply tuple
// (CTA_FILTER; ti-mo/conntrack filters dumps only by mark, zone and
// status), the flow parser, which allocates nothing per flow (a general
// attribute decoder allocates per nest, which on a large table costs more
// than the kernel's own work), and the delete encoder, which appends to one
// reused buffer.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink constants (linux/netfilter/nfnetlink.h).
const (
	nfgenHdrLen  = 4
	nlaHdrLen    = 4
	nlaTypeMask  = ^(netlink.Nested | netlink.NetByteOrder)
	nfnlSubsysCT = 1 // NFNL_SUBSYS_CTNETLINK
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

func ctMsgType(t uint16) netlink.HeaderType { return netlink.HeaderType(nfnlSubsysCT<<8 | t) }

// family returns the nfgenmsg family of an address.
func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// kernelFilter is the part of one or more Filters the kernel evaluates
// during a dump. ReplySrc is always set (it also gives the dump's address
// family); the rest is optional (zero = any), except the zone, which is
// always sent.
type kernelFilter struct {
	replySrc     netip.Addr
	replySrcPort uint16
	proto        Proto
	origDst      netip.Addr
	origDstPort  uint16
	zone         uint16
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

// dumpRequest builds an IPCTNL_MSG_CT_GET dump request that the kernel
// filters by kf (ctnetlink_alloc_filter, ctnetlink_filter_match): only
// flows that match are copied to userspace, so a pass over a table of a
// million flows moves only the endpoint's flows across the socket. The
// nfgen_family alone restricts the dump to IPv4 or IPv6; CTA_ZONE restricts
// it to one zone on kernels from 6.8 (older ones ignore it in a dump, and
// the userspace re-check keeps the result exact). It is built once per
// dump, so netlink.AttributeEncoder's allocations do not matter here.
func dumpRequest(kf kernelFilter) (netlink.Message, error) {
	origFlags, replyFlags := kf.flags()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian // ctnetlink's integers, but for CTA_FILTER's flag words
	if origFlags != 0 {
		ae.Nested(ctaTupleOrig, filterTuple(ctaTupleOrig, origFlags, kf.proto, kf.origDst, kf.origDstPort))
	}
	if replyFlags != 0 {
		ae.Nested(ctaTupleReply, filterTuple(ctaTupleReply, replyFlags, kf.proto, kf.replySrc, kf.replySrcPort))
	}
	if origFlags != 0 || replyFlags != 0 {
		ae.Nested(ctaFilter, func(nae *netlink.AttributeEncoder) error {
			nae.ByteOrder = binary.NativeEndian // NLA_U32 in host order
			nae.Uint32(ctaFilterOrigFlags, origFlags)
			nae.Uint32(ctaFilterReplyFlags, replyFlags)
			return nil
		})
	}
	ae.Uint16(ctaZone, kf.zone)
	attrs, err := ae.Encode()
	if err != nil {
		return netlink.Message{}, fmt.Errorf("encoding dump request: %w", err)
	}
	return netlink.Message{
		Header: netlink.Header{Type: ctMsgType(ctMsgGet), Flags: netlink.Request | netlink.Dump},
		Data:   append([]byte{family(kf.replySrc), 0, 0, 0}, attrs...), // nfgenmsg: version 0, res_id 0
	}, nil
}

// filterTuple encodes the tuple fields named by flags: the address and port
// are the source of a reply tuple or the destination of an original one.
func filterTuple(typ uint16, flags uint32, proto Proto, a netip.Addr, port uint16) func(*netlink.AttributeEncoder) error {
	return func(ae *netlink.AttributeEncoder) error {
		if flags&(filterIPSrc|filterIPDst) != 0 {
			ae.Nested(ctaTupleIP, func(ip *netlink.AttributeEncoder) error {
				t4, t6 := uint16(ctaIPv4Dst), uint16(ctaIPv6Dst)
				if typ == ctaTupleReply {
					t4, t6 = ctaIPv4Src, ctaIPv6Src
				}
				if a.Is4() {
					ip.Bytes(t4, a.AsSlice())
				} else {
					ip.Bytes(t6, a.AsSlice())
				}
				return nil
			})
		}
		if flags&filterProtoNum != 0 {
			ae.Nested(ctaTupleProto, func(p *netlink.AttributeEncoder) error {
				p.Uint8(ctaProtoNum, uint8(proto))
				if flags&filterProtoSrcPort != 0 {
					p.Uint16(ctaProtoSrcPort, port)
				}
				if flags&filterProtoDstPort != 0 {
					p.Uint16(ctaProtoDstPort, port)
				}
				return nil
			})
		}
		return nil
	}
}

// encoder appends netlink attributes to a buffer that is reused across
// batches, so encoding a delete costs no allocation.
type encoder struct {
	b []byte
}

func (e *encoder) attr(typ uint16, data []byte) {
	l := nlaHdrLen + len(data)
	e.b = binary.NativeEndian.AppendUint16(e.b, uint16(l))
	e.b = binary.NativeEndian.AppendUint16(e.b, typ)
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
// rejects a strictly parsed nest (such as CTA_FILTER's) without it.
func (e *encoder) nest(typ uint16) int {
	start := len(e.b)
	e.b = append(e.b, 0, 0, 0, 0)
	binary.NativeEndian.PutUint16(e.b[start+2:], typ|netlink.Nested)
	return start
}

func (e *encoder) endNest(start int) {
	binary.NativeEndian.PutUint16(e.b[start:], uint16(len(e.b)-start))
}

func align4(n int) int { return (n + 3) &^ 3 }

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

// deleteHeader is the netlink header of an IPCTNL_MSG_CT_DELETE; the
// connection fills in length, sequence number and port id.
func deleteHeader(ack bool) netlink.Header {
	h := netlink.Header{Type: ctMsgType(ctMsgDelete), Flags: netlink.Request}
	if ack {
		h.Flags |= netlink.Acknowledge
	}
	return h
}

// encodeDelete appends the payload (nfgenmsg and attributes) of an
// IPCTNL_MSG_CT_DELETE for one dumped flow. The flow is named by its
// original tuple and zone exactly as the kernel reported them, plus its
// CTA_ID when known, so a different flow that took the same tuple since the
// dump is not deleted. A delete message without a tuple would flush the
// whole table; this encoder always writes one.
func encodeDelete(e *encoder, ent *ctEntry) {
	e.b = append(e.b, family(ent.Orig.Src.Addr()), 0, 0, 0)
	encodeTuple(e, ctaTupleOrig, ent.Proto, ent.Orig, ent.Zone, ent.zoneInTuple)
	if ent.zoneTop {
		e.be16(ctaZone, ent.Zone)
	}
	if ent.hasID {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], ent.id) // opaque, echoed as received
		e.attr(ctaID, b[:])
	}
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

// decodeFlow decodes one message of a dump into ent. It reports false for
// a message that is not a flow (the kernel sends only flows in a ctnetlink
// dump, but a message of another type is skipped, not trusted).
func decodeFlow(m netlink.Message, ent *ctEntry) (bool, error) {
	if m.Header.Type != ctMsgType(ctMsgNew) {
		return false, nil
	}
	if len(m.Data) < nfgenHdrLen {
		return false, fmt.Errorf("conntrack message of %d bytes is shorter than its nfgenmsg header", len(m.Data))
	}
	return true, parseFlow(m.Data[0], m.Data[nfgenHdrLen:], ent)
}

// parseFlow decodes the attributes of an IPCTNL_MSG_CT_NEW message (what a
// dump returns per flow) into ent. fam is the message's nfgen_family.
func parseFlow(fam uint8, b []byte, ent *ctEntry) error {
	*ent = ctEntry{}
	if fam != unix.AF_INET && fam != unix.AF_INET6 {
		return fmt.Errorf("flow of address family %d (want %d or %d)", fam, unix.AF_INET, unix.AF_INET6)
	}
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
	if ent.Orig.Src.Addr().Is4() != ent.Reply.Src.Addr().Is4() {
		return fmt.Errorf("original tuple %s and reply tuple %s are of different families", ent.Orig.Src, ent.Reply.Src)
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
	if src.Is4() != dst.Is4() {
		return 0, 0, false, fmt.Errorf("tuple addresses %s and %s are of different families", src, dst)
	}
	t.Src = netip.AddrPortFrom(src, sport)
	t.Dst = netip.AddrPortFrom(dst, dport)
	return proto, zone, hasZone, nil
}
