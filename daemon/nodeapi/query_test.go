package nodeapi

import (
	"net/url"
	"testing"
	"time"
)

// TestHostileWaitParser: wait and quiet take plain decimal seconds or Go
// durations, nothing else.
func TestHostileWaitParser(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, true}, {"0", 0, true}, {"30", 30 * time.Second, true}, {"2.5", 2500 * time.Millisecond, true},
		{"30s", 30 * time.Second, true}, {"1m30s", 90 * time.Second, true}, {"500ms", 500 * time.Millisecond, true},
		{"0s", 0, true}, {"1.5h", 90 * time.Minute, true}, {"86400", 24 * time.Hour, true},
		{"0x1p3", 0, false}, {"0x10", 0, false}, {"1_0", 0, false}, {"1_0s", 0, false}, {"-0", 0, false},
		{"-0s", 0, false}, {"-1", 0, false}, {"+5", 0, false}, {"+5s", 0, false}, {"1e3", 0, false},
		{"NaN", 0, false}, {"Inf", 0, false}, {"infinity", 0, false}, {".5", 0, false}, {"5.", 0, false},
		{" 5", 0, false}, {"5 ", 0, false}, {"5 s", 0, false}, {"s", 0, false}, {"1d", 0, false},
		{"86401", 0, false}, {"25h", 0, false}, {"99999999999999999999s", 0, false},
	} {
		got, err := parseDuration(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseDuration(%q) = %v, %v; want %v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

// FuzzParseOfflineQuery: any query either fails or yields durations within
// their bounds (never NaN, negative or beyond the caps).
func FuzzParseOfflineQuery(f *testing.F) {
	for _, seed := range []string{"", "wait=60s", "wait=30&quiet=1.5", "wait=NaN", "quiet=Inf", "wait=-1s",
		"wait=1e300", "wait=9999999999h", "wait=1s&wait=2s", "wiat=1", "quiet=6m", "wait=%zz", "quiet=0x10", "wait=1_0"} {
		f.Add(seed)
	}
	const maxWait = 10 * time.Minute
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		req, err := parseOfflineQuery(q, 2*time.Second, maxWait)
		if err != nil {
			return
		}
		if req.wait < 0 || req.wait > maxWait || req.quiet < 0 || req.quiet > maxQuiet {
			t.Fatalf("%q gave wait %v quiet %v", raw, req.wait, req.quiet)
		}
	})
}
