package conntrack

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Payloads (nfgenmsg + attributes) of IPCTNL_MSG_CT_NEW messages captured
// from a 6.18 kernel's dump, for flows made with
//
//	conntrack -I -s 10.0.0.1 -d 10.96.0.10 -r 10.1.0.1 -q 10.0.0.1 -p tcp \
//	  --sport 40000 --dport 80 --reply-port-src 8080 --reply-port-dst 40000 \
//	  --state ESTABLISHED -t 100 -w 7
//	conntrack -I -s fd00::9 -d fd96::10 -r fd01::1 -q fd00::9 -p udp \
//	  --sport 5000 --dport 53 --reply-port-src 5353 --reply-port-dst 5000 -t 100
//
// with nf_conntrack_timestamp=1.
const (
	kernelTCPv4Zone7 = "020000003400018014000180080001000a000001080002000a60000a1c0002800500010006000000060002009c40000006000300005000003400028014000180080001000a010001080002000a0000011c0002800500010006000000060002001f900000060003009c40000006001200000700000800030000000008080008000000000008000c0034944a4a08000b00000000010800070000000063300004802c000180050001000300000005000200000000000500030000000000060004000a000000060005000a000000100014800c00010018ec9a77ad342caf1c001880080001000000000008000200000000000800030000000000"
	kernelUDPv6      = "0a0000004c0001802c00018014000300fd00000000000000000000000000000914000400fd9600000000000000000000000000101c0002800500010011000000060002001388000006000300003500004c0002802c00018014000300fd01000000000000000000000000000114000400fd0000000000000000000000000000091c00028005000100110000000600020014e9000006000300138800000800030000000008080008000000000008000c000d4c954d08000b00000000010800070000000063100014800c00010018ec9a77ad72bade1c001880080001000000000008000200000000000800030000000000"
)

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFlowKernelMessages(t *testing.T) {
	tests := []struct {
		name    string
		payload string
		want    ctEntry
		start   string
	}{
		{
			name:    "tcp v4 in zone 7",
			payload: kernelTCPv4Zone7,
			want: ctEntry{
				Flow: Flow{
					Proto: TCP,
					Orig:  Tuple{Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.96.0.10:80")},
					Reply: Tuple{Src: netip.MustParseAddrPort("10.1.0.1:8080"), Dst: netip.MustParseAddrPort("10.0.0.1:40000")},
					Zone:  7,
					State: TCPEstablished,
				},
				id: binary.NativeEndian.Uint32([]byte{0x34, 0x94, 0x4a, 0x4a}), hasID: true, zoneTop: true,
			},
			start: "18ec9a77ad342caf",
		},
		{
			name:    "udp v6",
			payload: kernelUDPv6,
			want: ctEntry{
				Flow: Flow{
					Proto: UDP,
					Orig:  Tuple{Src: netip.MustParseAddrPort("[fd00::9]:5000"), Dst: netip.MustParseAddrPort("[fd96::10]:53")},
					Reply: Tuple{Src: netip.MustParseAddrPort("[fd01::1]:5353"), Dst: netip.MustParseAddrPort("[fd00::9]:5000")},
				},
				id: binary.NativeEndian.Uint32([]byte{0x0d, 0x4c, 0x95, 0x4d}), hasID: true,
			},
			start: "18ec9a77ad72bade",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustHex(t, tt.payload)
			var got ctEntry
			if err := parseFlow(p[0], p[nfgenHdrLen:], &got); err != nil {
				t.Fatalf("parseFlow() error = %v", err)
			}
			tt.want.Start = time.Unix(0, int64(binary.BigEndian.Uint64(mustHex(t, tt.start))))
			if !got.Start.Equal(tt.want.Start) {
				t.Errorf("Start = %v, want %v", got.Start, tt.want.Start)
			}
			got.Start, tt.want.Start = time.Time{}, time.Time{}
			if got != tt.want {
				t.Errorf("parseFlow() =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestParseFlowRejectsMalformed(t *testing.T) {
	good := mustHex(t, kernelTCPv4Zone7)[nfgenHdrLen:]
	tests := []struct {
		name    string
		fam     uint8
		attrs   []byte
		wantErr string
	}{
		{"truncated header", unix.AF_INET, good[:2], "truncated attribute header"},
		{"length past the end", unix.AF_INET, good[:40], "out of range"},
		{"no tuples", unix.AF_INET, []byte{8, 0, ctaID, 0, 1, 2, 3, 4}, "without original or reply tuple"},
		{"family mismatch", unix.AF_INET6, good, "does not match family"},
		{"bad zone length", unix.AF_INET, append(append([]byte{}, good...), 5, 0, ctaZone, 0, 1, 0, 0, 0), "zone attribute has 1 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var ent ctEntry
			err := parseFlow(tt.fam, tt.attrs, &ent)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parseFlow() error = %v, want containing %q", err, tt.wantErr)
			}
		})
	}
}

// render prints attributes as "type=hex" or "typeN{...}" (N: NLA_F_NESTED
// set; nests are recognised by that flag), so expectations can be written
// by hand from the kernel's attribute definitions.
func render(t *testing.T, b []byte) string {
	t.Helper()
	var parts []string
	for len(b) > 0 {
		if len(b) < 4 {
			t.Fatalf("trailing %d bytes", len(b))
		}
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:])
		if l < 4 || l > len(b) {
			t.Fatalf("bad attribute length %d", l)
		}
		data := b[4:l]
		if typ&nlaFNested != 0 {
			parts = append(parts, fmt.Sprintf("%dN{%s}", typ&^nlaFNested, render(t, data)))
		} else {
			parts = append(parts, fmt.Sprintf("%d=%x", typ, data))
		}
		b = b[min(align4(l), len(b)):]
	}
	return strings.Join(parts, ",")
}

// header checks one netlink message and returns its attributes.
func header(t *testing.T, b []byte, typ, flags uint16, seq uint32, fam uint8) []byte {
	t.Helper()
	if got := binary.NativeEndian.Uint32(b); int(got) != len(b) {
		t.Fatalf("nlmsg_len = %d, message has %d bytes", got, len(b))
	}
	if got := binary.NativeEndian.Uint16(b[4:]); got != typ {
		t.Errorf("type = %#x, want %#x", got, typ)
	}
	if got := binary.NativeEndian.Uint16(b[6:]); got != flags {
		t.Errorf("flags = %#x, want %#x", got, flags)
	}
	if got := binary.NativeEndian.Uint32(b[8:]); got != seq {
		t.Errorf("seq = %d, want %d", got, seq)
	}
	if b[16] != fam || b[17] != 0 || b[18] != 0 || b[19] != 0 {
		t.Errorf("nfgenmsg = %x, want family %d, version 0, res_id 0", b[16:20], fam)
	}
	return b[20:]
}

func TestEncodeDump(t *testing.T) {
	v6 := netip.MustParseAddr("fd01::1")
	tests := []struct {
		name string
		kf   kernelFilter
		fam  uint8
		// Flag words (LE u32): IP_SRC 1, IP_DST 2, PROTO_NUM 8, SRC_PORT
		// 0x10, DST_PORT 0x20 (net/netfilter/nf_internals.h).
		want string
	}{
		{
			name: "address only (Count)",
			kf:   kernelFilter{replySrc: podA},
			fam:  unix.AF_INET,
			want: "2N{1N{1=0af40105}},25N{1=00000000,2=01000000}",
		},
		{
			name: "endpoint and service: reply src ip/port, orig dst ip/port",
			kf:   kernelFilter{replySrc: podA, replySrcPort: 8080, proto: TCP, origDst: vip, origDstPort: 80},
			fam:  unix.AF_INET,
			want: "1N{1N{2=0a60000a},2N{1=06,3=0050}},2N{1N{1=0af40105},2N{1=06,2=1f90}},25N{1=2a000000,2=19000000}",
		},
		{
			name: "service address any port",
			kf:   kernelFilter{replySrc: podA, proto: UDP, origDst: vip},
			fam:  unix.AF_INET,
			want: "1N{1N{2=0a60000a}},2N{1N{1=0af40105},2N{1=11}},25N{1=02000000,2=09000000}",
		},
		{
			name: "ipv6 with a working kernel filter",
			kf:   kernelFilter{replySrc: v6, replySrcPort: 53, proto: UDP},
			fam:  unix.AF_INET6,
			want: "2N{1N{3=fd010000000000000000000000000001},2N{1=11,2=0035}},25N{1=00000000,2=19000000}",
		},
		{
			name: "ipv6 without address filtering: protocol and port only",
			kf:   kernelFilter{replySrc: v6, replySrcPort: 53, proto: UDP, origDst: netip.MustParseAddr("fd96::a"), origDstPort: 53, noAddr: true},
			fam:  unix.AF_INET6,
			want: "1N{2N{1=11,3=0035}},2N{2N{1=11,2=0035}},25N{1=28000000,2=18000000}",
		},
		{
			name: "ipv6 address only without address filtering: family-only dump",
			kf:   kernelFilter{replySrc: v6, noAddr: true},
			fam:  unix.AF_INET6,
			want: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e encoder
			encodeDump(&e, 77, tt.kf)
			attrs := header(t, e.b, 0x0101, unix.NLM_F_REQUEST|unix.NLM_F_DUMP, 77, tt.fam)
			if got := render(t, attrs); got != tt.want {
				t.Errorf("attributes:\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestKernelFilterFlagsNeverPortWithoutProto(t *testing.T) {
	for _, kf := range []kernelFilter{
		{replySrc: podA, replySrcPort: 1},
		{replySrc: podA, origDst: vip, origDstPort: 1},
		{replySrc: podA, replySrcPort: 1, origDst: vip, origDstPort: 1, noAddr: true},
	} {
		orig, reply := kf.flags()
		for _, f := range []uint32{orig, reply} {
			if f&(filterProtoSrcPort|filterProtoDstPort) != 0 && f&filterProtoNum == 0 {
				t.Errorf("%+v: flags %#x have a port without the protocol (the kernel answers EINVAL)", kf, f)
			}
		}
	}
}

func TestEncodeDeleteNamesTheDumpedFlow(t *testing.T) {
	p := mustHex(t, kernelTCPv4Zone7)
	var ent ctEntry
	if err := parseFlow(p[0], p[nfgenHdrLen:], &ent); err != nil {
		t.Fatal(err)
	}
	directional := ent
	directional.zoneTop, directional.zoneInTuple = false, true
	noID := ent
	noID.hasID, noID.zoneTop = false, false
	v6 := mustHex(t, kernelUDPv6)
	var ent6 ctEntry
	if err := parseFlow(v6[0], v6[nfgenHdrLen:], &ent6); err != nil {
		t.Fatal(err)
	}
	const tuple = "1N{1N{1=0a000001,2=0a60000a},2N{1=06,2=9c40,3=0050}"
	tests := []struct {
		name  string
		ent   *ctEntry
		ack   bool
		fam   uint8
		flags uint16
		want  string
	}{
		{"zone for both directions, id", &ent, false, unix.AF_INET, unix.NLM_F_REQUEST, tuple + "},18=0007,12=34944a4a"},
		{"ack requested", &ent, true, unix.AF_INET, unix.NLM_F_REQUEST | unix.NLM_F_ACK, tuple + "},18=0007,12=34944a4a"},
		{"directional zone goes in the tuple", &directional, false, unix.AF_INET, unix.NLM_F_REQUEST, tuple + ",3=0007},12=34944a4a"},
		{"default zone, no id", &noID, false, unix.AF_INET, unix.NLM_F_REQUEST, tuple + "}"},
		{"ipv6", &ent6, false, unix.AF_INET6, unix.NLM_F_REQUEST,
			"1N{1N{3=fd000000000000000000000000000009,4=fd960000000000000000000000000010},2N{1=11,2=1388,3=0035}},12=0d4c954d"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var e encoder
			encodeDelete(&e, 9, tt.ent, tt.ack)
			attrs := header(t, e.b, 0x0102, tt.flags, 9, tt.fam)
			got := render(t, attrs)
			if got != tt.want {
				t.Errorf("attributes:\n got %s\nwant %s", got, tt.want)
			}
			// Without CTA_TUPLE_ORIG the kernel flushes the whole table.
			if !strings.HasPrefix(got, "1N{1N{") {
				t.Fatalf("delete without an original tuple: %s", got)
			}
		})
	}
}

func TestSetAckOnlyTouchesTheLastMessage(t *testing.T) {
	var e encoder
	encodeDelete(&e, 1, &ctEntry{Flow: svcFlow(TCP, 1, 80, podA, 8080)}, false)
	last := len(e.b)
	encodeDelete(&e, 2, &ctEntry{Flow: svcFlow(TCP, 2, 80, podA, 8080)}, false)
	setAck(e.b, last)
	it := msgIter{b: e.b}
	var flags []uint16
	for it.next() {
		flags = append(flags, it.m.flags)
	}
	if it.err != nil {
		t.Fatal(it.err)
	}
	if len(flags) != 2 || flags[0] != unix.NLM_F_REQUEST || flags[1] != unix.NLM_F_REQUEST|unix.NLM_F_ACK {
		t.Fatalf("flags = %#x, want [REQUEST, REQUEST|ACK]", flags)
	}
}

func TestEncodeNewRoundTrip(t *testing.T) {
	fl := svcFlow(TCP, 40000, 80, podA, 8080)
	var e encoder
	encodeNew(&e, 3, fl, 600)
	attrs := header(t, e.b, 0x0100, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_EXCL, 3, unix.AF_INET)
	var got ctEntry
	if err := parseFlow(unix.AF_INET, attrs, &got); err != nil {
		t.Fatal(err)
	}
	if got.Flow != fl {
		t.Fatalf("round trip = %+v, want %+v", got.Flow, fl)
	}
}

func TestMsgIterAndErrno(t *testing.T) {
	// Two replies as the kernel sends them: an error (ENOENT) for seq 5 and
	// an ACK for seq 6, each nlmsgerr with the capped original header.
	var b []byte
	for _, r := range []struct {
		seq  uint32
		code int32
	}{{5, -int32(unix.ENOENT)}, {6, 0}} {
		m := make([]byte, nlmsgHdrLen+4+nlmsgHdrLen)
		binary.NativeEndian.PutUint32(m, uint32(len(m)))
		binary.NativeEndian.PutUint16(m[4:], unix.NLMSG_ERROR)
		binary.NativeEndian.PutUint32(m[8:], r.seq)
		binary.NativeEndian.PutUint32(m[16:], uint32(r.code))
		b = append(b, m...)
	}
	it := msgIter{b: b}
	var got []string
	for it.next() {
		errno, err := errnoOf(it.m.payload)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%d:%d", it.m.seq, errno))
	}
	if it.err != nil {
		t.Fatal(it.err)
	}
	if want := fmt.Sprintf("5:%d,6:0", unix.ENOENT); strings.Join(got, ",") != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	bad := msgIter{b: b[:20]}
	for bad.next() {
	}
	if bad.err == nil {
		t.Fatal("truncated message not reported")
	}
	if _, err := errnoOf([]byte{1}); err == nil {
		t.Fatal("short error payload not reported")
	}
}
