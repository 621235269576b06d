package hosted

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/draind/draind/daemon/datapathtest"
)

// TestLiveFromSocketsAndConntrack: the live count is the larger of the two
// sources; the answer says which, and whether the sockets miss older
// connections of a pod created before counting started.
func TestLiveFromSocketsAndConntrack(t *testing.T) {
	ip := []netip.Addr{netip.MustParseAddr("10.0.0.1")}
	since := time.Date(2026, 11, 29, 11, 0, 0, 0, time.UTC)
	ctFlows := func(n int) *ctCounts {
		c := &ctCounts{live: map[netip.Addr]int{}}
		c.setLive("10.0.0.1", n)
		return c
	}
	for _, tc := range []struct {
		name        string
		sockets     int // -1: no socket hooks
		ct          int // -1: no conntrack
		created     time.Time
		live        int
		source      string
		partial     bool
		noCheckable bool
	}{
		{"sockets only (a CNI without host conntrack)", 2, 0, since.Add(time.Minute), 2, LiveFromSockets, false, false},
		{"both agree", 1, 1, since.Add(time.Minute), 1, LiveFromSockets, false, false},
		{"conntrack sees older connections", 1, 3, since.Add(-time.Minute), 3, LiveFromConntrack, true, false},
		{"no socket hooks", -1, 2, since, 2, LiveFromConntrack, false, false},
		{"no conntrack", 4, -1, since.Add(time.Minute), 4, LiveFromSockets, false, false},
		{"neither", -1, -1, since, 0, LiveFromNone, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sd Sockets
			if tc.sockets >= 0 {
				f := datapathtest.NewSockets(since)
				f.SetLive(ip[0], tc.sockets)
				sd = f
			}
			var ct Conntrack
			if tc.ct >= 0 {
				ct = ctFlows(tc.ct)
			}
			lc := countLive(context.Background(), sd, ct, ip, tc.created, nil)
			if tc.ct >= 0 {
				// Conntrack unreadable: the sockets alone decide only for a
				// pod they counted from its start.
				ct.(*ctCounts).failNext = len(ip)
				if failed := countLive(context.Background(), sd, ct, ip, tc.created, nil); failed.Checked == (tc.sockets < 0 || tc.partial) {
					t.Errorf("conntrack unreadable: checked %v (sockets %d, partial %v)", failed.Checked, tc.sockets, tc.partial)
				}
			}
			if lc.Live != tc.live || lc.Source != tc.source || lc.SocketsPartial != tc.partial || !lc.Checked {
				t.Errorf("got %+v, want live %d from %s (partial %v)", lc, tc.live, tc.source, tc.partial)
			}
			if (lc.Sockets != nil) != (tc.sockets >= 0) || (lc.Conntrack != nil) != (tc.ct >= 0) {
				t.Errorf("sources read: sockets %v conntrack %v", lc.Sockets, lc.Conntrack)
			}
		})
	}
}
