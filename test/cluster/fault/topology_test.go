package fault

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/e2e"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
)

// serviceWith creates an IPv4 ClusterIP Service (port 80 → 8080)
// selecting app=name, with mod applied to its spec, and returns its
// ClusterIP:port.
func (f *fixture) serviceWith(name string, mod func(*corev1.ServiceSpec)) netip.AddrPort {
	f.t.Helper()
	single := corev1.IPFamilyPolicySingleStack
	spec := corev1.ServiceSpec{
		Selector: map[string]string{"app": name}, IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
		Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(serverPort)}},
	}
	mod(&spec)
	svc, err := f.env.kc.Admin.CoreV1().Services(f.ns).Create(f.ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Spec: spec},
		metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating service %s/%s: %v", f.ns, name, err)
	}
	return netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), svcPort)
}

// labelZone sets the topology.kubernetes.io/zone label of node name's Node.
func (f *fixture) labelZone(name, zone string) {
	f.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, corev1.LabelTopologyZone, zone)
	if _, err := f.env.kc.Admin.CoreV1().Nodes().Patch(f.ctx, f.nodes[name].Kube.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// waitZoneHints waits until every endpoint of the Service's slices carries
// the zone hint of its own zone (what the EndpointSlice controller writes
// for trafficDistribution PreferSameZone).
func (f *fixture) waitZoneHints(svc string, n int) {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		l, err := f.env.kc.Admin.DiscoveryV1().EndpointSlices(f.ns).List(f.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
		if err != nil {
			f.t.Fatal(err)
		}
		hinted := 0
		for _, s := range l.Items {
			for _, e := range s.Endpoints {
				if e.Zone != nil && e.Hints != nil && len(e.Hints.ForZones) == 1 && e.Hints.ForZones[0].Name == *e.Zone {
					hinted++
				}
			}
		}
		if hinted == n {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the slices of %s: %d of %d endpoints with their zone's hint: %+v", svc, hinted, n, l.Items)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitProgrammedOn waits until kube-proxy on node name balances vip over
// exactly the pods (an endpoint named twice, by a ClientIP Service's
// affinity rule and its balancing rule, counts once).
func (f *fixture) waitProgrammedOn(name string, vip netip.AddrPort, pods ...*e2e.Pod) {
	f.t.Helper()
	var want []netip.AddrPort
	for _, p := range pods {
		want = append(want, p.Addr(corev1.IPv4Protocol))
	}
	slices.SortFunc(want, netip.AddrPort.Compare)
	sp := kube.ServicePort{IP: vip.Addr(), Port: vip.Port(), Protocol: corev1.ProtocolTCP}
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	_, err := f.nodes[name].Kube.WaitRules(ctx, corev1.IPv4Protocol, func(r *kube.Rules) bool {
		got := slices.Clone(r.Endpoints(sp))
		slices.SortFunc(got, netip.AddrPort.Compare)
		return slices.Equal(slices.Compact(got), want)
	})
	if err != nil {
		f.t.Fatalf("waiting for kube-proxy on %s to balance %s over %v: %v", name, vip, want, err)
	}
}

// steeredTo waits until d's maps steer vip (a live frontend that
// rewrites) and returns the backends they pick from, sorted.
func steeredTo(t *testing.T, d *headline.Draind, vip netip.AddrPort, want []netip.AddrPort) {
	t.Helper()
	slices.SortFunc(want, netip.AddrPort.Compare)
	deadline := time.Now().Add(10 * time.Second)
	var got []netip.AddrPort
	for {
		dm, err := pinned(d)
		if err == nil {
			got = backendsOf(dm, vip)
			if liveFrontend(dm, vip, time.Now()) && slices.Equal(got, want) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("draind's backends for %s: %v (err %v), want %v", vip, got, err, want)
		}
		time.Sleep(mapPoll)
	}
}

// backendsOf returns the backends of vip's frontend in a dump, sorted.
func backendsOf(dm *bpf.Dump, vip netip.AddrPort) []netip.AddrPort {
	for _, fe := range dm.Frontends {
		if fe.Key.Addr != vip.Addr() || fe.Key.Port != vip.Port() || fe.Key.Proto != bpf.TCP {
			continue
		}
		for _, be := range dm.Backends {
			if be.Service == fe.Service {
				out := slices.Clone(be.Backends)
				slices.SortFunc(out, netip.AddrPort.Compare)
				return out
			}
		}
	}
	return nil
}

// only dials addr count times from c and fails unless every connection
// was answered by one of want.
func (f *fixture) only(c *e2e.Client, addr netip.AddrPort, count int, want ...string) map[string]int {
	f.t.Helper()
	by := f.reaches(c, addr, count)
	for server, n := range by {
		if !slices.Contains(want, server) {
			f.t.Errorf("client %s → %s: %d of %d connections reached %s, want only %v (answers %v)", c.Pod.Name, addr, n, count, server, want, by)
		}
	}
	return by
}

// TestTopologyPreferSameZone: a Service with trafficDistribution
// PreferSameZone, nodes a (zone-1) and b (zone-2), web-0 and web-1 on a,
// web-2 on b. kube-proxy keeps a client on node a in zone-1. While web-0
// drains (its offline call: it stays Ready, kube-proxy still balances to
// it), draind steers every new connection from node a, and must pick
// within the zone: web-1 only, never web-2 across the zone. Once web-1
// drains too, the zone has no candidate and, as kube-proxy's fallback
// does, the connection goes to any other endpoint: web-2. draind on node b
// picks from its own zone's: web-2.
func TestTopologyPreferSameZone(t *testing.T) {
	bed.RequirePrivileged(t)
	f := newFixture(t, "topo", "a", "b")
	f.labelZone("a", "zone-1")
	f.labelZone("b", "zone-2")
	zone := corev1.ServiceTrafficDistributionPreferSameZone
	vip := f.serviceWith("web", func(s *corev1.ServiceSpec) { s.TrafficDistribution = &zone })
	web0 := f.pod("a", "web-0", "web")
	web1 := f.pod("a", "web-1", "web")
	web2 := f.pod("b", "web-2", "web")
	f.watchReady("web", web0, web1, web2)
	f.waitZoneHints("web", 3)
	f.waitProgrammedOn("a", vip, web0, web1)
	f.waitProgrammedOn("b", vip, web2)
	da, db := f.startDraind("a"), f.startDraind("b")
	client := f.client("a")

	// Premise: kube-proxy keeps node a's connections in zone-1.
	f.only(client, vip, 40, "web-0", "web-1")

	if code, body, err := offline(f.ctx, web0, da, ""); err != nil || code != 200 {
		t.Fatalf("web-0's offline call: %d %s %v", code, body, err)
	}
	f.waitSteering(vip, web0.Bed.IP4, 10*time.Second)
	steeredTo(t, da, vip, []netip.AddrPort{web1.Addr(corev1.IPv4Protocol)})
	steeredTo(t, db, vip, []netip.AddrPort{web2.Addr(corev1.IPv4Protocol)})
	by := f.only(client, vip, 200, "web-1")
	t.Logf("web-0 draining: node a's 200 connections reached %v (draind's set on a: web-1, on b: web-2)", by)

	if code, body, err := offline(f.ctx, web1, da, ""); err != nil || code != 200 {
		t.Fatalf("web-1's offline call: %d %s %v", code, body, err)
	}
	f.waitSteering(vip, web1.Bed.IP4, 10*time.Second)
	steeredTo(t, da, vip, []netip.AddrPort{web2.Addr(corev1.IPv4Protocol)})
	by = f.only(client, vip, 100, "web-2")
	t.Logf("web-0 and web-1 draining: node a's 100 connections reached %v (zone-1 has none left: every other endpoint)", by)
}

// TestAffinityClientIP: a Service with sessionAffinity ClientIP, web-0
// and web-1 on node a, web-2 on node b, a client on node a. The client's
// first connection picks its affinity backend; then another pod of the
// Service drains (its offline call). Every new connection of the client
// must still reach its affinity backend: draind leaves a ClientIP
// Service's connections to kube-proxy (its frontend never steers).
func TestAffinityClientIP(t *testing.T) {
	bed.RequirePrivileged(t)
	f := newFixture(t, "affinity", "a", "b")
	timeout := int32(300)
	vip := f.serviceWith("web", func(s *corev1.ServiceSpec) {
		s.SessionAffinity = corev1.ServiceAffinityClientIP
		s.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeout}}
	})
	pods := map[string]*e2e.Pod{"web-0": f.pod("a", "web-0", "web"), "web-1": f.pod("a", "web-1", "web"), "web-2": f.pod("b", "web-2", "web")}
	f.watchReady("web", pods["web-0"], pods["web-1"], pods["web-2"])
	for _, n := range []string{"a", "b"} {
		f.waitProgrammedOn(n, vip, pods["web-0"], pods["web-1"], pods["web-2"])
	}
	da := f.startDraind("a")
	f.startDraind("b")
	client := f.client("a")

	first := f.reaches(client, vip, 1)
	var mine string
	for server := range first {
		mine = server
	}
	f.only(client, vip, 20, mine) // premise: kube-proxy keeps the client on it
	var other string
	for _, name := range []string{"web-0", "web-1", "web-2"} {
		if name != mine {
			other = name
			break
		}
	}
	if code, body, err := offline(f.ctx, pods[other], da, ""); err != nil || code != 200 {
		t.Fatalf("%s's offline call: %d %s %v", other, code, body, err)
	}
	// draind holds the drain (an entry for the pod's IP, a frontend for
	// the VIP that does not steer).
	deadline := time.Now().Add(10 * time.Second)
	for {
		dm, err := pinned(da)
		if err == nil && len(liveDrains(dm, pods[other].Bed.IP4, time.Now())) > 0 && hasNoSteerFrontend(dm, vip) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("draind on a holds no drain of %s with a non-steering frontend for %s (err %v)", other, vip, err)
		}
		time.Sleep(mapPoll)
	}
	by := f.only(client, vip, 200, mine)
	t.Logf("affinity backend %s, %s draining: 200 new connections reached %v", mine, other, by)
}

func hasNoSteerFrontend(dm *bpf.Dump, vip netip.AddrPort) bool {
	for _, fe := range dm.Frontends {
		if fe.Key.Addr == vip.Addr() && fe.Key.Port == vip.Port() && fe.Key.Proto == bpf.TCP && fe.NoSteer {
			return true
		}
	}
	return false
}
