package nodeapi

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"time"
)

// maxQuiet bounds ?quiet=: longer is surely a mistake.
const maxQuiet = 5 * time.Minute

// parseDuration accepts plain decimal seconds ("30", "2.5") and Go
// durations without a sign ("30s", "1m30s"); nothing else: no sign, no
// exponent, no hexadecimal, no digit separators, no NaN or infinity. A
// value beyond maxDuration is an error: a duration that cannot be compared
// would skip the quiet period.
func parseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	var d time.Duration
	switch {
	case plainSeconds.MatchString(s):
		n, err := strconv.ParseFloat(s, 64)
		if err != nil || n > maxDuration.Seconds() {
			return 0, fmt.Errorf("duration %q out of range (0 to %s)", s, maxDuration)
		}
		d = time.Duration(n * float64(time.Second))
	case goDuration.MatchString(s):
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("bad duration %q", s)
		}
	default:
		return 0, fmt.Errorf("bad duration %q: want seconds (30, 2.5) or a Go duration (30s, 1m30s)", s)
	}
	if d < 0 || d > maxDuration {
		return 0, fmt.Errorf("duration %q out of range (0 to %s)", s, maxDuration)
	}
	return d, nil
}

var (
	plainSeconds = regexp.MustCompile(`^[0-9]{1,6}(\.[0-9]{1,9})?$`)
	goDuration   = regexp.MustCompile(`^([0-9]{1,9}(\.[0-9]{1,9})?(ns|us|µs|μs|ms|s|m|h))+$`)
)

// maxDuration bounds every duration parameter (far above any sane wait).
const maxDuration = 24 * time.Hour

// offlineRequest is a parsed /v1/offline query.
type offlineRequest struct {
	wait, quiet time.Duration
}

// parseOfflineQuery validates the query of /v1/offline: only wait and
// quiet, each at most once. defQuiet is used when quiet is absent; wait is
// capped at maxWait.
func parseOfflineQuery(q url.Values, defQuiet, maxWait time.Duration) (offlineRequest, error) {
	req := offlineRequest{quiet: defQuiet}
	for k, v := range q {
		if k != "wait" && k != "quiet" {
			return req, fmt.Errorf("unknown parameter %q", k)
		}
		if len(v) != 1 {
			return req, fmt.Errorf("%s: given %d times", k, len(v))
		}
	}
	var err error
	if req.wait, err = parseDuration(q.Get("wait")); err != nil {
		return req, fmt.Errorf("wait: %w", err)
	}
	if q.Has("quiet") {
		if req.quiet, err = parseDuration(q.Get("quiet")); err != nil {
			return req, fmt.Errorf("quiet: %w", err)
		}
		if req.quiet > maxQuiet {
			return req, fmt.Errorf("quiet: at most %s", maxQuiet)
		}
	}
	req.wait = min(req.wait, maxWait)
	return req, nil
}
