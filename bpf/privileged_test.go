package bpf_test

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
)

const podPort = 8080

// fixture is one node with three server pods, a client pod, and the
// datapath attached to the node's pods cgroup. A kube-proxy-style iptables
// ClusterIP spreads over the three pods for each family.
type fixture struct {
	t      *testing.T
	bed    *bed.Bed
	node   *bed.Node
	pods   []*bed.Pod
	srv    []*bed.Proc
	cli    *bed.Pod
	client *bed.Proc
	dp     *bpf.Datapath
	pinDir string
	vip    map[bool]netip.AddrPort // by v6
	// sockets loads the socket hooks too (bpf.Options.Sockets).
	sockets bool
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, false) }

func newFixtureWith(t *testing.T, sockets bool) *fixture {
	t.Helper()
	bed.RequirePrivileged(t)
	feat, err := bpf.Probe()
	if err != nil {
		t.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	if sockets && !feat.Sockets {
		t.Skipf("SKIP: kernel cannot run the socket hooks: %s", feat.SocketsMissing)
	}
	f := &fixture{t: t, sockets: sockets, vip: map[bool]netip.AddrPort{
		false: netip.MustParseAddrPort("10.96.0.10:80"),
		true:  netip.MustParseAddrPort("[fd00:96::10]:80"),
	}}
	b, err := bed.New()
	if err != nil {
		t.Fatal(err)
	}
	f.bed = b
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing bed: %v", err)
		}
	})
	if f.node, err = b.AddNode("n0"); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		p, err := f.node.AddPod(fmt.Sprintf("srv%d", i))
		if err != nil {
			t.Fatal(err)
		}
		s, err := p.Start("serve", p.Name, fmt.Sprintf("tcp:[::]:%d", podPort), fmt.Sprintf("udp:[::]:%d", podPort))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Kill() })
		f.pods = append(f.pods, p)
		f.srv = append(f.srv, s)
	}
	cli, err := f.node.AddPod("cli")
	if err != nil {
		t.Fatal(err)
	}
	f.cli = cli
	if f.client, err = cli.Start("client"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.client.Kill() })
	for _, v6 := range []bool{false, true} {
		c, err := bed.NewClusterIP(f.node.NS, f.vip[v6], "tcp", f.backends(v6, 0, 1, 2))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	dir, unmount, err := bed.NewBPFFS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(); err != nil {
			t.Errorf("unmounting bpffs: %v", err)
		}
	})
	f.pinDir = dir
	f.load()
	return f
}

func (f *fixture) load() {
	f.t.Helper()
	dp, err := bpf.Load(bpf.Options{PinDir: f.pinDir, Sockets: f.sockets})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := dp.Attach(f.node.Pods.Path); err != nil {
		dp.Close()
		f.t.Fatal(err)
	}
	f.dp = dp
	f.t.Cleanup(func() { dp.Close() })
}

func (f *fixture) backends(v6 bool, idx ...int) []netip.AddrPort {
	var out []netip.AddrPort
	for _, i := range idx {
		out = append(out, netip.AddrPortFrom(f.pods[i].Addr(v6), podPort))
	}
	return out
}

func (f *fixture) podKey(i int, v6 bool) bpf.EndpointKey {
	return bpf.EndpointKey{Addr: f.pods[i].Addr(v6), Port: podPort, Proto: bpf.TCP}
}

func (f *fixture) vipKey(v6 bool) bpf.EndpointKey {
	return bpf.EndpointKey{Addr: f.vip[v6].Addr(), Port: f.vip[v6].Port(), Proto: bpf.TCP}
}

// drainFirst makes srv1 draining for service-port 1 of the family, with
// srv2 and srv3 selectable and the VIP a steered frontend.
func (f *fixture) drainFirst(v6 bool, policy bpf.Policy, ttl time.Duration) {
	f.t.Helper()
	exp := time.Now().Add(ttl)
	svc := bpf.ServicePortID(1)
	if v6 {
		svc = 2
	}
	must(f.t, f.dp.SetBackends(bpf.Backends{Service: svc, Backends: f.backends(v6, 1, 2), Expires: exp}))
	must(f.t, f.dp.UpsertFrontend(bpf.Frontend{Key: f.vipKey(v6), Service: svc, Expires: exp}))
	must(f.t, f.dp.UpsertDrain(bpf.Drain{Key: f.podKey(0, v6), Service: svc, Policy: policy, Expires: exp}))
}

func (f *fixture) dial(c *bed.Proc, addr netip.AddrPort, n int) bed.Response {
	f.t.Helper()
	r, err := c.Call(bed.Request{Op: "dial", Addr: addr.String(), N: n})
	if err != nil {
		f.t.Fatal(err)
	}
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func families(t *testing.T, fn func(t *testing.T, v6 bool)) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) { fn(t, v6) })
	}
}

func counter(t *testing.T, dp *bpf.Datapath, o bpf.Outcome, v6 bool) uint64 {
	t.Helper()
	c, err := dp.Counters()
	must(t, err)
	fam := bpf.IPv4
	if v6 {
		fam = bpf.IPv6
	}
	return c.Get(o, fam)
}

func TestPrivilegedClusterIPSteering(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		const n = 300
		// No draining entry: the hook changes nothing, iptables spreads.
		r := f.dial(f.client, f.vip[v6], n)
		if r.OK != n {
			t.Fatalf("without a drain: %d/%d connections succeeded: %v", r.OK, n, r.Fails)
		}
		for _, p := range []string{"srv1", "srv2", "srv3"} {
			if r.By[p] == 0 {
				t.Errorf("without a drain, kube-proxy's DNAT should reach %s too: %v", p, r.By)
			}
		}
		if got := counter(t, f.dp, bpf.OutSteeredClusterIP, v6); got != 0 {
			t.Errorf("steered %d connections with nothing draining", got)
		}

		f.drainFirst(v6, bpf.PolicyRewrite, time.Minute)
		r = f.dial(f.client, f.vip[v6], n)
		if r.OK != n {
			t.Fatalf("while draining: %d/%d connections succeeded: %v", r.OK, n, r.Fails)
		}
		if r.By["srv1"] != 0 {
			t.Errorf("%d of %d new connections reached the draining srv1", r.By["srv1"], n)
		}
		if r.By["srv2"] < n/5 || r.By["srv3"] < n/5 {
			t.Errorf("connections not spread over the selectable backends: %v", r.By)
		}
		if got := counter(t, f.dp, bpf.OutSteeredClusterIP, v6); got != n {
			t.Errorf("steered_clusterip = %d, want %d", got, n)
		}
	})
}

func TestPrivilegedPodIPPolicies(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		const n = 50

		f.drainFirst(v6, bpf.PolicyRewrite, time.Minute)
		r := f.dial(f.client, pod, n)
		if r.OK != n || r.By["srv1"] != 0 || r.By["srv2"]+r.By["srv3"] != n {
			t.Errorf("rewrite: want all %d on srv2/srv3, got %v fails %v", n, r.By, r.Fails)
		}
		st, err := f.dp.DrainStats(f.podKey(0, v6))
		must(t, err)
		if st.Steered != n {
			t.Errorf("rewrite: stats.Steered = %d, want %d", st.Steered, n)
		}

		f.drainFirst(v6, bpf.PolicyRefuse, time.Minute)
		start := time.Now()
		r = f.dial(f.client, pod, n)
		if r.OK != 0 || r.Fails[refusal(t)] != n {
			t.Errorf("refuse: want %d refusals, got ok=%d fails=%v", n, r.OK, r.Fails)
		}
		// "Fails fast": no SYN is ever sent, so not one retransmission
		// timeout (1 s) can have passed for all n of them (emulated: far
		// less than one per refusal).
		if el := time.Since(start); el > bed.Slow(time.Second) {
			t.Errorf("refuse: %d refusals took %v", n, el)
		}
		if got := counter(t, f.dp, bpf.OutRefused, v6); got != n {
			t.Errorf("refused counter = %d, want %d", got, n)
		}

		f.drainFirst(v6, bpf.PolicyOff, time.Minute)
		r = f.dial(f.client, pod, n)
		if r.By["srv1"] != n {
			t.Errorf("off: want all %d on srv1, got %v fails %v", n, r.By, r.Fails)
		}
		if got := counter(t, f.dp, bpf.OutPassOff, v6); got != n {
			t.Errorf("pass_off counter = %d, want %d", got, n)
		}
	})
}

func TestPrivilegedExistingConnectionSurvives(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		if _, err := f.client.Call(bed.Request{Op: "open", ID: "c", Addr: pod.String()}); err != nil {
			t.Fatal(err)
		}
		for _, policy := range []bpf.Policy{bpf.PolicyRewrite, bpf.PolicyRefuse} {
			f.drainFirst(v6, policy, time.Minute)
			for i := 0; i < 3; i++ {
				r, err := f.client.Call(bed.Request{Op: "req", ID: "c"})
				if err != nil || r.Server != "srv1" {
					t.Fatalf("%v: request %d on the pre-drain connection: server %q, %v", policy, i, r.Server, err)
				}
			}
		}
	})
}

func TestPrivilegedFailOpen(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		pod := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		const n = 60

		// Expired entries steer nothing and are counted.
		f.drainFirst(v6, bpf.PolicyRefuse, -time.Second)
		if r := f.dial(f.client, pod, n); r.By["srv1"] != n {
			t.Errorf("expired drain: want all %d on srv1, got %v %v", n, r.By, r.Fails)
		}
		if r := f.dial(f.client, f.vip[v6], n); r.OK != n || r.By["srv1"] == 0 {
			t.Errorf("expired frontend: want iptables spreading incl. srv1, got %v %v", r.By, r.Fails)
		}
		if got := counter(t, f.dp, bpf.OutExpired, v6); got != 2*n {
			t.Errorf("expired counter = %d, want %d", got, 2*n)
		}

		// No selectable backend: untouched and counted.
		svc := bpf.ServicePortID(1)
		if v6 {
			svc = 2
		}
		exp := time.Now().Add(time.Minute)
		must(t, f.dp.SetBackends(bpf.Backends{Service: svc, Expires: exp}))
		must(t, f.dp.UpsertFrontend(bpf.Frontend{Key: f.vipKey(v6), Service: svc, Expires: exp}))
		must(t, f.dp.UpsertDrain(bpf.Drain{Key: f.podKey(0, v6), Service: svc, Policy: bpf.PolicyRewrite, Expires: exp}))
		if r := f.dial(f.client, pod, n); r.By["srv1"] != n {
			t.Errorf("no backend, pod IP: want all %d on srv1, got %v %v", n, r.By, r.Fails)
		}
		if r := f.dial(f.client, f.vip[v6], n); r.OK != n || r.By["srv1"] == 0 {
			t.Errorf("no backend, VIP: want iptables spreading incl. srv1, got %v %v", r.By, r.Fails)
		}
		if got := counter(t, f.dp, bpf.OutNoBackendPodIP, v6); got != n {
			t.Errorf("no_backend_podip = %d, want %d", got, n)
		}
		if got := counter(t, f.dp, bpf.OutNoBackendClusterIP, v6); got != n {
			t.Errorf("no_backend_clusterip = %d, want %d", got, n)
		}

		// Do-not-steer frontends pass and are counted.
		must(t, f.dp.SetBackends(bpf.Backends{Service: svc, Backends: f.backends(v6, 1, 2), Expires: exp}))
		must(t, f.dp.UpsertFrontend(bpf.Frontend{Key: f.vipKey(v6), Service: svc, NoSteer: true, Expires: exp}))
		if r := f.dial(f.client, f.vip[v6], n); r.OK != n || r.By["srv1"] == 0 {
			t.Errorf("no-steer frontend: want iptables spreading incl. srv1, got %v %v", r.By, r.Fails)
		}
		if got := counter(t, f.dp, bpf.OutPassNoSteer, v6); got != n {
			t.Errorf("pass_no_steer = %d, want %d", got, n)
		}
	})
}

func TestPrivilegedOutsideCgroupNotSteered(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		// The kubelet's place: the node's namespace, outside the pods cgroup.
		kubelet, err := bed.StartProc(f.node.NS, f.bed.Cgroup, "client")
		must(t, err)
		defer kubelet.Kill()
		pod := netip.AddrPortFrom(f.pods[0].Addr(v6), podPort)
		f.drainFirst(v6, bpf.PolicyRefuse, time.Minute)
		const n = 30
		if r := f.dial(kubelet, pod, n); r.By["srv1"] != n {
			t.Errorf("outside the pods cgroup: want all %d probes on srv1, got %v %v", n, r.By, r.Fails)
		}
		if r := f.dial(kubelet, f.vip[v6], n); r.By["srv1"] == 0 {
			t.Errorf("outside the pods cgroup the VIP must stay kube-proxy's: %v %v", r.By, r.Fails)
		}
		// The same dial from a pod is refused: the entry is live.
		if r := f.dial(f.client, pod, 1); r.Fails[refusal(t)] != 1 {
			t.Errorf("control: a pod's dial should be refused, got %v %v", r.By, r.Fails)
		}
	})
}

func TestPrivilegedRestartKeepsSteering(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		f.drainFirst(v6, bpf.PolicyRewrite, time.Minute)
		_, err := f.client.Call(bed.Request{Op: "loop_start", ID: "l", Addr: f.vip[v6].String(), Interval: time.Millisecond})
		must(t, err)
		// Let the loop run, then "restart" draind several times under it.
		for i := 0; i < 3; i++ {
			time.Sleep(50 * time.Millisecond) // traffic before each restart
			must(t, f.dp.Close())
			time.Sleep(50 * time.Millisecond) // traffic while no draind runs
			f.load()
			// Adopted state is visible to the new instance.
			d, err := f.dp.Dump()
			must(t, err)
			if len(d.Drains) != 1 || len(d.Frontends) != 1 || len(d.Backends) != 1 || len(d.Backends[0].Backends) != 2 {
				t.Fatalf("restart %d: adopted state %+v", i, d)
			}
		}
		time.Sleep(50 * time.Millisecond)
		r, err := f.client.Call(bed.Request{Op: "loop_stop", ID: "l"})
		must(t, err)
		if r.OK < 10 || len(r.Fails) != 0 { // a slow machine dials less often; none may fail
			t.Errorf("client loop across restarts: ok=%d fails=%v", r.OK, r.Fails)
		}
		if r.By["srv1"] != 0 {
			t.Errorf("%d of %d connections reached the draining backend across restarts", r.By["srv1"], r.OK)
		}
	})
}

func TestPrivilegedSYNObserver(t *testing.T) {
	families(t, func(t *testing.T, v6 bool) {
		f := newFixture(t)
		f.drainFirst(v6, bpf.PolicyOff, time.Minute) // let dials reach srv1
		const n, m = 37, 23
		if r := f.dial(f.client, netip.AddrPortFrom(f.pods[0].Addr(v6), podPort), n); r.By["srv1"] != n {
			t.Fatalf("dials to srv1: %v %v", r.By, r.Fails)
		}
		if r := f.dial(f.client, netip.AddrPortFrom(f.pods[1].Addr(v6), podPort), m); r.By["srv2"] != m {
			t.Fatalf("dials to srv2: %v %v", r.By, r.Fails)
		}
		// UDP to the draining pod is no SYN.
		if _, err := f.client.Call(bed.Request{Op: "dial", Proto: "udp", Addr: netip.AddrPortFrom(f.pods[0].Addr(v6), podPort).String(), N: 5}); err != nil {
			t.Fatal(err)
		}
		st, err := f.dp.DrainStats(f.podKey(0, v6))
		must(t, err)
		if st.SYNs != n {
			t.Errorf("SYNs counted for draining srv1 = %d, want exactly %d", st.SYNs, n)
		}
		if st.LastSYN.IsZero() || time.Since(st.LastSYN) > time.Minute || time.Until(st.LastSYN) > time.Second {
			t.Errorf("last SYN time %v is not recent", st.LastSYN)
		}
		other, err := f.dp.DrainStats(f.podKey(1, v6))
		must(t, err)
		if other != (bpf.DrainStats{}) {
			t.Errorf("non-draining srv2 has stats %+v", other)
		}
		if got := counter(t, f.dp, bpf.OutSYNDraining, v6); got != n {
			t.Errorf("syn_draining counter = %d, want %d", got, n)
		}
	})
}

func TestPrivilegedUpdatesAndPins(t *testing.T) {
	f := newFixture(t)
	// Swapping backend sets repeatedly leaves exactly the live generation.
	for i := 0; i < 5; i++ {
		set := f.backends(false, 1+i%2)
		must(t, f.dp.SetBackends(bpf.Backends{Service: 7, Backends: set, Expires: time.Now().Add(time.Minute)}))
	}
	d, err := f.dp.Dump()
	must(t, err)
	if len(d.Backends) != 1 || len(d.Backends[0].Backends) != 1 || d.Backends[0].Backends[0] != f.backends(false, 1)[0] {
		t.Fatalf("after swaps: %+v", d.Backends)
	}
	stats, err := f.dp.MapStats()
	must(t, err)
	for _, s := range stats {
		if s.Name == bpf.MapBackends && s.Entries != 1 {
			t.Errorf("backends map holds %d entries, want 1 (old generations leaked)", s.Entries)
		}
	}
	// Bad input is refused with an error, never written.
	if err := f.dp.UpsertDrain(bpf.Drain{Key: bpf.EndpointKey{Port: 1, Proto: bpf.TCP}}); err == nil {
		t.Error("invalid address accepted")
	}
	if err := f.dp.UpsertFrontend(bpf.Frontend{Key: bpf.EndpointKey{Addr: f.pods[0].IP4, Proto: 99, Port: 1}}); err == nil {
		t.Error("invalid protocol accepted")
	}
	if err := f.dp.SetBackends(bpf.Backends{Service: 0}); err == nil {
		t.Error("service-port id 0 accepted")
	}
	// The read-only pinned view sees what the daemon wrote.
	p, err := bpf.OpenPinned(f.pinDir)
	must(t, err)
	defer p.Close()
	pd, err := p.Dump()
	must(t, err)
	if len(pd.Backends) != 1 {
		t.Errorf("pinned view: %+v", pd.Backends)
	}
	// Prune removes orphans left by a crash mid-swap (simulated by deleting
	// the service entry behind the datapath's back).
	must(t, f.dp.DeleteBackends(7))
	if n, err := f.dp.Prune(); err != nil || n != 0 {
		t.Errorf("prune after a clean delete: %d, %v", n, err)
	}
}

func TestPrivilegedMapFull(t *testing.T) {
	f := newFixture(t)
	exp := time.Now().Add(time.Minute)
	var err error
	var i int
	for i = 0; i < 70000 && err == nil; i++ {
		a := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		err = f.dp.UpsertDrain(bpf.Drain{Key: bpf.EndpointKey{Addr: a, Port: uint16(1 + i>>16), Proto: bpf.TCP}, Policy: bpf.PolicyOff, Expires: exp})
	}
	if !errors.Is(err, bpf.ErrMapFull) {
		t.Fatalf("after %d drains: want ErrMapFull, got %v", i, err)
	}
	stats, serr := f.dp.MapStats()
	must(t, serr)
	for _, s := range stats {
		if s.Name == bpf.MapDrains && (s.UpdateErrors != 1 || s.Entries != s.Capacity) {
			t.Errorf("drains map after overflow: %+v", s)
		}
	}
	// Nothing was lost: freeing one slot makes room for a real drain, and
	// it steers.
	must(t, f.dp.DeleteDrain(bpf.EndpointKey{Addr: netip.AddrFrom4([4]byte{10, 200, 0, 0}), Port: 1, Proto: bpf.TCP}))
	f.drainFirst(false, bpf.PolicyRefuse, time.Minute)
	if r := f.dial(f.client, netip.AddrPortFrom(f.pods[0].IP4, podPort), 1); r.Fails[refusal(t)] != 1 {
		t.Errorf("drain added after the overflow does not refuse: %v %v", r.By, r.Fails)
	}
}

func TestPrivilegedProbe(t *testing.T) {
	bed.RequirePrivileged(t)
	f, err := bpf.Probe()
	if err != nil {
		t.Fatalf("this machine has every feature draind needs, yet: %v", err)
	}
	if !f.CgroupSockAddr || !f.CgroupSKB || !f.HelperBootTime || !f.HelperPrandom || !f.BPFLink || f.Cgroup2 == "" || f.Kernel == "" {
		t.Errorf("features %+v", f)
	}
	// bpf_set_retval is the one helper draind uses that Linux 5.10 lacks:
	// a kernel from 5.18 has it, an older one runs without it.
	if want := kernelAtLeast(f.Kernel, 5, 18); f.HelperSetRetval != want {
		t.Errorf("kernel %s: bpf_set_retval found %v, want %v", f.Kernel, f.HelperSetRetval, want)
	}
	checkKernelFeatures(t, f)
	if !f.CgroupSendmsg || !f.CgroupRecvmsg || !f.SocketStorage {
		t.Errorf("datagram hooks missing from features %+v", f)
	}
}
