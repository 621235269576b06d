package embedded

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/scenario"
)

// TestPrivilegedDemo runs a shortened `draind-demo` (5 s of traffic after
// the rollout instead of 30 s) and checks what the demo claims: with
// draind no client sees a failed connection, with preStop sleep the stale
// registry client does, and draind's rollout is faster than sleep's.
func TestPrivilegedDemo(t *testing.T) {
	bed.RequirePrivileged(t)
	// The demo needs no program on the PATH (no iptables, conntrack or ip):
	// its helpers are this binary, everything else goes over netlink.
	t.Setenv("PATH", t.TempDir())
	if err := Preflight(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	var out bytes.Buffer
	results, err := Demo(ctx, DemoOptions{
		Scenario: scenario.Config{Tail: 5 * time.Second, Log: log},
		Cluster:  Config{Log: log},
	}, &out)
	t.Logf("demo figures:\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != 2 || results[0].Variant.Name != "sleep" || results[1].Variant.Name != "draind" {
		t.Fatalf("want the sleep and draind variants, got %d results", len(results))
	}
	sleep, draind := results[0], results[1]
	for _, r := range results {
		for _, name := range []string{scenario.ClientClusterIP, scenario.ClientStale, scenario.ClientKeepAlive} {
			c, ok := r.Client(name)
			if !ok || c.OK == 0 {
				t.Errorf("%s: the %s client made no successful request: %+v", r.Variant.Label(), name, c)
			}
		}
		if len(r.Pods) != 3 {
			t.Errorf("%s: %d pods replaced, want 3", r.Variant.Label(), len(r.Pods))
		}
	}
	for _, c := range draind.Clients {
		if c.Failed() != 0 {
			t.Errorf("draind: the %s client saw %d failed requests (%s), want 0", c.Name, c.Failed(), c.FailKinds())
		}
	}
	for _, p := range draind.Pods {
		if p.PreStop != "drained" {
			t.Errorf("draind: pod %s's offline call ended %q, want drained", p.Name, p.PreStop)
		}
	}
	if stale, _ := sleep.Client(scenario.ClientStale); stale.Failed() == 0 {
		t.Errorf("sleep: the stale-registry client saw no failure: the demo would show nothing")
	}
	if draind.Rollout() >= sleep.Rollout() {
		t.Errorf("draind's rollout took %v, sleep's %v: want draind faster", draind.Rollout(), sleep.Rollout())
	}
}
