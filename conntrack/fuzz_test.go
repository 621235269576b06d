package conntrack

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// kernelFlowAttrs lays ent out the way ctnetlink_fill_info reports a flow
// in a dump, with netlink.AttributeEncoder (not this package's encoder):
// both tuples, the zone where the kernel puts it, TCP state, id and start.
func kernelFlowAttrs(tb testing.TB, fl Flow, id uint32) []byte {
	tb.Helper()
	return kernelEntryAttrs(tb, &ctEntry{Flow: fl, id: id, hasID: true, zoneTop: fl.Zone != 0})
}

func kernelEntryAttrs(tb testing.TB, ent *ctEntry) []byte {
	tb.Helper()
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	tuple := func(t Tuple, withZone bool) func(*netlink.AttributeEncoder) error {
		return func(ae *netlink.AttributeEncoder) error {
			ae.Nested(ctaTupleIP, func(ip *netlink.AttributeEncoder) error {
				src, dst := uint16(ctaIPv4Src), uint16(ctaIPv4Dst)
				if t.Src.Addr().Is6() {
					src, dst = ctaIPv6Src, ctaIPv6Dst
				}
				ip.Bytes(src, t.Src.Addr().AsSlice())
				ip.Bytes(dst, t.Dst.Addr().AsSlice())
				return nil
			})
			ae.Nested(ctaTupleProto, func(p *netlink.AttributeEncoder) error {
				p.Uint8(ctaProtoNum, uint8(ent.Proto))
				p.Uint16(ctaProtoSrcPort, t.Src.Port())
				p.Uint16(ctaProtoDstPort, t.Dst.Port())
				return nil
			})
			if withZone {
				ae.Uint16(ctaTupleZone, ent.Zone)
			}
			return nil
		}
	}
	ae.Nested(ctaTupleOrig, tuple(ent.Orig, ent.zoneInTuple))
	ae.Nested(ctaTupleReply, tuple(ent.Reply, false))
	if ent.zoneTop {
		ae.Uint16(ctaZone, ent.Zone)
	}
	if ent.State != 0 {
		ae.Nested(ctaProtoinfo, func(pi *netlink.AttributeEncoder) error {
			pi.Nested(ctaProtoinfoTCP, func(tcp *netlink.AttributeEncoder) error {
				tcp.Uint8(ctaProtoinfoTCPState, uint8(ent.State))
				return nil
			})
			return nil
		})
	}
	if ent.hasID {
		ae.Bytes(ctaID, binary.NativeEndian.AppendUint32(nil, ent.id))
	}
	if !ent.Start.IsZero() {
		ae.Nested(ctaTimestamp, func(ts *netlink.AttributeEncoder) error {
			ts.Uint64(ctaTimestampStart, uint64(ent.Start.UnixNano()))
			return nil
		})
	}
	b, err := ae.Encode()
	if err != nil {
		tb.Fatalf("encoding flow attributes: %v", err)
	}
	return b
}

// splitMessages cuts a datagram into netlink messages with
// netlink.Message.UnmarshalBinary, the header decoder the connection uses
// on every datagram it receives, stopping at the first malformed one.
func splitMessages(b []byte) []netlink.Message {
	var out []netlink.Message
	for len(b) >= 16 {
		l := int(binary.NativeEndian.Uint32(b))
		al := (l + 3) &^ 3
		if l < 16 || al > len(b) {
			break
		}
		var m netlink.Message
		if m.UnmarshalBinary(b[:al]) != nil {
			break
		}
		out = append(out, m)
		b = b[al:]
	}
	return out
}

// FuzzParseFlow feeds arbitrary bytes to the ctnetlink decoder, both as a
// datagram of netlink messages (what a dump delivers) and as one message's
// payload. It must never panic (an out-of-bounds read panics in Go); a flow
// it accepts must be consistent, must survive being laid out again the way
// the kernel reports it, and its delete message must name exactly it.
func FuzzParseFlow(f *testing.F) {
	for _, h := range []string{kernelTCPv4Zone7, kernelUDPv6} {
		f.Add(wrapMessage(mustHex(f, h)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ent ctEntry
		for _, m := range splitMessages(data) {
			if ok, err := decodeFlow(m, &ent); ok && err == nil {
				checkParsed(t, m.Data[0], &ent)
			}
		}
		if len(data) >= nfgenHdrLen {
			if err := parseFlow(data[0], data[nfgenHdrLen:], &ent); err == nil {
				checkParsed(t, data[0], &ent)
			}
		}
	})
}

// checkParsed holds the properties of a flow the decoder accepted.
func checkParsed(t *testing.T, fam uint8, ent *ctEntry) {
	t.Helper()
	for _, a := range []netip.Addr{ent.Orig.Src.Addr(), ent.Orig.Dst.Addr(), ent.Reply.Src.Addr(), ent.Reply.Dst.Addr()} {
		if !a.IsValid() || a.Is4() != (fam == unix.AF_INET) {
			t.Fatalf("accepted flow %+v has address %s outside family %d", ent.Flow, a, fam)
		}
	}
	if ent.Zone != 0 && !ent.zoneTop && !ent.zoneInTuple {
		t.Fatalf("accepted flow %+v has a zone but no record of where the kernel put it", ent.Flow)
	}
	// Round trip: laid out again as the kernel would, it parses the same.
	var again ctEntry
	if err := parseFlow(fam, kernelEntryAttrs(t, ent), &again); err != nil {
		t.Fatalf("re-encoded flow %+v does not parse: %v", ent.Flow, err)
	}
	if !again.Start.Equal(ent.Start) {
		t.Fatalf("start %v came back as %v", ent.Start, again.Start)
	}
	a, b := *ent, again
	a.Start, b.Start = a.Start.UTC(), b.Start.UTC()
	if a != b {
		t.Fatalf("round trip changed the flow:\n%+v\n%+v", a, b)
	}
	// The delete names this flow: its original tuple, zone and id.
	var e encoder
	encodeDelete(&e, ent)
	if e.b[0] != fam {
		t.Fatalf("delete of a family %d flow has family %d", fam, e.b[0])
	}
	var got ctEntry
	it := attrIter{b: e.b[nfgenHdrLen:]}
	tuples := 0
	for it.next() {
		switch it.typ {
		case ctaTupleOrig:
			tuples++
			proto, zone, hasZone, err := parseTuple(fam, it.data, &got.Orig)
			if err != nil {
				t.Fatalf("delete's tuple does not parse: %v", err)
			}
			got.Proto = proto
			if hasZone {
				got.Zone, got.zoneInTuple = zone, true
			}
		case ctaZone:
			got.Zone, got.zoneTop = binary.BigEndian.Uint16(it.data), true
		case ctaID:
			got.id, got.hasID = binary.NativeEndian.Uint32(it.data), true
		default:
			t.Fatalf("delete carries attribute %d", it.typ)
		}
	}
	if it.err != nil || tuples != 1 {
		t.Fatalf("delete message: %d original tuples, error %v (a delete without a tuple flushes the table)", tuples, it.err)
	}
	if got.Proto != ent.Proto || got.Orig != ent.Orig || got.Zone != ent.Zone || got.zoneTop != ent.zoneTop ||
		got.zoneInTuple != ent.zoneInTuple || got.id != ent.id || got.hasID != ent.hasID {
		t.Fatalf("delete names %+v, the flow was %+v", got, *ent)
	}
}

// wrapMessage puts a ctnetlink payload (nfgenmsg and attributes) behind an
// IPCTNL_MSG_CT_NEW header with the multipart flag, as a dump sends it.
func wrapMessage(payload []byte) []byte {
	l := 16 + len(payload)
	b, err := netlink.Message{
		Header: netlink.Header{Length: uint32(align4(l)), Type: ctMsgType(ctMsgNew), Flags: netlink.Multi, Sequence: 1},
		Data:   payload,
	}.MarshalBinary()
	if err != nil {
		panic(err)
	}
	return b
}
