package conntrack

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

var (
	podA   = netip.MustParseAddr("10.244.1.5")
	podB   = netip.MustParseAddr("10.244.2.7")
	vip    = netip.MustParseAddr("10.96.0.10")
	client = netip.MustParseAddr("10.244.3.9")
)

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// svcFlow is a flow client:cport -> vip:vport, DNATed to pod:pport.
func svcFlow(p Proto, cport uint16, vport uint16, pod netip.Addr, pport uint16) Flow {
	return Flow{
		Proto: p,
		Orig:  Tuple{Src: ap(client, cport), Dst: ap(vip, vport)},
		Reply: Tuple{Src: ap(pod, pport), Dst: ap(client, cport)},
		State: TCPEstablished,
	}
}

func TestFilterValidate(t *testing.T) {
	mapped := netip.AddrFrom16(podA.As16()) // ::ffff:10.244.1.5
	tests := []struct {
		name    string
		f       Filter
		want    Filter
		wantErr string
	}{
		{name: "tcp endpoint", f: Filter{Proto: TCP, ReplySrc: ap(podA, 8080)}, want: Filter{Proto: TCP, ReplySrc: ap(podA, 8080)}},
		{name: "mapped addresses become ipv4", f: Filter{Proto: UDP, ReplySrc: ap(mapped, 53), OrigDst: ap(netip.AddrFrom16(vip.As16()), 53)},
			want: Filter{Proto: UDP, ReplySrc: ap(podA, 53), OrigDst: ap(vip, 53)}},
		{name: "no protocol", f: Filter{ReplySrc: ap(podA, 80)}, wantErr: "unsupported protocol proto-0"},
		{name: "icmp", f: Filter{Proto: 1, ReplySrc: ap(podA, 0)}, wantErr: "unsupported protocol proto-1"},
		{name: "no reply source would match every flow", f: Filter{Proto: TCP}, wantErr: "reply source address is not set"},
		{name: "mixed families", f: Filter{Proto: TCP, ReplySrc: ap(podA, 80), OrigDst: ap(netip.MustParseAddr("fd00::1"), 80)}, wantErr: "different address families"},
		{name: "orig port without address", f: Filter{Proto: TCP, ReplySrc: ap(podA, 80), OrigDst: netip.AddrPortFrom(netip.Addr{}, 80)}, wantErr: "port but no address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.f.validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("validate() error = %v, want containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("validate() error = %v", err)
			}
			if got != tt.want {
				t.Fatalf("validate() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestNewFilterSetNamesTheBadOne(t *testing.T) {
	_, err := NewFilterSet(0, []Filter{{Proto: TCP, ReplySrc: ap(podA, 1)}, {Proto: TCP}})
	if err == nil || !strings.HasPrefix(err.Error(), "validating filter 1: ") {
		t.Fatalf("error = %v, want it to name filter 1", err)
	}
}

func TestFilterMatchesTuple(t *testing.T) {
	dnsA := svcFlow(UDP, 40000, 53, podA, 5353)
	webA := svcFlow(TCP, 40001, 80, podA, 8080)
	direct := Flow{Proto: TCP, Orig: Tuple{Src: ap(client, 40002), Dst: ap(podA, 8080)}, Reply: Tuple{Src: ap(podA, 8080), Dst: ap(client, 40002)}}
	v6 := Flow{Proto: TCP, Orig: Tuple{Src: netip.MustParseAddrPort("[fd00::9]:1"), Dst: netip.MustParseAddrPort("[fd96::a]:80")},
		Reply: Tuple{Src: netip.MustParseAddrPort("[fd01::5]:8080"), Dst: netip.MustParseAddrPort("[fd00::9]:1")}}
	tests := []struct {
		name string
		f    Filter
		fl   Flow
		want bool
	}{
		{"udp endpoint matches its udp flow", Filter{Proto: UDP, ReplySrc: ap(podA, 5353)}, dnsA, true},
		{"udp filter ignores the tcp flow of the same pod", Filter{Proto: UDP, ReplySrc: ap(podA, 0)}, webA, false},
		{"port 0 means any port", Filter{Proto: TCP, ReplySrc: ap(podA, 0)}, webA, true},
		{"other port", Filter{Proto: TCP, ReplySrc: ap(podA, 9090)}, webA, false},
		{"other pod", Filter{Proto: TCP, ReplySrc: ap(podB, 8080)}, webA, false},
		{"orig dst selects the service", Filter{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 80)}, webA, true},
		{"orig dst any port", Filter{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 0)}, webA, true},
		{"orig dst other service port", Filter{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 443)}, webA, false},
		{"orig dst service excludes direct dial", Filter{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 80)}, direct, false},
		{"orig dst pod ip selects direct dial", Filter{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(podA, 8080)}, direct, true},
		{"reply src is what counts, not orig src", Filter{Proto: TCP, ReplySrc: ap(client, 0)}, webA, false},
		{"ipv6", Filter{Proto: TCP, ReplySrc: netip.MustParseAddrPort("[fd01::5]:8080")}, v6, true},
		{"ipv6 other address", Filter{Proto: TCP, ReplySrc: netip.MustParseAddrPort("[fd01::6]:8080")}, v6, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := tt.f.validate()
			if err != nil {
				t.Fatal(err)
			}
			if got := f.matchesTuple(tt.fl); got != tt.want {
				t.Fatalf("matchesTuple() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFilterIsOld(t *testing.T) {
	gone := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		cb    time.Time
		start time.Time
		want  bool
	}{
		{"no CreatedBefore: every flow is old", time.Time{}, gone.Add(time.Hour), true},
		{"started before the pod was seen gone", gone, gone.Add(-time.Nanosecond), true},
		{"started at the instant: not before", gone, gone, false},
		{"started after: a new pod's flow", gone, gone.Add(time.Second), false},
		{"no timestamp: predates timestamping, old", gone, time.Time{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Filter{Proto: TCP, ReplySrc: ap(podA, 0), CreatedBefore: tt.cb}
			if got := f.isOld(Flow{Start: tt.start}); got != tt.want {
				t.Fatalf("isOld() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFilterSetClassify(t *testing.T) {
	gone := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	young := svcFlow(TCP, 1, 80, podA, 8080)
	young.Start = gone.Add(time.Second)
	old := svcFlow(TCP, 2, 80, podA, 8080)
	old.Start = gone.Add(-time.Second)
	other := svcFlow(TCP, 3, 80, podB, 8080)

	protect := Filter{Proto: TCP, ReplySrc: ap(podA, 8080), CreatedBefore: gone}
	all := Filter{Proto: TCP, ReplySrc: ap(podA, 0)}
	otherZone := old
	otherZone.Zone = 5
	tests := []struct {
		name    string
		zone    uint16
		filters []Filter
		fl      Flow
		want    Verdict
		wantIdx int
	}{
		{"no filters", 0, nil, old, VerdictSkip, -1},
		{"not selected", 0, []Filter{protect}, other, VerdictSkip, -1},
		{"old flow expires", 0, []Filter{protect}, old, VerdictExpire, 0},
		{"young flow is kept", 0, []Filter{protect}, young, VerdictKeep, -1},
		{"a later filter that expires wins over a keep", 0, []Filter{protect, all}, young, VerdictExpire, 1},
		{"the first expiring filter is credited", 0, []Filter{all, protect}, old, VerdictExpire, 0},
		{"same tuple in another zone is someone else's", 0, []Filter{all}, otherZone, VerdictSkip, -1},
		{"a handle in zone 5 expires zone 5 flows", 5, []Filter{all}, otherZone, VerdictExpire, 0},
		{"a handle in zone 5 leaves zone 0 alone", 5, []Filter{all}, old, VerdictSkip, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := NewFilterSet(tt.zone, tt.filters)
			if err != nil {
				t.Fatal(err)
			}
			v, idx := set.Classify(tt.fl)
			if v != tt.want || idx != tt.wantIdx {
				t.Fatalf("Classify() = (%v, %d), want (%v, %d)", v, idx, tt.want, tt.wantIdx)
			}
		})
	}
}

func TestCountedFor(t *testing.T) {
	web := svcFlow(TCP, 1, 80, podA, 8080)
	dns := svcFlow(UDP, 2, 53, podA, 5353)
	sctp := svcFlow(132, 3, 80, podA, 8080)
	otherZone := web
	otherZone.Zone = 5
	mappedReply := web
	mappedReply.Reply.Src = ap(netip.AddrFrom16(podA.As16()), 8080)
	tests := []struct {
		name string
		zone uint16
		addr netip.Addr
		fl   Flow
		want bool
	}{
		{"tcp flow of the pod", 0, podA, web, true},
		{"udp flow of the pod", 0, podA, dns, true},
		{"any protocol", 0, podA, sctp, true},
		{"another pod's flow", 0, podB, web, false},
		{"the client is not the endpoint", 0, client, web, false},
		{"same tuple in another zone is someone else's", 0, podA, otherZone, false},
		{"a handle in zone 5 counts zone 5 flows", 5, podA, otherZone, true},
		{"a mapped address names the pod", 0, netip.AddrFrom16(podA.As16()), web, true},
		{"a mapped reply source is the pod", 0, podA, mappedReply, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CountedFor(tt.zone, tt.addr, tt.fl); got != tt.want {
				t.Fatalf("CountedFor(%d, %s, %+v) = %v, want %v", tt.zone, tt.addr, tt.fl, got, tt.want)
			}
		})
	}
}

// expireTable is what an Expire pass of a handle in zone does to table,
// by the exported rules alone (FilterSet.Classify): the result and the
// flows left. The privileged tests hold Netlink against it.
func expireTable(zone uint16, filters []Filter, table []Flow) (ExpireResult, []Flow, error) {
	res := ExpireResult{PerFilter: make([]int, len(filters))}
	set, err := NewFilterSet(zone, filters)
	if err != nil {
		return res, nil, err
	}
	var left []Flow
	for _, fl := range table {
		switch v, i := set.Classify(fl); v {
		case VerdictExpire:
			res.Deleted++
			res.PerFilter[i]++
			continue
		case VerdictKeep:
			res.Kept++
		}
		left = append(left, fl)
	}
	return res, left, nil
}

// countTable is what Count(addr) of a handle in zone returns for table,
// by the exported rules alone (CountedFor, Counts.Add).
func countTable(zone uint16, addr netip.Addr, table []Flow) Counts {
	var c Counts
	for _, fl := range table {
		if CountedFor(zone, addr, fl) {
			c.Add(fl)
		}
	}
	return c
}

func TestCountsAddAndLiveTCP(t *testing.T) {
	var c Counts
	for _, s := range []TCPState{TCPSynSent, TCPSynRecv, TCPEstablished, TCPEstablished, TCPFinWait, TCPCloseWait, TCPLastAck, TCPTimeWait, TCPTimeWait, TCPClose, TCPSynSent2, TCPNone, 42} {
		c.Add(Flow{Proto: TCP, State: s})
	}
	c.Add(Flow{Proto: UDP})
	c.Add(Flow{Proto: UDP})
	c.Add(Flow{Proto: 132}) // SCTP: neither TCP nor UDP, not counted
	if c.UDP != 2 {
		t.Errorf("UDP = %d, want 2", c.UDP)
	}
	if c.TCP[TCPEstablished] != 2 || c.TCP[TCPTimeWait] != 2 || c.TCP[TCPClose] != 1 {
		t.Errorf("TCP = %v", c.TCP)
	}
	if c.TCP[TCPNone] != 2 {
		t.Errorf("TCP[None] = %d, want 2 (one none, one unknown state counted as none)", c.TCP[TCPNone])
	}
	// 13 TCP flows: 2 TIME_WAIT and 1 CLOSE are not connections any more,
	// 1 SYN_SENT never was one.
	if got := c.LiveTCP(); got != 9 {
		t.Errorf("LiveTCP() = %d, want 9", got)
	}
}

func TestLiveTCP(t *testing.T) {
	tests := []struct {
		name string
		c    Counts
		want int
	}{
		{"empty", Counts{}, 0},
		{"udp only is not tcp", Counts{UDP: 5}, 0},
		{"established", Counts{TCP: [numTCPStates]int{TCPEstablished: 3}}, 3},
		{"half closed still carries data", Counts{TCP: [numTCPStates]int{TCPFinWait: 1, TCPCloseWait: 1, TCPLastAck: 1}}, 3},
		{"time wait and close are done", Counts{TCP: [numTCPStates]int{TCPTimeWait: 4, TCPClose: 2}}, 0},
		{"answered handshakes count", Counts{TCP: [numTCPStates]int{TCPSynRecv: 1, TCPSynSent2: 1}}, 2},
		{"an unanswered SYN is no connection", Counts{TCP: [numTCPStates]int{TCPSynSent: 3}}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.LiveTCP(); got != tt.want {
				t.Fatalf("LiveTCP() = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestGroupFilters(t *testing.T) {
	v6 := netip.MustParseAddr("fd01::5")
	tests := []struct {
		name    string
		filters []Filter
		want    []kernelFilter
		index   [][]int
	}{
		{
			name:    "one filter: everything goes to the kernel",
			filters: []Filter{{Proto: UDP, ReplySrc: ap(podA, 53), OrigDst: ap(vip, 53)}},
			want:    []kernelFilter{{replySrc: podA, replySrcPort: 53, proto: UDP, origDst: vip, origDstPort: 53}},
			index:   [][]int{{0}},
		},
		{
			name: "same pod, two ports: one dump by address and protocol",
			filters: []Filter{
				{Proto: TCP, ReplySrc: ap(podA, 8080)},
				{Proto: UDP, ReplySrc: ap(podB, 53)},
				{Proto: TCP, ReplySrc: ap(podA, 9090)},
			},
			want:  []kernelFilter{{replySrc: podA, proto: TCP}, {replySrc: podB, replySrcPort: 53, proto: UDP}},
			index: [][]int{{0, 2}, {1}},
		},
		{
			name: "same pod, two protocols: ports are dropped with the protocol",
			filters: []Filter{
				{Proto: TCP, ReplySrc: ap(podA, 53)},
				{Proto: UDP, ReplySrc: ap(podA, 53)},
			},
			want:  []kernelFilter{{replySrc: podA}},
			index: [][]int{{0, 1}},
		},
		{
			name: "orig dst kept only when shared",
			filters: []Filter{
				{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 80)},
				{Proto: TCP, ReplySrc: ap(podA, 8080), OrigDst: ap(vip, 443)},
				{Proto: TCP, ReplySrc: ap(v6, 8080)},
			},
			want:  []kernelFilter{{replySrc: podA, replySrcPort: 8080, proto: TCP, origDst: vip}, {replySrc: v6, replySrcPort: 8080, proto: TCP}},
			index: [][]int{{0, 1}, {2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set, err := NewFilterSet(0, tt.filters)
			if err != nil {
				t.Fatal(err)
			}
			groups := groupFilters(set)
			if len(groups) != len(tt.want) {
				t.Fatalf("got %d groups, want %d", len(groups), len(tt.want))
			}
			for i, g := range groups {
				if g.kf != tt.want[i] {
					t.Errorf("group %d kernel filter = %+v, want %+v", i, g.kf, tt.want[i])
				}
				if len(g.index) != len(tt.index[i]) {
					t.Fatalf("group %d index = %v, want %v", i, g.index, tt.index[i])
				}
				for j, idx := range g.index {
					if idx != tt.index[i][j] || g.set.filters[j] != tt.filters[idx] {
						t.Errorf("group %d member %d = filter %d, want %d", i, j, idx, tt.index[i][j])
					}
				}
			}
		})
	}
}
