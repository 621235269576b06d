package gonepeers

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon/datapathtest"
)

// TestFlowsListedFromConntrack: the flow lister's goroutine, in a synctest
// bubble (time moves only when every goroutine waits, so each step is
// checked when the lister has done all it can). A gone peer's VIP flows
// are listed gone with the peer's instant and end; a flow to the pod IP
// itself (the peer entry covers it) and a flow younger than the departure
// are not. A failed conntrack read is counted and retried after
// flowsRetry, not at once; the flows go with their peer.
func TestFlowsListedFromConntrack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		now := time.Now()
		vip := netip.MustParseAddrPort("10.96.0.10:80")
		pod := netip.MustParseAddrPort("10.0.0.1:8080")
		flow := func(src string, dst netip.AddrPort, start time.Time) conntrack.Flow {
			s := netip.MustParseAddrPort(src)
			return conntrack.Flow{Proto: conntrack.TCP, Orig: conntrack.Tuple{Src: s, Dst: dst},
				Reply: conntrack.Tuple{Src: pod, Dst: s}, Start: start, State: conntrack.TCPEstablished}
		}
		ct := conntracktest.New()
		ct.AddFlow(flow("10.0.1.5:40000", vip, now.Add(-time.Minute)), flow("10.0.1.5:40001", pod, now.Add(-time.Minute)),
			flow("10.0.1.6:40002", vip, now.Add(time.Minute)))
		ct.FailNext(2, errors.New("injected: netlink busy"))
		v, sd := newFakeView(), datapathtest.NewSockets(time.Time{})
		cfg := testConfig(sd, fakeState{})
		cfg.Flows = ct
		g := New(cfg)
		g.Start(ctx)
		defer g.Stop()

		v.drains["a"] = Drain{Namespace: "default", IPs: []netip.Addr{pod.Addr()}, Gone: true}
		g.Pass(v, now, nil, nil)
		for errs := 1.0; errs <= 2; errs++ { // not read again at once: a retry each flowsRetry
			synctest.Wait()
			if n, got := len(sd.Flows()), testutil.ToFloat64(g.cfg.CTErrors); n != 0 || got != errs {
				t.Fatalf("after %v failed conntrack reads: %d flows listed, %v errors counted", errs, n, got)
			}
			time.Sleep(flowsRetry)
		}
		synctest.Wait()
		want := []bpf.GoneFlow{{Local: netip.MustParseAddrPort("10.0.1.5:40000"), Remote: vip, GoneAt: now, Expires: now.Add(entryTTL)}}
		if got := sd.Flows(); !slices.Equal(got, want) {
			t.Fatalf("gone flows %+v, want %+v", got, want)
		}

		delete(v.drains, "a")
		v.gen++
		g.Pass(v, now.Add(time.Second), nil, nil)
		synctest.Wait()
		if got := sd.Flows(); len(got) != 0 || len(sd.PeerMap()) != 0 {
			t.Errorf("after the pod drain ended: flows %+v, peers %v", got, sd.PeerMap())
		}
	})
}
