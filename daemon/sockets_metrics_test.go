package daemon

import (
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/datapathtest"
)

// unreadableSockets is a socket datapath whose counters and gone maps
// cannot be read.
type unreadableSockets struct{ *datapathtest.Sockets }

func (unreadableSockets) SocketCounters() (bpf.SocketCounters, error) {
	return bpf.SocketCounters{}, errors.New("injected: counters unreadable")
}
func (unreadableSockets) GoneEntries() ([]bpf.GonePeer, []bpf.GoneFlow, error) {
	return nil, nil, errors.New("injected: gone maps unreadable")
}

// TestSocketMetricsNotZeroOnReadError: counters that cannot be read are
// left out of the scrape (0 would read as a counter reset), and so are the
// gone peers' gauges; readable ones are exported.
func TestSocketMetricsNotZeroOnReadError(t *testing.T) {
	series := func(dp Datapath) string {
		d := mustNew(t, Config{Node: "n1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, fake.NewClientset(), dp, nil)
		mfs, err := d.Metrics.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, mf := range mfs {
			names = append(names, mf.GetName())
		}
		return strings.Join(names, " ")
	}
	ok := series(datapathtest.NewSockets(time.Now()))
	for _, name := range []string{"draind_sockets_ended_total", "draind_socket_events_total", "draind_gone_peers"} {
		if !strings.Contains(ok, name) {
			t.Errorf("readable maps: no %s in %s", name, ok)
		}
	}
	bad := series(unreadableSockets{datapathtest.NewSockets(time.Now())})
	for _, name := range []string{"draind_sockets_ended_total", "draind_socket_events_total", "draind_gone_peers", "draind_gone_flows"} {
		if strings.Contains(bad, name+" ") || strings.HasSuffix(bad, name) {
			t.Errorf("unreadable maps: %s exported anyway", name)
		}
	}
	if !strings.Contains(bad, "draind_socket_hooks_loaded") {
		t.Error("unreadable maps: draind_socket_hooks_loaded missing")
	}
}
