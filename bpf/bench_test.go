package bpf_test

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

// benchBed: one pod network namespace holding the servers and one client
// process (loopback-equivalent: nothing leaves the namespace). The client
// moves between three cgroups from round to round, so that every path is
// timed from the same process (the same scheduler placement): the hooked
// pods cgroup, a sibling cgroup without hooks, and one with empty programs
// (the floor of the kernel's measurement);
// a steered VIP, a draining pod IP rewritten to the server, a second VIP
// behind 5,000 kube-proxy-style service rules in the namespace's nat OUTPUT
// chain, and a second server inside the pods cgroup (what the SYN observer
// sees). The kernel's BPF run-time statistics are on unless a benchmark
// turns them off (setStats).
type benchBed struct {
	node        *bed.Node
	pod         *bed.Pod
	plainCg     *bed.Cgroup
	emptyCg     *bed.Cgroup // empty programs attached: the measurement's floor
	dp          *bpf.Datapath
	emptyProgs  map[string]*ebpf.Program
	client      *bed.Proc
	srv         netip.AddrPort // TCP and UDP, outside the hooks
	srvObserved netip.AddrPort // TCP, inside the pods cgroup, draining
	vipSteer    netip.AddrPort
	vipIPT      netip.AddrPort
	podSteer    netip.AddrPort // a draining pod IP, rewritten to srv
	draining    bool
	stats       io.Closer // the kernel's run-time statistics, while on
}

// setStats turns the kernel's BPF run-time statistics on or off (as far as
// this process is concerned: another may hold them on). They cost every
// program invocation two clock reads, so a wall-clock comparison that must
// resolve a few hundred ns runs with them off.
func (bb *benchBed) setStats(b *testing.B, on bool) {
	b.Helper()
	switch {
	case on && bb.stats == nil:
		c, err := bpf.EnableRunTimeStats()
		if err != nil {
			b.Fatal(err)
		}
		bb.stats = c
	case !on && bb.stats != nil:
		if err := bb.stats.Close(); err != nil {
			b.Fatalf("turning the BPF run-time statistics off: %v", err)
		}
		bb.stats = nil
	}
}

func newBenchBed(b *testing.B) *benchBed { return newBenchBedWith(b, false) }

// newBenchBedWith builds the bench bed, with the socket hooks attached too
// if sockets.
func newBenchBedWith(b *testing.B, sockets bool) *benchBed {
	if r := bed.PrivilegedReason(); r != "" {
		b.Skip("SKIP: " + r)
	}
	feat, err := bpf.Probe()
	if err != nil {
		b.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	if sockets && !feat.Sockets {
		b.Skipf("SKIP: kernel cannot run the socket hooks: %s", feat.SocketsMissing)
	}
	bb := &benchBed{}
	bb.setStats(b, true)
	b.Cleanup(func() { bb.setStats(b, false) })
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
	emptyCg, err := tb.Cgroup.Child("emptyhooks")
	if err != nil {
		b.Fatal(err)
	}
	srvCg, err := tb.Cgroup.Child("server")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := bed.StartProc(pod.NS, srvCg, "serve", "srv", fmt.Sprintf("tcp:[::]:%d", podPort), fmt.Sprintf("udp:[::]:%d", podPort))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { srv.Kill() })
	observed, err := pod.Start("serve", "observed", fmt.Sprintf("tcp:[::]:%d", podPort+1))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { observed.Kill() })
	*bb = benchBed{
		stats:       bb.stats,
		node:        node,
		pod:         pod,
		plainCg:     plainCg,
		emptyCg:     emptyCg,
		srv:         netip.AddrPortFrom(pod.IP4, podPort),
		srvObserved: netip.AddrPortFrom(pod.IP4, podPort+1),
		vipSteer:    netip.MustParseAddrPort("10.96.0.10:80"),
		vipIPT:      netip.MustParseAddrPort("10.96.200.200:80"),
		// On the node's pod network but no pod's: unroutable if the hook
		// ever failed to rewrite it.
		podSteer: netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, 250}), podPort),
	}
	if bb.client, err = bed.StartProc(pod.NS, plainCg, "client"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bb.client.Kill() })
	bb.emptyProgs = attachEmpty(b, emptyCg)

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
	dp, err := bpf.Load(bpf.Options{PinDir: dir, Sockets: sockets})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { dp.Close() })
	if err := dp.Attach(node.Pods.Path); err != nil {
		b.Fatal(err)
	}
	bb.dp = dp
	bb.setDraining(b, true)
	// Warm up every path once (neighbour entries, conntrack, caches).
	for _, c := range []struct {
		cg *bed.Cgroup
		a  netip.AddrPort
	}{{plainCg, bb.srv}, {emptyCg, bb.srv}, {pod.Cgroup, bb.srv}, {pod.Cgroup, bb.vipSteer}, {pod.Cgroup, bb.podSteer}, {plainCg, bb.vipIPT}, {plainCg, bb.srvObserved}} {
		if _, err := bb.connect(c.cg, c.a, 500); err != nil {
			b.Fatal(err)
		}
	}
	return bb
}

// moveTo puts process pid into cgroup cg; the sockets it creates from then
// on belong to cg (a socket keeps the cgroup it was created in).
func moveTo(pid int, cg *bed.Cgroup) error {
	if err := os.WriteFile(filepath.Join(cg.Path, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("moving %d to %s: %w", pid, cg.Path, err)
	}
	return nil
}

// attachEmpty attaches programs that only return 1 at connect4, sendmsg4,
// recvmsg4 and ingress of cg. Their run time per invocation is the floor of
// the kernel's measurement (the statistics' own clock reads and the hook's
// dispatch): the hooks' figures are read against it.
func attachEmpty(b *testing.B, cg *bed.Cgroup) map[string]*ebpf.Program {
	out := map[string]*ebpf.Program{}
	for name, at := range map[string]ebpf.AttachType{
		"connect4": ebpf.AttachCGroupInet4Connect,
		"sendmsg4": ebpf.AttachCGroupUDP4Sendmsg,
		"recvmsg4": ebpf.AttachCGroupUDP4Recvmsg,
		"ingress":  ebpf.AttachCGroupInetIngress,
	} {
		typ := ebpf.CGroupSockAddr
		if at == ebpf.AttachCGroupInetIngress {
			typ = ebpf.CGroupSKB
		}
		p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type: typ, AttachType: at, License: "Dual BSD/GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
		})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { p.Close() })
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cg.Path, Attach: at, Program: p})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { l.Close() })
		out["empty_"+name] = p
	}
	return out
}

// drainState is what the maps hold while "something drains on the node":
// 1,000 unrelated draining endpoints (so lookups run against non-empty
// maps), the steered VIP (TCP and UDP), the draining pod IP, and the
// observed server.
func (bb *benchBed) drainState() ([]bpf.Backends, []bpf.Frontend, []bpf.Drain) {
	exp := time.Now().Add(time.Hour)
	var drains []bpf.Drain
	for i := 0; i < 1000; i++ {
		a := netip.AddrFrom4([4]byte{10, 244, 100 + byte(i/250), byte(i%250 + 1)})
		drains = append(drains, bpf.Drain{Key: bpf.EndpointKey{Addr: a, Port: podPort, Proto: bpf.TCP}, Service: 1, Expires: exp})
	}
	drains = append(drains,
		bpf.Drain{Key: bpf.EndpointKey{Addr: bb.podSteer.Addr(), Port: bb.podSteer.Port(), Proto: bpf.TCP}, Service: 1, Policy: bpf.PolicyRewrite, Expires: exp},
		bpf.Drain{Key: bpf.EndpointKey{Addr: bb.srvObserved.Addr(), Port: bb.srvObserved.Port(), Proto: bpf.TCP}, Policy: bpf.PolicyOff, Expires: exp},
	)
	backends := []bpf.Backends{
		{Service: 1, Backends: []netip.AddrPort{bb.srv}, Expires: exp},
		{Service: 2, Backends: []netip.AddrPort{bb.srv}, Expires: exp},
	}
	frontends := []bpf.Frontend{
		{Key: bpf.EndpointKey{Addr: bb.vipSteer.Addr(), Port: bb.vipSteer.Port(), Proto: bpf.TCP}, Service: 1, Expires: exp},
		{Key: bpf.EndpointKey{Addr: bb.vipSteer.Addr(), Port: bb.vipSteer.Port(), Proto: bpf.UDP}, Service: 2, Expires: exp},
	}
	return backends, frontends, drains
}

// setDraining writes the drain state, or deletes every entry so that the
// node is idle (the hooks' fast path).
func (bb *benchBed) setDraining(b *testing.B, on bool) {
	b.Helper()
	backends, frontends, drains := bb.drainState()
	var err error
	for _, x := range backends {
		if on {
			err = errors.Join(err, bb.dp.SetBackends(x))
		} else {
			err = errors.Join(err, bb.dp.DeleteBackends(x.Service))
		}
	}
	for _, x := range frontends {
		if on {
			err = errors.Join(err, bb.dp.UpsertFrontend(x))
		} else {
			err = errors.Join(err, bb.dp.DeleteFrontend(x.Key))
		}
	}
	for _, x := range drains {
		if on {
			err = errors.Join(err, bb.dp.UpsertDrain(x))
		} else {
			err = errors.Join(err, bb.dp.DeleteDrain(x.Key))
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	if got, err := bb.dp.Draining(); err != nil || got != on {
		b.Fatalf("draining flag %v (%v), want %v", got, err, on)
	}
	bb.draining = on
}

// programStats snapshots the kernel's run-time statistics by program.
func (bb *benchBed) programStats(b *testing.B) map[string]bpf.ProgramStat {
	b.Helper()
	st, err := bb.dp.ProgramStats()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]bpf.ProgramStat{}
	for _, s := range st {
		out[s.Name] = s
	}
	for name, p := range bb.emptyProgs {
		ps, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		out[name] = bpf.ProgramStat{Name: name, RunCount: ps.RunCount, RunTime: ps.Runtime}
	}
	return out
}

// kernelMetric is one program's ns per invocation over a sub-benchmark,
// reported under unit.
type kernelMetric struct {
	prog string
	unit string
}

// reportKernel reports each program's ns per invocation between the
// snapshots before and after, and returns them in the order of ms.
func reportKernel(b *testing.B, before, after map[string]bpf.ProgramStat, ms []kernelMetric) []float64 {
	b.Helper()
	var out []float64
	for _, m := range ms {
		n := after[m.prog].RunCount - before[m.prog].RunCount
		if n == 0 {
			b.Fatalf("%s: the kernel counted no invocation (run-time statistics off?)", m.prog)
		}
		d := after[m.prog].RunTime - before[m.prog].RunTime
		b.ReportMetric(float64(d)/float64(n), m.unit)
		out = append(out, float64(d)/float64(n))
	}
	return out
}

// connect runs n connect+close from the client, in cgroup cg, to a and
// returns the time per connect.
func (bb *benchBed) connect(cg *bed.Cgroup, a netip.AddrPort, n int) (time.Duration, error) {
	if err := moveTo(bb.client.Pid(), cg); err != nil {
		return 0, err
	}
	r, err := bb.client.Call(bed.Request{Op: "bench", Addr: a.String(), N: n})
	if err != nil {
		return 0, err
	}
	if r.OK != n {
		return 0, fmt.Errorf("bench to %s: %d/%d connected: %v", a, r.OK, n, r.Fails)
	}
	return r.Elapsed / time.Duration(n), nil
}

// benchPath is one way through the kernel: a socket created in cgroup cg
// (with draind's hooks, empty programs or none) talking to a.
type benchPath struct {
	name string
	cg   *bed.Cgroup
	a    netip.AddrPort
}

// pathBench says how a sub-benchmark of BenchmarkConnect or
// BenchmarkSendmsg times its paths.
type pathBench struct {
	proto      string // "tcp": connect + close; "udp": sendto + recvfrom round trips
	n          int    // operations per path in a block
	statBlocks int    // blocks with the kernel's statistics on
	// statBlock, if set, times path i in the blocks with the statistics
	// on instead of the interleaved blocks (BenchmarkConnect: fresh
	// sockets, one path at a time, as a client connects).
	statBlock func(i int)
	blocks    int    // wall-clock blocks (at least; see measureWithin)
	unit      string // of the time per operation: "ns/connect", "ns/datagram"
	progUnit  string // if set, the sum of the kernel metrics is reported under it
}

// comparePaths times paths[0] against each other path through the socket
// helper client and reports the figures. Every block, the helper makes each
// path's sockets in the path's cgroup (a socket keeps the cgroup it was
// created in; the moves are not timed) and runs pb.n operations per path in
// the order A B B A ... (interleave); blocks alternate the paths' order
// (which sockets are made first and go first), and a pair of blocks gives
// one ratio (measureWithin). First pb.statBlocks blocks with the kernel's
// run-time statistics on give the kernel metrics; then the wall-clock
// blocks run with them off (they add two clock reads to every invocation).
func (bb *benchBed) comparePaths(b *testing.B, client *sockProc, pb pathBench, paths []benchPath, kernel []kernelMetric) {
	b.Helper()
	names := make([]string, len(paths))
	for i, p := range paths {
		names[i] = p.name
	}
	block := func(reverse bool) (mean, p50 []float64) {
		order := make([]int, len(paths)) // place -> path
		for k := range order {
			order[k] = k
			if reverse {
				order[k] = len(paths) - 1 - k
			}
		}
		// New sockets for every block, so that whatever differs between
		// two sockets (their ports, where they hash) varies from block to
		// block instead of favouring one path for the whole run.
		req := sockReq{Op: "bench", Proto: pb.proto, Family: "4", N: pb.n}
		for k, i := range order {
			if err := moveTo(client.cmd.Process.Pid, paths[i].cg); err != nil {
				b.Fatal(err)
			}
			id := fmt.Sprintf("place%d", k)
			if pb.proto == "tcp" {
				client.call(b, sockReq{Op: "tcp_pool", ID: id, N: 20 + pb.n})
			} else {
				client.call(b, sockReq{Op: "udp_open", Family: "4", ID: id})
			}
			req.IDs = append(req.IDs, id)
			req.Addrs = append(req.Addrs, paths[i].a.String())
		}
		r := client.call(b, req)
		if len(r.Paths) != len(paths) {
			b.Fatalf("bench: %d paths timed, want %d", len(r.Paths), len(paths))
		}
		mean, p50 = make([]float64, len(paths)), make([]float64, len(paths))
		for k, i := range order {
			mean[i], p50[i] = float64(r.Paths[k].Mean), float64(r.Paths[k].Median)
		}
		return mean, p50
	}
	b.ResetTimer()
	bb.setStats(b, true)
	before := bb.programStats(b)
	if pb.statBlock != nil {
		interleave(pb.statBlocks, len(paths), func(i int) float64 { pb.statBlock(i); return 0 })
	} else {
		for n := range pb.statBlocks {
			block(n%2 == 1)
		}
	}
	after := bb.programStats(b)
	var sum float64
	for _, v := range reportKernel(b, before, after, kernel) {
		sum += v
	}
	if pb.progUnit != "" && len(kernel) > 0 {
		b.ReportMetric(sum, pb.progUnit)
	}
	bb.setStats(b, false)
	before = bb.programStats(b)
	means, p50s := measureWithin(max(b.N/pb.n, pb.blocks), names, block)
	after = bb.programStats(b)
	b.StopTimer()
	bb.setStats(b, true)
	for _, m := range kernel {
		if after[m.prog].RunTime != before[m.prog].RunTime {
			b.Logf("the BPF run-time statistics stayed on during the wall-clock blocks (another process holds them on): the ratios include their cost")
			break
		}
	}
	means.report(b, pb.unit, "")
	p50s.report(b, "p50-"+pb.unit, "p50-")
}

// BenchmarkConnect measures TCP connect+close through each path against
// the no-hook baseline (and hook_steer against iptables_5000 too, hook_idle
// against the empty programs) with comparePaths: connects of the paths take
// turns one by one (connect + close of sockets made in the path's cgroup
// before the block; making them is not timed), and the figures are the
// medians of the ratios of pairs of blocks, of the mean connect (x-...) and
// of the median one (p50-x-...), with their 95 % confidence intervals. The
// baseline is measured against itself, which shows what the harness
// resolves. The hooks' own cost comes from the kernel's run-time
// statistics of the programs over -bench.rounds rounds of 1,000 connects
// per path, each on a fresh socket: ns per invocation of connect4 when
// nothing drains (idle), when something else drains (miss), on a ClusterIP
// steer and on a pod-IP rewrite, and of the SYN observer on the idle node
// and on the packets of a draining endpoint.
func BenchmarkConnect(b *testing.B) {
	bb := newBenchBed(b)
	client := startSockHelper(b, bb.pod.NS, bb.plainCg)
	hooked := bb.pod.Cgroup
	baseline := benchPath{"baseline", bb.plainCg, bb.srv}
	empty := benchPath{"empty_prog", bb.emptyCg, bb.srv}
	ipt := benchPath{"iptables_5000", bb.plainCg, bb.vipIPT}
	cases := []struct {
		path     benchPath
		compare  []benchPath
		draining bool
		kernel   []kernelMetric
	}{
		{baseline, []benchPath{baseline}, false, nil},
		{empty, []benchPath{baseline}, false,
			[]kernelMetric{{"empty_connect4", "empty-ns/invocation"}, {"empty_ingress", "observe-empty-ns/invocation"}}},
		{benchPath{"hook_idle", hooked, bb.srv}, []benchPath{baseline, empty}, false,
			[]kernelMetric{{"connect4", "idle-ns/invocation"}, {"observe_ingress", "observe-idle-ns/invocation"}}},
		{benchPath{"hook_miss", hooked, bb.srv}, []benchPath{baseline}, true,
			[]kernelMetric{{"connect4", "miss-ns/invocation"}, {"observe_ingress", "observe-ns/invocation"}}},
		{benchPath{"hook_steer", hooked, bb.vipSteer}, []benchPath{baseline, ipt}, true,
			[]kernelMetric{{"connect4", "clusterip-ns/invocation"}}},
		{benchPath{"hook_podip", hooked, bb.podSteer}, []benchPath{baseline}, true,
			[]kernelMetric{{"connect4", "podip-ns/invocation"}}},
		{ipt, []benchPath{baseline}, true, nil},
		{benchPath{"observe_draining", bb.plainCg, bb.srvObserved}, []benchPath{baseline}, true,
			[]kernelMetric{{"observe_ingress", "observe-draining-ns/invocation"}}},
	}
	for _, c := range cases {
		b.Run(c.path.name, func(b *testing.B) {
			if bb.draining != c.draining {
				bb.setDraining(b, c.draining)
				if _, err := bb.connect(c.path.cg, c.path.a, 200); err != nil { // warm-up
					b.Fatal(err)
				}
			}
			paths := append([]benchPath{c.path}, c.compare...)
			// The kernel figures come from rounds of 1,000 connects per
			// path, each on a socket made just before (the pooled sockets
			// of the interleaved blocks are made long before they
			// connect, and the programs' figures rise with them cold).
			statBlock := func(i int) {
				if _, err := bb.connect(paths[i].cg, paths[i].a, 1000); err != nil {
					b.Fatal(err)
				}
			}
			pb := pathBench{proto: "tcp", n: 100, statBlocks: *benchRounds, statBlock: statBlock, blocks: *benchConnectBlocks, unit: "ns/connect"}
			bb.comparePaths(b, client, pb, paths, c.kernel)
		})
	}
}

// BenchmarkSendmsg measures UDP request/response round trips (sendto +
// recvfrom on unconnected sockets) with no hook (baseline), with empty
// programs at the same hooks (empty_prog: the cgroup-BPF dispatch's own
// cost), through the hooks with nothing draining (hook_idle) and with
// something else draining (hook_miss), and steered to a backend with the
// reply's source translated back (hook_steer).
//
// The hooks cost a few hundred ns in a round trip of tens of µs, and the
// noise of a shared machine comes in bursts far longer than a round trip,
// so comparePaths has the paths take turns round trip by round trip. A
// pair of blocks gives a ratio of the paths' mean round trips (x-...) and
// one of their medians (p50-x-...); the figures are the medians over the
// pairs with their 95 % confidence intervals. The hooks add about the same
// to every round trip, so both ratios see them; the median's is the
// tighter, as a millisecond's stall now and then moves a block's mean but
// hardly its median. The baseline is measured against itself (what the
// harness resolves) and hook_idle against the empty programs too
// (x-empty_prog: draind's programs' logic alone). The kernel's statistics
// give ns per invocation of sendmsg4, recvmsg4 and the ingress observer
// (which sees the reply) and their sum per round trip (prog-ns/datagram);
// each includes the statistics' own clock reads, the floor that an empty
// program's figure shows.
func BenchmarkSendmsg(b *testing.B) {
	bb := newBenchBed(b)
	client := startSockHelper(b, bb.pod.NS, bb.plainCg)
	hooked := bb.pod.Cgroup
	baseline := benchPath{"baseline", bb.plainCg, bb.srv}
	empty := benchPath{"empty_prog", bb.emptyCg, bb.srv}
	cases := []struct {
		path     benchPath
		compare  []benchPath
		draining bool
		kernel   []kernelMetric
	}{
		{baseline, []benchPath{baseline}, false, nil},
		{empty, []benchPath{baseline}, false,
			[]kernelMetric{{"empty_sendmsg4", "sendmsg4-empty-ns/invocation"}, {"empty_recvmsg4", "recvmsg4-empty-ns/invocation"}, {"empty_ingress", "ingress-empty-ns/invocation"}}},
		{benchPath{"hook_idle", hooked, bb.srv}, []benchPath{baseline, empty}, false,
			[]kernelMetric{{"sendmsg4", "sendmsg4-idle-ns/invocation"}, {"recvmsg4", "recvmsg4-idle-ns/invocation"}, {"observe_ingress", "ingress-idle-ns/invocation"}}},
		{benchPath{"hook_miss", hooked, bb.srv}, []benchPath{baseline}, true,
			[]kernelMetric{{"sendmsg4", "sendmsg4-miss-ns/invocation"}, {"recvmsg4", "recvmsg4-miss-ns/invocation"}, {"observe_ingress", "ingress-miss-ns/invocation"}}},
		{benchPath{"hook_steer", hooked, bb.vipSteer}, []benchPath{baseline}, true,
			[]kernelMetric{{"sendmsg4", "sendmsg4-steer-ns/invocation"}, {"recvmsg4", "recvmsg4-steer-ns/invocation"}, {"observe_ingress", "ingress-steer-ns/invocation"}}},
	}
	pb := pathBench{proto: "udp", n: *benchDatagrams, statBlocks: 20, blocks: *benchUDPBlocks, unit: "ns/datagram", progUnit: "prog-ns/datagram"}
	for _, c := range cases {
		b.Run(c.path.name, func(b *testing.B) {
			if bb.draining != c.draining {
				bb.setDraining(b, c.draining)
			}
			bb.comparePaths(b, client, pb, append([]benchPath{c.path}, c.compare...), c.kernel)
		})
	}
}

var (
	benchRounds        = flag.Int("bench.rounds", 5, "rounds of 1,000 connects per path with the kernel's statistics on in BenchmarkConnect (the kernel figures; CI runs a short form)")
	benchConnectBlocks = flag.Int("bench.connect.blocks", 40, "blocks of 100 interleaved connects per path per sub-benchmark in BenchmarkConnect (the ratios; at least, and at least a second; CI runs a short form)")
	benchUDPBlocks     = flag.Int("bench.udp.blocks", 120, "blocks per sub-benchmark in BenchmarkSendmsg (at least; and at least a second)")
	benchDatagrams     = flag.Int("bench.udp.datagrams", 250, "round trips per path in a block of BenchmarkSendmsg")
)
