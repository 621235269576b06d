package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
)

const (
	e2ePort    = 8080
	offlinePrt = 9460
)

// e2e wires the real informers (over a fake API) to the real datapath in a
// network-namespace node: three server pods behind a kube-proxy-style
// iptables ClusterIP that kube-proxy never updates (the worst case), and
// client pods in the node's hooked pods cgroup.
type e2e struct {
	t      *testing.T
	bed    *bed.Bed
	node   *bed.Node
	pods   []*bed.Pod
	client *fake.Clientset
	dp     *bpf.Datapath
	d      *Daemon
	vip4   netip.AddrPort
	vip6   netip.AddrPort
}

func newE2E(t *testing.T) *e2e { return newE2EWith(t, e2eOptions{}) }

func newE2EWith(t *testing.T, o e2eOptions) *e2e {
	bed.RequirePrivileged(t)
	feat, err := bpf.Probe()
	if err != nil {
		t.Skipf("SKIP: kernel cannot run the datapath: %v", err)
	}
	if o.sockets && !feat.Sockets {
		t.Skipf("SKIP: kernel cannot run the socket hooks: %s", feat.SocketsMissing)
	}
	e := &e2e{t: t, client: fake.NewClientset(),
		vip4: netip.MustParseAddrPort("10.96.0.10:80"), vip6: netip.MustParseAddrPort("[fd00:96::10]:80")}
	b, err := bed.New()
	must(t, err)
	e.bed = b
	t.Cleanup(func() { b.Close() })
	e.node, err = b.AddNode("n0")
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	var eps4, eps6 []discoveryv1.Endpoint
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("web-%d", i)
		p, err := e.node.AddPod(name)
		must(t, err)
		srv, err := p.Start("serve", name, fmt.Sprintf("tcp:[::]:%d", e2ePort))
		must(t, err)
		t.Cleanup(func() { srv.Kill() })
		e.pods = append(e.pods, p)
		uid := types.UID("uid-" + name)
		kp := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: uid},
			Spec:   corev1.PodSpec{NodeName: "n0"},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: p.IP4.String(), PodIPs: []corev1.PodIP{{IP: p.IP4.String()}, {IP: p.IP6.String()}}}}
		_, err = e.client.CoreV1().Pods("default").Create(ctx, kp, metav1.CreateOptions{})
		must(t, err)
		for _, fam := range []struct {
			eps *[]discoveryv1.Endpoint
			ip  netip.Addr
		}{{&eps4, p.IP4}, {&eps6, p.IP6}} {
			tr, fa, node := true, false, "n0"
			*fam.eps = append(*fam.eps, discoveryv1.Endpoint{Addresses: []string{fam.ip.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: &tr, Serving: &tr, Terminating: &fa}, NodeName: &node,
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: name, UID: uid}})
		}
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: serviceUID("default", "web")},
		Spec: corev1.ServiceSpec{ClusterIP: e.vip4.Addr().String(), ClusterIPs: []string{e.vip4.Addr().String(), e.vip6.Addr().String()},
			Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
	_, err = e.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{})
	must(t, err)
	for fam, eps := range map[discoveryv1.AddressType][]discoveryv1.Endpoint{discoveryv1.AddressTypeIPv4: eps4, discoveryv1.AddressTypeIPv6: eps6} {
		_, err = e.client.DiscoveryV1().EndpointSlices("default").Create(ctx, e.slice(fam, eps), metav1.CreateOptions{})
		must(t, err)
	}
	for _, v6 := range []bool{false, true} {
		vip := e.vip4
		if v6 {
			vip = e.vip6
		}
		var backends []netip.AddrPort
		for _, p := range e.pods {
			backends = append(backends, netip.AddrPortFrom(p.Addr(v6), e2ePort))
		}
		c, err := bed.NewClusterIP(e.node.NS, vip, "tcp", backends)
		must(t, err)
		t.Cleanup(func() { c.Close() })
	}

	dir, unmount, err := bed.NewBPFFS()
	must(t, err)
	t.Cleanup(func() { unmount() })
	e.dp, err = bpf.Load(bpf.Options{PinDir: dir, Sockets: o.sockets})
	must(t, err)
	t.Cleanup(func() { e.dp.Close() })
	must(t, e.dp.Attach(e.node.Pods.Path))
	ct, err := conntrack.Open(conntrack.Options{NetNS: e.node.NS.Path()})
	must(t, err)
	t.Cleanup(func() { ct.Close() })

	if o.beforeStart != nil {
		o.beforeStart(e)
	}
	e.d = mustNew(t, Config{Node: "n0", Namespace: "draind-system", PollEvery: 50 * time.Millisecond, Quiet: time.Second,
		RegistryOnlyPolicy: bpf.PolicyRefuse, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, e.client, o.datapath(e.dp), ct)
	e.d.SetAttached(true)
	done := make(chan struct{})
	go func() { e.d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	// The offline API listens on the node, as with hostNetwork.
	var l net.Listener
	must(t, e.node.NS.Do(func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", offlinePrt))
		return err
	}))
	go e.d.API().Serve(ctx, l)
	e.waitFor("the daemon to be ready", func() bool { return e.d.Ready() })
	return e
}

func (e *e2e) slice(fam discoveryv1.AddressType, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	name, port, proto := "http", int32(e2ePort), corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-" + string(fam), Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web",
			discoveryv1.LabelManagedBy: k8s.ManagedByController}},
		AddressType: fam, Endpoints: eps,
		Ports: []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	ownedBy(s, "web") // as the EndpointSlice controller writes it: trusted
	return s
}

// waitFor polls a condition (the datapath reaching a state): a signal, not
// a sleep. Polled, not in a synctest bubble: the kernel's BPF maps and
// conntrack change outside the process.
func (e *e2e) waitFor(what string, cond func() bool) {
	e.t.Helper()
	eventually(e.t, 10*time.Second, what, cond)
}

func (e *e2e) drained(ip netip.Addr) bool {
	d, err := e.dp.Dump()
	if err != nil {
		return false
	}
	for _, dr := range d.Drains {
		if dr.Key.Addr == ip && dr.Key.Port == e2ePort {
			return true
		}
	}
	return false
}

func (e *e2e) startClient(name string) *bed.Proc {
	p, err := e.node.AddPod(name)
	must(e.t, err)
	c, err := p.Start("client")
	must(e.t, err)
	e.t.Cleanup(func() { c.Kill() })
	return c
}

func dial(t *testing.T, c *bed.Proc, addr netip.AddrPort, n int) bed.Response {
	t.Helper()
	r, err := c.Call(bed.Request{Op: "dial", Addr: addr.String(), N: n})
	must(t, err)
	return r
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPrivilegedSliceTerminatingSteersVIPOnly(t *testing.T) {
	e := newE2E(t)
	cli := e.startClient("cli")
	if r := dial(t, cli, e.vip4, 60); r.By["web-0"] == 0 {
		t.Fatalf("before the drain web-0 should get traffic: %v", r.By)
	}
	// web-0 turns terminating in both slices; kube-proxy's rules stay stale.
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6} {
		s, err := e.client.DiscoveryV1().EndpointSlices("default").Get(context.Background(), "web-"+string(fam), metav1.GetOptions{})
		must(t, err)
		f, tr := false, true
		s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: &f, Serving: &tr, Terminating: &tr}
		_, err = e.client.DiscoveryV1().EndpointSlices("default").Update(context.Background(), s, metav1.UpdateOptions{})
		must(t, err)
	}
	e.waitFor("web-0's drain entries", func() bool { return e.drained(e.pods[0].IP4) && e.drained(e.pods[0].IP6) })
	for _, target := range []netip.AddrPort{e.vip4, e.vip6} {
		r := dial(t, cli, target, 150)
		if r.OK != 150 || r.By["web-0"] != 0 {
			t.Errorf("to %s while web-0 terminates: %v fails %v", target, r.By, r.Fails)
		}
	}
	// web-0 exists and never asked to go offline: its own IP still reaches
	// it (the Kubernetes network model); only its Service's VIP steers.
	for _, target := range []netip.AddrPort{netip.AddrPortFrom(e.pods[0].IP4, e2ePort), netip.AddrPortFrom(e.pods[0].IP6, e2ePort)} {
		r := dial(t, cli, target, 150)
		if r.OK != 150 || r.By["web-0"] != 150 {
			t.Errorf("to %s while web-0 terminates (not offline, not opted in): %v fails %v", target, r.By, r.Fails)
		}
	}
}

func TestPrivilegedLeaseSteersBeforeSlice(t *testing.T) {
	e := newE2E(t)
	cli := e.startClient("cli")
	l := &k8s.Leases{Client: e.client, Namespace: "draind-system"}
	_, _, err := l.Publish(context.Background(), k8s.DrainRequest{PodNamespace: "default", PodName: "web-1", PodUID: "uid-web-1",
		IPs: []netip.Addr{e.pods[1].IP4, e.pods[1].IP6}, Node: "n0", Reason: k8s.ReasonOperator, Duration: 30 * time.Second}, time.Now())
	must(t, err)
	e.waitFor("web-1's drain entries", func() bool { return e.drained(e.pods[1].IP4) && e.drained(e.pods[1].IP6) })
	for _, target := range []netip.AddrPort{e.vip4, e.vip6, netip.AddrPortFrom(e.pods[1].IP4, e2ePort)} {
		r := dial(t, cli, target, 150)
		if r.OK != 150 || r.By["web-1"] != 0 {
			t.Errorf("to %s while web-1's Lease drains it (slices unchanged): %v fails %v", target, r.By, r.Fails)
		}
	}
}

// offlineFrom calls the node's offline API from inside a pod.
func (e *e2e) offlineFrom(p *bed.Pod, query string) (int, OfflineResult, time.Duration) {
	e.t.Helper()
	c, err := p.Start("client")
	must(e.t, err)
	defer c.Kill()
	url := fmt.Sprintf("http://%s/v1/offline?%s", netip.AddrPortFrom(e.node.IP4, offlinePrt), query)
	r, err := c.Call(bed.Request{Op: "http", Addr: url, Line: "POST", Timeout: time.Minute})
	must(e.t, err)
	var res OfflineResult
	if err := json.Unmarshal([]byte(r.Body), &res); err != nil {
		e.t.Fatalf("answer %d %q: %v", r.Code, r.Body, err)
	}
	return r.Code, res, r.Elapsed
}

func TestPrivilegedOfflineWaitsUntilDrained(t *testing.T) {
	e := newE2E(t)
	loopVIP := e.startClient("loop-vip")
	loopPod := e.startClient("loop-pod")
	inflight := e.startClient("inflight")
	target := netip.AddrPortFrom(e.pods[0].IP4, e2ePort)
	// One request in flight on web-0 when it goes offline: it takes 3 s.
	if r, err := inflight.Call(bed.Request{Op: "open", ID: "c", Addr: target.String()}); err != nil || r.Server != "web-0" {
		t.Fatalf("opening the in-flight connection: %+v %v", r, err)
	}
	inflightDone := make(chan error, 1)
	var inflightEnd time.Time
	go func() {
		_, err := inflight.Call(bed.Request{Op: "req", ID: "c", Line: "sleep 3000", Timeout: 10 * time.Second})
		inflightEnd = time.Now() // the answer is in: the request finished
		if err == nil {
			_, err = inflight.Call(bed.Request{Op: "close", ID: "c"})
		}
		inflightDone <- err
	}()
	// Clients keep opening new connections to it: via the VIP and by IP.
	for _, c := range []struct {
		p    *bed.Proc
		addr netip.AddrPort
	}{{loopVIP, e.vip4}, {loopPod, target}} {
		_, err := c.p.Call(bed.Request{Op: "loop_start", ID: "l", Addr: c.addr.String(), Interval: 5 * time.Millisecond})
		must(t, err)
	}
	code, res, took := e.offlineFrom(e.pods[0], "wait=30s&quiet=1s")
	answered := time.Now()
	if err := <-inflightDone; err != nil {
		t.Errorf("the in-flight request failed: %v", err)
	}
	if answered.Before(inflightEnd) {
		t.Errorf("offline answered %v before the in-flight request finished", inflightEnd.Sub(answered))
	}
	if code != 200 || !res.Drained || res.State != StateDrained || res.LiveConnections != 0 {
		t.Fatalf("offline: %d %+v", code, res)
	}
	if took > 15*time.Second {
		t.Errorf("offline returned after %v: want well before the 30 s wait", took)
	}
	t.Logf("drained after %v (%d SYNs seen, %d steered on this node)", took, res.SYNs, res.Steered)
	// After the call, no new connection lands on web-0.
	for _, c := range []*bed.Proc{loopVIP, loopPod} {
		c.Call(bed.Request{Op: "loop_stop", ID: "l"})
		_, err := c.Call(bed.Request{Op: "loop_start", ID: "l2", Addr: e.vip4.String(), Interval: 5 * time.Millisecond})
		must(t, err)
	}
	time.Sleep(300 * time.Millisecond) // traffic to sample, not a synchronisation
	for _, c := range []*bed.Proc{loopVIP, loopPod} {
		r, err := c.Call(bed.Request{Op: "loop_stop", ID: "l2"})
		must(t, err)
		if r.By["web-0"] != 0 || len(r.Fails) != 0 {
			t.Errorf("after the offline call returned: %v fails %v", r.By, r.Fails)
		}
	}
}

func TestPrivilegedOfflineTimesOutOnLongLivedConnection(t *testing.T) {
	e := newE2E(t)
	keep := e.startClient("keepalive")
	target := netip.AddrPortFrom(e.pods[0].IP4, e2ePort)
	if r, err := keep.Call(bed.Request{Op: "open", ID: "k", Addr: target.String()}); err != nil || r.Server != "web-0" {
		t.Fatalf("opening the long-lived connection: %+v %v", r, err)
	}
	code, res, took := e.offlineFrom(e.pods[0], "wait=3s&quiet=1s")
	if code != 504 || res.Drained || res.LiveConnections != 1 {
		t.Fatalf("want 504 with live_connections 1, got %d %+v", code, res)
	}
	if took < 3*time.Second || took > 6*time.Second {
		t.Errorf("answered after %v, want at the 3 s wait", took)
	}
	// The long-lived connection still works: existing connections are
	// never touched.
	if r, err := keep.Call(bed.Request{Op: "req", ID: "k"}); err != nil || r.Server != "web-0" {
		t.Errorf("the long-lived connection broke: %+v %v", r, err)
	}
	// A host process (not a pod) cannot drain anything.
	host, err := bed.StartProc(e.node.NS, e.bed.Cgroup, "client")
	must(t, err)
	defer host.Kill()
	r, err := host.Call(bed.Request{Op: "http", Line: "POST", Addr: fmt.Sprintf("http://%s/v1/offline", netip.AddrPortFrom(e.node.IP4, offlinePrt))})
	must(t, err)
	if r.Code != 403 {
		t.Errorf("offline from the node itself: %d %s", r.Code, r.Body)
	}
}
