package daemon

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/test/bed"
)

// TestPrivilegedUDPReplyInFlightAtDrainStart: a client pod sends a query
// to a UDP ClusterIP on a socket connected to the VIP (as Go's resolver
// does, one socket per query); kube-proxy-style DNAT sends it to a pod
// whose drain starts while the answer is on its way. The node's conntrack
// policy, told of the drain and run at once as the daemon runs it, must
// not expire the flow before the answer is back: without the flow the
// answer keeps the pod's address, the client's socket (connected to the
// VIP) drops it and the query is lost. Once the drain has settled the
// flow is expired as before.
func TestPrivilegedUDPReplyInFlightAtDrainStart(t *testing.T) {
	bed.RequirePrivileged(t)
	const port = 5353
	vip := netip.MustParseAddrPort("10.96.0.53:53")
	b, err := bed.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing bed: %v", err)
		}
	})
	node, err := b.AddNode("node")
	if err != nil {
		t.Fatal(err)
	}
	ct, err := conntrack.Open(conntrack.Options{NetNS: node.NS.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ct.Close() })
	server, err := node.AddPod("dns-0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := server.Start("serve", "dns-0", "udp::5353"); err != nil {
		t.Fatal(err)
	}
	cp, err := node.AddPod("client")
	if err != nil {
		t.Fatal(err)
	}
	client, err := cp.Start("client")
	if err != nil {
		t.Fatal(err)
	}
	svc, err := bed.NewClusterIP(node.NS, vip, "udp", []netip.AddrPort{netip.AddrPortFrom(server.IP4, port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })

	clk := testingclock.NewFakeClock(time.Now())
	metrics := NewMetrics("test", nil, nil, nil)
	policy := newConntrackPolicy(conntrackPolicyConfig{Conntrack: ct, Claims: model.NewClaims(clk, time.Minute), Clock: clk,
		Metrics: metrics, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), GoneGrace: 5 * time.Second, UDPReexpire: 10 * time.Second})
	ctx := context.Background()

	// The query: answered 500 ms after it arrives.
	answer := make(chan bed.Response, 1)
	go func() {
		r, err := client.Call(bed.Request{Op: "dial", Addr: vip.String(), Proto: "udp", Line: "sleep 500", Timeout: 3 * time.Second})
		if err != nil {
			r.Err = err.Error()
		}
		answer <- r
	}()
	flowsOf := func() []conntrack.Flow {
		t.Helper()
		fl, err := ct.EndpointFlows(ctx, server.IP4, conntrack.UDP)
		if err != nil {
			t.Fatal(err)
		}
		return fl
	}
	// Polled: the kernel's conntrack table changes outside any synctest bubble.
	eventually(t, 2*time.Second, "the query's DNATed flow", func() bool {
		for _, f := range flowsOf() {
			if f.Orig.Dst == vip {
				return true
			}
		}
		return false
	})

	// Its backend starts draining: the daemon tells the policy and wakes
	// its loop, which runs a pass.
	key := bpf.EndpointKey{Addr: server.IP4, Port: port, Proto: bpf.UDP}
	policy.udpDrain(key, true, clk.Now())
	policy.pass(ctx)
	r := <-answer
	if r.Err != "" || r.OK != 1 || r.By["dns-0"] != 1 {
		t.Fatalf("the query in flight as its backend's drain started: %+v (want 1 answer from dns-0)", r)
	}

	// Once the drain has settled, the pod's flows are expired.
	clk.Step(udpSettle)
	policy.pass(ctx)
	if fl := flowsOf(); len(fl) != 0 {
		t.Fatalf("%d UDP flows of the draining pod left %v after its drain started: %+v", len(fl), udpSettle, fl)
	}
	if n := testutilValue(t, metrics.CTExpired.WithLabelValues("udp")); n < 1 {
		t.Fatalf("%v UDP flows counted expired, want at least 1", n)
	}
}
