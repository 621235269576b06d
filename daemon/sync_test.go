package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/draind/draind/bpf"
)

// TestNothingAppliedBeforeSync: with one informer unable to list (an API
// server refusing Leases), the datapath is never written, though the other
// informers already hold a draining endpoint; once it lists, the drain is
// applied.
func TestNothingAppliedBeforeSync(t *testing.T) {
	client := fake.NewClientset(webService(), slice("web-1", "web", v4, httpPorts(8080), terminating("10.0.0.1", "a"), ready("10.0.0.2", "b")))
	var refuse atomic.Bool
	var refused atomic.Int32
	refuse.Store(true)
	client.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if refuse.Load() {
			refused.Add(1)
			return true, nil, errors.New("the server is currently unable to handle the request")
		}
		return false, nil, nil
	})
	dp := NewFakeDatapath()
	d := New(Config{Node: testNode, Namespace: testNS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, client, dp, nil)
	d.SetAttached(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	// Every other informer holds its objects and the Lease list was refused
	// (and retried): the moment a broken sync would write.
	eventually(t, 20*time.Second, "the other informers to sync and the Lease list to be retried", func() bool {
		return d.inf.Slices.HasSynced() && d.inf.Services.HasSynced() && d.inf.Pods.HasSynced() && refused.Load() >= 2
	})
	if n := dp.OpCount(); n != 0 {
		t.Fatalf("%d datapath operations before every informer synced", n)
	}
	if d.Ready() {
		t.Fatal("ready before every informer synced")
	}
	refuse.Store(false) // the reflector retries with backoff
	eventually(t, 20*time.Second, "the drain to be applied after the informers synced", func() bool { return len(dp.DrainKeys()) > 0 })
	if !slices.Contains(dp.DrainKeys(), key("10.0.0.1:8080", bpf.TCP)) {
		t.Errorf("drains %v", dp.DrainKeys())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("run: %v", err)
	}
}
