package bed

import (
	"testing"
	"time"
)

// An answer read after the kill to a request sent before it is not the
// next success: its server may be gone by then.
func TestFirstSuccessAfterCountsRequestsSentAfter(t *testing.T) {
	kill := time.Unix(100, 0)
	ns := func(ms int64) int64 { return kill.UnixNano() + ms*int64(time.Millisecond) }
	tl := []Sample{
		{Sent: ns(-60), At: ns(-55), Server: "victim", Conn: 1},
		{Sent: ns(-10), At: ns(40), Server: "victim", Conn: 1}, // read late
		{Sent: ns(50), At: ns(1800), Err: "etimedout", Conn: 1},
		{Sent: ns(1800), At: ns(1805), Server: "live", Conn: 2},
	}
	s, ok := FirstSuccessAfter(tl, kill)
	if !ok || s.Server != "live" || s.At != ns(1805) {
		t.Errorf("FirstSuccessAfter = %+v, %v; want the live server's answer at +1805ms", s, ok)
	}
	if _, ok := FirstSuccessAfter(tl[:3], kill); ok {
		t.Error("found a success among requests that all failed or were sent before the kill")
	}
}
