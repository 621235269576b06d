package bpf_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

// benchBed: one pod network namespace holding the server and two clients
// (loopback-equivalent: the handshake never leaves the namespace), one
// client in the hooked pods cgroup and one in a sibling cgroup without
// hooks; a steered VIP, and a second VIP behind 5,000 kube-proxy-style
// service rules in the namespace's nat OUTPUT chain.
type benchBed struct {
	node          *bed.Node
	hooked, plain *bed.Proc
	srv           netip.AddrPort
	vipSteer      netip.AddrPort
	vipIPT        netip.AddrPort
}

func newBenchBed(b *testing.B) *benchBed {
	if r := bed.PrivilegedReason(); r != "" {
		b.Skip("SKIP: " + r)
	}
	if _, err := bpf.Probe(); err != nil {
		b.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	tb, err := bed.New()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tb.Close() })
	node, err := tb.AddNode("n0")
	if err != nil {
		b.Fatal(err)
	}
	pod, err := node.AddPod("bench")
	if err != nil {
		b.Fatal(err)
	}
	plainCg, err := tb.Cgroup.Child("nohooks")
	if err != nil {
		b.Fatal(err)
	}
	srvCg, err := tb.Cgroup.Child("server")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := bed.StartProc(pod.NS, srvCg, "serve", "srv", fmt.Sprintf("tcp:[::]:%d", podPort))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Kill() })
	bb := &benchBed{
		node:     node,
		srv:      netip.AddrPortFrom(pod.IP4, podPort),
		vipSteer: netip.MustParseAddrPort("10.96.0.10:80"),
		vipIPT:   netip.MustParseAddrPort("10.96.200.200:80"),
	}
	if bb.hooked, err = pod.Start("client"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.hooked.Kill() })
	if bb.plain, err = bed.StartProc(pod.NS, plainCg, "client"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.plain.Kill() })

	// 5,000 services ahead of the target in one KUBE-SERVICES-like chain,
	// as kube-proxy's iptables mode lays them out; loaded in one restore.
	var rules strings.Builder
	rules.WriteString("*nat\n:DB-SERVICES - [0:0]\n:DB-SVC-TARGET - [0:0]\n")
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&rules, ":DB-SVC-%d - [0:0]\n", i)
	}
	rules.WriteString("-A OUTPUT -j DB-SERVICES\n")
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&rules, "-A DB-SERVICES -d 10.97.%d.%d/32 -p tcp -m tcp --dport 80 -j DB-SVC-%d\n", i/250, i%250+1, i)
		fmt.Fprintf(&rules, "-A DB-SVC-%d -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.250.%d.%d:%d\n", i, i/250, i%250+1, podPort)
		fmt.Fprintf(&rules, "-A DB-SVC-%d -p tcp -j DNAT --to-destination 10.251.%d.%d:%d\n", i, i/250, i%250+1, podPort)
	}
	fmt.Fprintf(&rules, "-A DB-SERVICES -d %s/32 -p tcp -m tcp --dport 80 -j DB-SVC-TARGET\n", bb.vipIPT.Addr())
	fmt.Fprintf(&rules, "-A DB-SVC-TARGET -p tcp -j DNAT --to-destination %s\nCOMMIT\n", bb.srv)
	file := filepath.Join(b.TempDir(), "rules")
	if err := os.WriteFile(file, []byte(rules.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	if _, err := pod.NS.Run("iptables-restore", "-w", "--noflush", file); err != nil {
		b.Fatal(err)
	}

	dir, unmount, err := bed.NewBPFFS()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unmount() })
	dp, err := bpf.Load(bpf.Options{PinDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close() })
	if err := dp.Attach(node.Pods.Path); err != nil {
		b.Fatal(err)
	}
	exp := time.Now().Add(time.Hour)
	// Some unrelated draining state, so lookups run against non-empty maps.
	for i := 0; i < 1000; i++ {
		a := netip.AddrFrom4([4]byte{10, 244, 100 + byte(i/250), byte(i%250 + 1)})
		if err := dp.UpsertDrain(bpf.Drain{Key: bpf.EndpointKey{Addr: a, Port: podPort, Proto: bpf.TCP}, Service: 1, Expires: exp}); err != nil {
			b.Fatal(err)
		}
	}
	if err := dp.SetBackends(bpf.Backends{Service: 1, Backends: []netip.AddrPort{bb.srv}, Expires: exp}); err != nil {
		b.Fatal(err)
	}
	if err := dp.UpsertFrontend(bpf.Frontend{Key: bpf.EndpointKey{Addr: bb.vipSteer.Addr(), Port: 80, Proto: bpf.TCP}, Service: 1, Expires: exp}); err != nil {
		b.Fatal(err)
	}
	// Warm up every path once (neighbour entries, conntrack, caches).
	for _, c := range []struct {
		p *bed.Proc
		a netip.AddrPort
	}{{bb.plain, bb.srv}, {bb.hooked, bb.srv}, {bb.hooked, bb.vipSteer}, {bb.plain, bb.vipIPT}} {
		if _, err := bb.connect(c.p, c.a, 500); err != nil {
			b.Fatal(err)
		}
	}
	return bb
}

// connect runs n connect+close from p to a and returns the time per connect.
func (bb *benchBed) connect(p *bed.Proc, a netip.AddrPort, n int) (time.Duration, error) {
	r, err := p.Call(bed.Request{Op: "bench", Addr: a.String(), N: n})
	if err != nil {
		return 0, err
	}
	if r.OK != n {
		return 0, fmt.Errorf("bench to %s: %d/%d connected: %v", a, r.OK, n, r.Fails)
	}
	return r.Elapsed / time.Duration(n), nil
}

type connectPath struct {
	name string
	p    *bed.Proc
	a    netip.AddrPort
}

// BenchmarkConnect measures TCP connect+close through each path, each one
// interleaved in short rounds with the no-hook baseline (and hook_steer with
// iptables_5000) so that machine noise hits both sides alike; it reports the
// median per-connect time and the median of the per-round ratios.
func BenchmarkConnect(b *testing.B) {
	bb := newBenchBed(b)
	baseline := connectPath{"baseline", bb.plain, bb.srv}
	ipt := connectPath{"iptables_5000", bb.plain, bb.vipIPT}
	cases := []struct {
		path    connectPath
		compare []connectPath
	}{
		{baseline, nil},
		{connectPath{"hook_idle", bb.hooked, bb.srv}, []connectPath{baseline}},
		{connectPath{"hook_steer", bb.hooked, bb.vipSteer}, []connectPath{baseline, ipt}},
		{ipt, []connectPath{baseline}},
	}
	for _, c := range cases {
		b.Run(c.path.name, func(b *testing.B) {
			const chunk = 1000
			rounds := max(b.N/chunk, 15)
			var own []float64
			ratios := make([][]float64, len(c.compare))
			others := make([][]float64, len(c.compare))
			b.ResetTimer()
			for r := 0; r < rounds; r++ {
				d, err := bb.connect(c.path.p, c.path.a, chunk)
				if err != nil {
					b.Fatal(err)
				}
				own = append(own, float64(d))
				for i, o := range c.compare {
					od, err := bb.connect(o.p, o.a, chunk)
					if err != nil {
						b.Fatal(err)
					}
					others[i] = append(others[i], float64(od))
					ratios[i] = append(ratios[i], float64(d)/float64(od))
				}
			}
			b.StopTimer()
			b.ReportMetric(median(own), "ns/connect")
			for i, o := range c.compare {
				b.ReportMetric(median(others[i]), o.name+"-ns/connect")
				b.ReportMetric(median(ratios[i]), "x-"+o.name)
			}
		})
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
