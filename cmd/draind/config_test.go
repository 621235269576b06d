package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/daemon"
)

// TestRunFlagsBindToConfig: every daemon setting is a `draind run` flag
// whose default is daemon.DefaultConfig's, and setting the flag sets the
// configuration the daemon gets.
func TestRunFlagsBindToConfig(t *testing.T) {
	o := &runOptions{}
	fs := runCmd(o).Flags()
	def := daemon.DefaultConfig()
	for _, e := range def.Entries() {
		f := fs.Lookup(e.Name)
		if f == nil {
			t.Errorf("no flag --%s", e.Name)
			continue
		}
		if f.DefValue != e.Value {
			t.Errorf("--%s defaults to %s, daemon.DefaultConfig to %s", e.Name, f.DefValue, e.Value)
		}
	}
	if err := fs.Parse([]string{"--linger=45s", "--max-waiters=3", "--min-sync-interval=0"}); err != nil {
		t.Fatal(err)
	}
	if o.cfg.Linger != 45*time.Second || o.cfg.MaxWaiters != 3 || o.cfg.Quiet != def.Quiet {
		t.Errorf("flags did not reach the configuration: linger %v, max-waiters %d, quiet %v", o.cfg.Linger, o.cfg.MaxWaiters, o.cfg.Quiet)
	}
}

// TestRunRefusesMeaninglessValues: an explicit 0 that has no meaning of
// its own, and any negative value, stop `draind run` with an error
// naming the flag, before it touches the node; a 0 that means something
// (--min-sync-interval) is honoured.
func TestRunRefusesMeaninglessValues(t *testing.T) {
	for _, args := range [][]string{{"--linger=0"}, {"--quiet=0"}, {"--max-waiters=0"}, {"--entry-ttl=-1s"}, {"--gone-grace=-5s"}, {"--max-connections=-1"},
		{"--api-qps=0"}, {"--api-qps=-1"}, {"--api-qps=NaN"}, {"--api-burst=0"}, {"--api-burst=-3"}} {
		o := &runOptions{}
		fs := runCmd(o).Flags()
		if err := fs.Parse(append([]string{"--node-name=n1", "--log-format=text"}, args...)); err != nil {
			t.Fatal(err)
		}
		err := runDaemon(context.Background(), o)
		name, _, _ := strings.Cut(args[0], "=")
		if err == nil || !strings.Contains(err.Error(), name+"=") {
			t.Errorf("%s: err %v, want a refusal naming %s", args[0], err, name)
		}
	}
	o := &runOptions{}
	if err := runCmd(o).Flags().Parse([]string{"--min-sync-interval=0"}); err != nil {
		t.Fatal(err)
	}
	if err := o.cfg.Validate(); err != nil || o.cfg.MinSyncInterval != 0 {
		t.Errorf("--min-sync-interval=0: %v, %v", err, o.cfg.MinSyncInterval)
	}
}

// TestStatusShowsConfigInForce: status lists the daemon's settings as the
// daemon holds them, every other flag as given, and --procs as run.
func TestStatusShowsConfigInForce(t *testing.T) {
	o := &runOptions{}
	fs := runCmd(o).Flags()
	if err := fs.Parse([]string{"--linger=45s", "--namespace=other"}); err != nil {
		t.Fatal(err)
	}
	in := o.cfg
	in.Quiet = 3 * time.Second // as if the daemon ran with another value
	got := map[string]string{}
	for _, e := range configInForce(fs, in, 4) {
		got[e.Name] = e.Value
	}
	for name, want := range map[string]string{"linger": "45s", "quiet": "3s", "namespace": "other", "procs": "4", "max-waiters": "256"} {
		if got[name] != want {
			t.Errorf("status shows %s=%q, want %q", name, got[name], want)
		}
	}
	if _, ok := got["help"]; ok {
		t.Error("status lists --help")
	}
}

// TestClientFlagsRefuseMeaninglessValues: `draind webhook` and `draind
// offline` refuse an explicit 0 with no meaning of its own and negative
// durations with an error naming the flag, before they serve or call.
func TestClientFlagsRefuseMeaninglessValues(t *testing.T) {
	for _, tc := range []struct {
		cmd  func() *cobra.Command
		base []string
		bad  []string
	}{
		{newWebhookCmd, []string{"--image=x", "--log-format=text"},
			[]string{"--wait=0", "--wait=-1s", "--fallback-sleep=-1s", "--cert-check-interval=0", "--ca-publish-delay=-1s", "--shutdown-delay=-1s"}},
		{newOfflineCmd, []string{"--host=127.0.0.1"},
			[]string{"--wait=0", "--quiet=-1s", "--fallback-sleep=-1s", "--retries=-1", "--port=0"}},
	} {
		for _, arg := range tc.bad {
			cmd := tc.cmd()
			cmd.SetArgs(append(tc.base, arg))
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			err := cmd.ExecuteContext(context.Background())
			name, _, _ := strings.Cut(arg, "=")
			if err == nil || !strings.Contains(err.Error(), name+"=") {
				t.Errorf("%s %s: err %v, want a refusal naming %s", cmd.Name(), arg, err, name)
			}
		}
	}
}
