package daemon

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/draind/draind/daemon/datapathtest"
)

// TestConfigDefaults: a zero Config gets every default of DefaultConfig,
// a value set is kept, and a 0 that means something of its own stays 0.
func TestConfigDefaults(t *testing.T) {
	var c Config
	c.Defaults()
	d := DefaultConfig()
	got, want := c.Entries(), d.Entries()
	if len(got) != len(want) {
		t.Fatalf("entries %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("after Defaults %s=%s, want the default %s", got[i].Name, got[i].Value, want[i].Value)
		}
	}
	if c.PollEvery != d.PollEvery || c.HeaderTimeout != d.HeaderTimeout || c.BodyTimeout != d.BodyTimeout || c.Clock == nil || c.Logger == nil {
		t.Errorf("unexported defaults not filled: %+v", c)
	}
	c = Config{Linger: 7 * time.Second, MaxWaiters: 3}
	c.Defaults()
	if c.Linger != 7*time.Second || c.MaxWaiters != 3 || c.MinSyncInterval != 0 {
		t.Errorf("Defaults changed values set: linger %v, max-waiters %d, min-sync-interval %v", c.Linger, c.MaxWaiters, c.MinSyncInterval)
	}
}

// TestConfigValidate: the defaults are valid; every setting refuses a
// negative value, and an explicit 0 unless 0 means something of its own,
// naming the flag in the error.
func TestConfigValidate(t *testing.T) {
	d := DefaultConfig()
	if err := d.Validate(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	for i, s := range d.Settings() {
		for _, v := range []int{-1, 0} {
			c := DefaultConfig()
			cs := c.Settings()[i]
			switch {
			case cs.Dur != nil:
				*cs.Dur = time.Duration(v) * time.Second
			case cs.Int != nil:
				*cs.Int = v
			default:
				*cs.Float = float32(v)
			}
			err := c.Validate()
			switch {
			case v == 0 && s.ZeroOK:
				if err != nil {
					t.Errorf("--%s=0 refused: %v", s.Flag, err)
				}
			case err == nil:
				t.Errorf("--%s=%s accepted", s.Flag, cs.Value())
			case !strings.Contains(err.Error(), "--"+s.Flag+"="):
				t.Errorf("--%s=%s: the error %q does not name the flag", s.Flag, cs.Value(), err)
			}
		}
	}
}

// TestNewValidates: New fills what a configuration leaves 0 and refuses,
// with Validate's error naming the flag, what the daemon cannot honour.
func TestNewValidates(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		flag string // "" when New accepts it
	}{
		{name: "zero values take the defaults", mod: func(*Config) {}},
		{name: "negative linger", mod: func(c *Config) { c.Linger = -time.Second }, flag: "--linger="},
		{name: "negative quiet", mod: func(c *Config) { c.Quiet = -time.Millisecond }, flag: "--quiet="},
		{name: "negative max-waiters", mod: func(c *Config) { c.MaxWaiters = -1 }, flag: "--max-waiters="},
		{name: "negative api-qps", mod: func(c *Config) { c.APIQPS = -5 }, flag: "--api-qps="},
		{name: "negative api-burst", mod: func(c *Config) { c.APIBurst = -1 }, flag: "--api-burst="},
		{name: "negative min-sync-interval", mod: func(c *Config) { c.MinSyncInterval = -time.Second }, flag: "--min-sync-interval="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Node: testNode, Namespace: testNS, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			tc.mod(&cfg)
			d, err := New(cfg, fake.NewClientset(), datapathtest.New(), nil)
			switch {
			case tc.flag == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.flag == "" && d.Config().APIQPS != DefaultConfig().APIQPS:
				t.Errorf("api-qps %v in force, want the default %v", d.Config().APIQPS, DefaultConfig().APIQPS)
			case tc.flag != "" && err == nil:
				t.Errorf("accepted")
			case tc.flag != "" && !strings.Contains(err.Error(), tc.flag):
				t.Errorf("the error %q does not name %s", err, tc.flag)
			}
		})
	}
}
