package daemon

import (
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"k8s.io/utils/clock"
)

// DefaultConfig is the one place draind's defaults live: `draind run`
// binds its flags to a copy of it (Settings), and Defaults fills a
// partly set Config from it.
func DefaultConfig() Config {
	return Config{
		EntryTTL:         time.Minute,
		Linger:           2 * time.Minute,
		LeaseDuration:    30 * time.Second,
		GoneGrace:        5 * time.Second,
		UDPReexpire:      10 * time.Second,
		Quiet:            2 * time.Second,
		MaxWait:          10 * time.Minute,
		MaxWaiters:       256,
		MaxWaitersPerPod: 8,
		MaxConnections:   1024,
		PollEvery:        200 * time.Millisecond,
		HeaderTimeout:    5 * time.Second,
		BodyTimeout:      5 * time.Second,
		APIQPS:           20,
		APIBurst:         40,
		Version:          "dev",
	}
}

// Setting is one tunable of Config as `draind run` exposes it: a flag
// bound to the field, its help, and whether 0 is a value of its own.
// Exactly one of Dur, Int and Float is set.
type Setting struct {
	Flag   string
	Usage  string
	Dur    *time.Duration
	Int    *int
	Float  *float32
	ZeroOK bool // 0 means something (otherwise an explicit 0 is refused)
}

// Settings lists c's tunables, pointing into c.
func (c *Config) Settings() []Setting {
	return []Setting{
		{Flag: "entry-ttl", Dur: &c.EntryTTL, Usage: "lifetime of a steering entry without refresh: if draind dies, steering stops within it"},
		{Flag: "linger", Dur: &c.Linger, Usage: "keep steering a departed pod's IP this long (stale registry caches); ends at once if the IP is reused"},
		{Flag: "lease-duration", Dur: &c.LeaseDuration, Usage: "duration of drain Leases (renewed at a third)"},
		{Flag: "gone-grace", Dur: &c.GoneGrace, Usage: "wait after an endpoint left every slice before cutting its TCP conntrack flows"},
		{Flag: "udp-reexpire", Dur: &c.UDPReexpire, Usage: "re-expire UDP flows of draining endpoints this often"},
		{Flag: "quiet", Dur: &c.Quiet, Usage: "default quiet period of /v1/offline: drained = no new SYN for this long and no live connection"},
		{Flag: "max-wait", Dur: &c.MaxWait, Usage: "cap of /v1/offline?wait="},
		{Flag: "max-waiters", Int: &c.MaxWaiters, Usage: "concurrent /v1/offline waits on the node before answering 429 (a pod's first wait is always accepted)"},
		{Flag: "max-waiters-per-pod", Int: &c.MaxWaitersPerPod, Usage: "concurrent /v1/offline waits of one pod before answering 429"},
		{Flag: "max-connections", Int: &c.MaxConnections, Usage: "open connections of the offline API (more are answered 503 and closed)"},
		{Flag: "api-qps", Float: &c.APIQPS, Usage: "client QPS towards the API server"},
		{Flag: "api-burst", Int: &c.APIBurst, Usage: "client burst towards the API server"},
		{Flag: "min-sync-interval", Dur: &c.MinSyncInterval, ZeroOK: true, Usage: "bounded frequency: at most one datapath pass per interval, all of them on the event loop (0: as events arrive, an EndpointSlice update's in the watch's own goroutine)"},
	}
}

// Value is the setting's value as a flag prints it.
func (s Setting) Value() string {
	switch {
	case s.Dur != nil:
		return s.Dur.String()
	case s.Int != nil:
		return strconv.Itoa(*s.Int)
	}
	return strconv.FormatFloat(float64(*s.Float), 'g', -1, 32)
}

// sign is -1, 0 or 1 as the value is negative, zero or positive; a NaN
// is 0 (refused where 0 is).
func (s Setting) sign() int {
	switch {
	case s.Dur != nil:
		return int(max(min(*s.Dur, 1), -1))
	case s.Int != nil:
		return max(min(*s.Int, 1), -1)
	case *s.Float < 0:
		return -1
	case *s.Float > 0:
		return 1
	}
	return 0
}

// Validate refuses what the daemon cannot honour: a negative value, and
// an explicit 0 where 0 has no meaning of its own (it is not read as
// "the default").
func (c *Config) Validate() error {
	for _, s := range c.Settings() {
		switch sign := s.sign(); {
		case sign < 0:
			return fmt.Errorf("--%s=%s: must not be negative", s.Flag, s.Value())
		case sign == 0 && !s.ZeroOK:
			d := DefaultConfig()
			return fmt.Errorf("--%s=%s: must be more than 0 (the default is %s)", s.Flag, s.Value(), settingOf(&d, s.Flag).Value())
		}
	}
	return nil
}

func settingOf(c *Config, flag string) Setting {
	for _, s := range c.Settings() {
		if s.Flag == flag {
			return s
		}
	}
	panic("no setting " + flag)
}

// Entries lists c's settings with their values, for status.
func (c *Config) Entries() []ConfigEntry {
	var out []ConfigEntry
	for _, s := range c.Settings() {
		out = append(out, ConfigEntry{Name: s.Flag, Value: s.Value()})
	}
	return out
}

// Defaults fills the unset (zero) fields from DefaultConfig, for callers
// that set only what they need. A value 0 that means something of its own
// (Setting.ZeroOK) is its own default, so it is kept; `draind run` refuses
// any other 0 before it gets here (Validate).
func (c *Config) Defaults() {
	d := DefaultConfig()
	fill := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	ds := d.Settings()
	for i, s := range c.Settings() {
		switch {
		case s.Dur != nil:
			fill(s.Dur, *ds[i].Dur)
		case s.Int != nil && *s.Int == 0:
			*s.Int = *ds[i].Int
		case s.Float != nil && *s.Float == 0:
			*s.Float = *ds[i].Float
		}
	}
	fill(&c.PollEvery, d.PollEvery)
	fill(&c.HeaderTimeout, d.HeaderTimeout)
	fill(&c.BodyTimeout, d.BodyTimeout)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Version == "" {
		c.Version = d.Version
	}
}

// Config returns the configuration in force (after Defaults).
func (d *Daemon) Config() Config { return d.cfg }
