package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
)

func testutilValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// pollInterval is how often eventually looks: a cheap in-memory condition.
const pollInterval = time.Millisecond

// eventually waits until cond holds (a signal: an informer caught up, a
// map reached a state), failing the test with what after timeout. It is
// the one poll loop of the package's tests, for those that cannot run in
// a synctest bubble (which waits with synctest.Wait instead): the HTTP
// fixture's, on a real TCP socket, and the privileged ones, on real BPF
// maps and real time.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !poll(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// poll reports whether cond held within timeout.
func poll(timeout time.Duration, cond func() bool) bool {
	err := wait.PollUntilContextTimeout(context.Background(), pollInterval, timeout, true,
		func(context.Context) (bool, error) { return cond(), nil })
	return err == nil
}
