package bpf_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/draind/draind/bpf"
)

// BenchmarkSocketHooks measures what the socket hooks (sock_ops, cgroup_skb
// egress) add to TCP connect+close, in blocks of 1,000 against the no-hook
// baseline in A B B A order (measure; the baseline against itself shows
// what that resolves): the client's own connections with nothing gone
// (active_idle: the one flag read and callback request per connection) and
// with gone entries present that do not match (active_gone: a timestamp per
// connection), and connections a server in the pods cgroup accepts
// (passive: counting and its close). The kernel's run-time statistics give
// the hooks' own cost per connection: every sock_ops invocation of one
// connection (it runs for several callbacks) summed, and the egress program
// per packet.
func BenchmarkSocketHooks(b *testing.B) {
	bb := newBenchBedWith(b, true)
	hooked := bb.pod.Cgroup
	baseline := benchPath{"baseline", bb.plainCg, bb.srv}
	var gone []netip.Addr
	for i := 0; i < 1000; i++ {
		gone = append(gone, netip.AddrFrom4([4]byte{10, 244, 200 + byte(i/250), byte(i%250 + 1)}))
	}
	setGone := func(b *testing.B, on bool) {
		for _, a := range gone {
			var err error
			if on {
				err = bb.dp.UpsertGonePeer(bpf.GonePeer{Addr: a, GoneAt: time.Now(), Expires: time.Now().Add(time.Hour)})
			} else {
				err = bb.dp.DeleteGonePeer(a)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if got, err := bb.dp.Gone(); err != nil || got != on {
			b.Fatalf("gone flag %v (%v), want %v", got, err, on)
		}
	}
	bb.setDraining(b, false)
	// The floor: empty sock_ops and egress programs on their own cgroup.
	floorCg, err := bb.node.Bed.Cgroup.Child("emptysockhooks")
	if err != nil {
		b.Fatal(err)
	}
	for name, at := range map[string]ebpf.AttachType{"empty_sockops": ebpf.AttachCGroupSockOps, "empty_egress": ebpf.AttachCGroupInetEgress} {
		typ := ebpf.SockOps
		if at == ebpf.AttachCGroupInetEgress {
			typ = ebpf.CGroupSKB
		}
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: typ, AttachType: at, License: "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		l, err := link.AttachCgroup(link.CgroupOptions{Path: floorCg.Path, Attach: at, Program: p})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		bb.emptyProgs[name] = p
	}
	cases := []struct {
		path benchPath
		gone bool
	}{
		{baseline, false},
		{benchPath{"empty_progs", floorCg, bb.srv}, false},
		{benchPath{"active_idle", hooked, bb.srv}, false},
		{benchPath{"active_gone", hooked, bb.srv}, true},
		// The server of srvObserved runs in the pods cgroup: it accepts.
		{benchPath{"passive", bb.plainCg, bb.srvObserved}, false},
	}
	isGone := false
	for _, c := range cases {
		b.Run(c.path.name, func(b *testing.B) {
			if c.gone != isGone {
				setGone(b, c.gone)
				isGone = c.gone
			}
			if _, err := bb.connect(c.path.cg, c.path.a, 200); err != nil { // warm-up
				b.Fatal(err)
			}
			const chunk = 1000
			rounds := max(b.N/chunk, 15)
			paths := []benchPath{c.path, baseline} // the baseline against itself: what the harness resolves
			before := bb.programStats(b)
			b.ResetTimer()
			m := measure(rounds, []string{paths[0].name, paths[1].name}, func(i int) float64 {
				d, err := bb.connect(paths[i].cg, paths[i].a, chunk)
				if err != nil {
					b.Fatal(err)
				}
				return float64(d)
			})
			b.StopTimer()
			after := bb.programStats(b)
			conns := float64(rounds * chunk)
			if c.path.name != baseline.name {
				progs := []string{"sockops", "egress"}
				if c.path.name == "empty_progs" {
					progs = []string{"empty_sockops", "empty_egress"}
				}
				for _, p := range progs {
					dr := after[p].RunTime - before[p].RunTime
					dn := after[p].RunCount - before[p].RunCount
					if dn == 0 {
						b.Fatalf("%s: the kernel counted no invocation", p)
					}
					b.ReportMetric(float64(dr)/conns, p+"-ns/connection")
					b.ReportMetric(float64(dn)/conns, p+"-runs/connection")
				}
			}
			m.report(b, "ns/connect", "")
		})
	}
}
