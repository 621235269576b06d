package daemon

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

// TestUnreadableSYNCountBlocksDrained: while a draining endpoint's SYN
// count cannot be read, the pod is not declared drained (a SYN not counted
// would end the wait early); once it reads again, it is.
func TestUnreadableSYNCountBlocksDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := localFixture(t)
		call := h.offline(podIP, 30*time.Second, 2*time.Second)
		h.tick(0)
		h.dp.SetStatsErr(errors.New("map read failed"))
		for i := 0; i < 6; i++ {
			h.tick(time.Second)
		}
		if r, ok := call.answered(t); ok {
			t.Fatalf("answered %+v while the SYN count could not be read", r)
		}
		h.dp.SetStatsErr(nil)
		h.tick(time.Second)
		r, ok := call.result(t)
		if !ok || r.Code != 200 || r.State != StateDrained {
			t.Fatalf("want 200 drained once the count reads again, got %+v (answered %v)", r, ok)
		}
	})
}
