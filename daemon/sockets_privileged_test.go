package daemon

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
)

// e2eOptions vary the e2e bed (privileged_test.go).
type e2eOptions struct {
	// sockets loads the socket hooks (bpf.Options.Sockets).
	sockets bool
	// hideSockets gives the daemon the datapath without its socket
	// interface: the daemon as it was before it read sockets (live
	// connections from conntrack only, no socket ever ended).
	hideSockets bool
	// beforeStart runs once the bed and datapath exist, before the daemon.
	beforeStart func(*e2e)
}

func (o e2eOptions) datapath(dp *bpf.Datapath) Datapath {
	if o.hideSockets {
		return withoutSockets{dp}
	}
	return dp
}

// withoutSockets is a Datapath that does not offer SocketDatapath.
type withoutSockets struct{ Datapath }

// notrack makes the pods' traffic bypass the node's connection tracking
// (raw-table NOTRACK for the pod ranges), as CNIs do that route pod traffic
// with eBPF (Cilium's host routing) or ipvlan (Terway): the node's
// conntrack table never sees a pod's connections.
func notrack(e *e2e) {
	e.t.Helper()
	for _, r := range []struct{ bin, cidr string }{{"iptables", e.node.PodCIDR4.String()}, {"ip6tables", e.node.PodCIDR6.String()}} {
		for _, chain := range []string{"PREROUTING", "OUTPUT"} {
			for _, dir := range []string{"-s", "-d"} {
				if _, err := e.node.NS.Run(r.bin, "-w", "-t", "raw", "-A", chain, dir, r.cidr, "-j", "NOTRACK"); err != nil {
					e.t.Fatal(err)
				}
			}
		}
	}
}

// TestPrivilegedSocketOfflineWithoutConntrack: the bed's pod
// traffic bypasses the node's conntrack. A request in flight on the pod
// keeps it live until it ends, and /v1/offline answers only then, because
// the pod's own sockets are counted. The same test with the daemon blind to
// the sockets (conntrack only, as draind counted before) answers while the
// request is still running: the failure this fixes.
func TestPrivilegedSocketOfflineWithoutConntrack(t *testing.T) {
	for _, c := range []struct {
		name  string
		blind bool
	}{{"sockets", false}, {"conntrack_only", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newE2EWith(t, e2eOptions{sockets: true, hideSockets: c.blind, beforeStart: notrack})
			inflight := e.startClient("inflight")
			target := netip.AddrPortFrom(e.pods[0].IP4, e2ePort)
			if r, err := inflight.Call(bed.Request{Op: "open", ID: "c", Addr: target.String()}); err != nil || r.Server != "web-0" {
				t.Fatalf("opening the in-flight connection: %+v %v", r, err)
			}
			ct, err := conntrack.Open(conntrack.Options{NetNS: e.node.NS.Path()})
			must(t, err)
			defer ct.Close()
			if n, err := ct.Count(context.Background(), e.pods[0].IP4); err != nil || n.LiveTCP() != 0 {
				t.Fatalf("the node's conntrack sees the pod's connection (%+v, %v): the bypass does not work", n, err)
			}
			inflightDone := make(chan error, 1)
			var inflightEnd time.Time
			go func() {
				_, err := inflight.Call(bed.Request{Op: "req", ID: "c", Line: "sleep 3000", Timeout: 10 * time.Second})
				inflightEnd = time.Now()
				if err == nil {
					_, err = inflight.Call(bed.Request{Op: "close", ID: "c"})
				}
				inflightDone <- err
			}()
			// While it runs, the status says the pod is live, and from where.
			// (Sampled until the answer: the drain starts only once the
			// offline call's helper runs. Real time: real sockets and BPF,
			// no synctest bubble.)
			seenCh, stopSampling := make(chan string, 1), make(chan struct{})
			go func() {
				seen := LiveFromNone
				for {
					for _, p := range e.d.PodStatuses() {
						if p.Name == "web-0" && p.LiveConnections > 0 {
							seen = p.LiveSource
						}
					}
					select {
					case <-stopSampling:
						seenCh <- seen
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			code, res, took := e.offlineFrom(e.pods[0], "wait=30s&quiet=1s")
			answered := time.Now()
			close(stopSampling)
			if err := <-inflightDone; err != nil {
				t.Errorf("the in-flight request failed: %v", err)
			}
			t.Logf("%s: offline answered %d after %v (%+v); the in-flight request ended %v after the answer",
				c.name, code, took.Round(time.Millisecond), res, inflightEnd.Sub(answered).Round(time.Millisecond))
			if c.blind {
				// Today's code: conntrack is empty, so the pod reads as
				// drained after the quiet period, mid-request.
				if !answered.Before(inflightEnd) || res.LiveSource != LiveFromConntrack || res.LiveConnections != 0 {
					t.Errorf("conntrack only: want the early answer this test guards against, got %d %+v", code, res)
				}
				return
			}
			if answered.Before(inflightEnd) {
				t.Errorf("offline answered %v before the in-flight request finished", inflightEnd.Sub(answered))
			}
			if code != 200 || !res.Drained || res.LiveSource != LiveFromSockets || res.LiveSockets == nil || *res.LiveSockets != 0 {
				t.Errorf("offline: %d %+v", code, res)
			}
			if seen := <-seenCh; seen != LiveFromSockets {
				t.Errorf("while the request ran, status said live from %q, want sockets", seen)
			}
		})
	}
}

// vanish makes pod i a dead peer: its link goes down, the node black-holes
// its addresses (packets to it vanish without an answer), its server is
// killed; then its pod object is deleted without grace and its endpoints
// leave the slices (a force delete). It returns the instant the pod's
// network was gone: no answer from it can arrive after that.
func (e *e2e) vanish(i int) time.Time {
	e.t.Helper()
	p := e.pods[i]
	_, err := p.NS.Run("ip", "link", "set", "eth0", "down")
	must(e.t, err)
	_, err = e.node.NS.Run("ip", "route", "replace", "blackhole", p.IP4.String()+"/32")
	must(e.t, err)
	_, err = e.node.NS.Run("ip", "-6", "route", "replace", "blackhole", p.IP6.String()+"/128")
	must(e.t, err)
	cut := time.Now()
	must(e.t, p.Cgroup.Remove())
	ctx := context.Background()
	name := fmt.Sprintf("web-%d", i)
	must(e.t, e.client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
	list, err := e.client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
	must(e.t, err)
	for i := range list.Items {
		s := &list.Items[i]
		var kept []discoveryv1.Endpoint
		for _, ep := range s.Endpoints {
			if ep.TargetRef == nil || ep.TargetRef.Name != name {
				kept = append(kept, ep)
			}
		}
		s.Endpoints = kept
		_, err = e.client.DiscoveryV1().EndpointSlices("default").Update(ctx, s, metav1.UpdateOptions{})
		must(e.t, err)
	}
	return cut
}

// TestPrivilegedSocketVanishedPodEndsClients: keep-alive clients of a pod
// that vanishes without any grace (no FIN, no RST: its address black-holed,
// its pod force-deleted) fail with ETIMEDOUT at their next request, one
// dialing the pod IP and one through the Service VIP (the node's conntrack
// translated it), reconnect at once and are served by another pod, even
// though the node's kube-proxy rules still list the dead pod. The control
// (the daemon blind to sockets) waits out its request timeout.
func TestPrivilegedSocketVanishedPodEndsClients(t *testing.T) {
	const reqTimeout = 3 * time.Second
	for _, c := range []struct {
		name  string
		blind bool
	}{{"draind", false}, {"without", true}} {
		t.Run(c.name, func(t *testing.T) {
			e := newE2EWith(t, e2eOptions{sockets: true, hideSockets: c.blind})
			// A second VIP, pointed at web-0 alone while the clients connect,
			// then at all three (kube-proxy's view, never updated again).
			vip := netip.MustParseAddrPort("10.96.0.20:80")
			ip, err := bed.NewClusterIP(e.node.NS, vip, "tcp", []netip.AddrPort{netip.AddrPortFrom(e.pods[0].IP4, e2ePort)})
			must(t, err)
			t.Cleanup(func() { ip.Close() })
			must(t, e.addVIP(vip))
			cli := e.startClient("ka")
			for _, k := range []struct {
				id   string
				addr netip.AddrPort
			}{{"direct", netip.AddrPortFrom(e.pods[0].IP4, e2ePort)}, {"vip", vip}} {
				_, err := cli.Call(bed.Request{Op: "keepalive_start", ID: k.id, Addr: k.addr.String(), Interval: 50 * time.Millisecond, Timeout: reqTimeout})
				must(t, err)
			}
			for _, id := range []string{"direct", "vip"} { // both connected, to web-0
				tl, err := bed.WaitServed(cli, id, 10*time.Second)
				must(t, err)
				if s := tl[len(tl)-1].Server; s != "web-0" {
					t.Fatalf("%s: served by %s, want web-0", id, s)
				}
			}
			var all []netip.AddrPort
			for _, p := range e.pods {
				all = append(all, netip.AddrPortFrom(p.IP4, e2ePort))
			}
			must(t, ip.SetBackends(all))
			killed := e.vanish(0)
			if !c.blind {
				e.waitFor("web-0's IPs listed as gone peers", func() bool {
					peers, _, err := e.dp.GoneEntries()
					return err == nil && len(peers) == 2
				})
				// A reconnect through the second VIP must not meet
				// kube-proxy's stale rule to web-0: the VIP is steered.
				e.waitFor("the second VIP steered to the live pods", func() bool {
					dm, err := e.dp.Dump()
					return err == nil && slices.ContainsFunc(dm.Frontends, func(f bpf.Frontend) bool {
						return f.Key == bpf.EndpointKey{Addr: vip.Addr(), Port: vip.Port(), Proto: bpf.TCP}
					})
				})
			}
			time.Sleep(reqTimeout + 2*time.Second) // let the clients live through it
			for _, id := range []string{"direct", "vip"} {
				r, err := cli.Call(bed.Request{Op: "keepalive_stop", ID: id})
				must(t, err)
				first, ok := bed.FirstSuccessAfter(r.Timeline, killed)
				var errs []string
				for _, s := range r.Timeline {
					if s.Err != "" && s.At > killed.UnixNano() {
						errs = append(errs, s.Err)
					}
				}
				if !ok {
					t.Fatalf("%s: no request succeeded after the kill: %v", id, errs)
				}
				took := time.Duration(first.At - killed.UnixNano())
				t.Logf("%s %s: next success %v after the kill (server %s), errors %v", c.name, id, took.Round(time.Millisecond), first.Server, errs)
				if first.Server == "web-0" {
					t.Errorf("%s: served by the vanished pod", id)
				}
				if c.blind {
					if len(errs) == 0 || errs[0] != "timeout" {
						t.Errorf("without: want the request to wait out its timeout, got %v", errs)
					}
					continue
				}
				if len(errs) == 0 || errs[0] != "etimedout" || took >= reqTimeout {
					t.Errorf("%s: want the socket ended (ETIMEDOUT) and the next request served before the %v timeout, got %v after %v", id, reqTimeout, errs, took)
				}
			}
			if !c.blind {
				_, flows, err := e.dp.GoneEntries()
				must(t, err)
				if len(flows) == 0 {
					t.Error("the VIP client's flow was not listed gone")
				}
			}
		})
	}
}

// addVIP gives Service web a second ClusterIP family-4 VIP (the API's view
// of the VIP the bed just installed).
func (e *e2e) addVIP(vip netip.AddrPort) error {
	ctx := context.Background()
	s, err := e.client.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		return err
	}
	svc := s.DeepCopy()
	svc.Name, svc.ResourceVersion, svc.UID = "web2", "", serviceUID("default", "web2")
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = vip.Addr().String(), []string{vip.Addr().String()}
	if _, err := e.client.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, fam := range []discoveryv1.AddressType{discoveryv1.AddressTypeIPv4} {
		sl, err := e.client.DiscoveryV1().EndpointSlices("default").Get(ctx, "web-"+string(fam), metav1.GetOptions{})
		if err != nil {
			return err
		}
		n := sl.DeepCopy()
		n.Name, n.ResourceVersion = "web2-"+strings.ToLower(string(fam)), ""
		// The EndpointSlice controller's, as web's: draind steers a
		// vanished endpoint only for the slices it trusts.
		n.Labels = map[string]string{discoveryv1.LabelServiceName: "web2", discoveryv1.LabelManagedBy: k8s.ManagedByController}
		ownedBy(n, "web2")
		if _, err := e.client.DiscoveryV1().EndpointSlices("default").Create(ctx, n, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}
