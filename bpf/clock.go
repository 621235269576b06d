package bpf

import (
	"time"

	"golang.org/x/sys/unix"
)

// The programs compare expiries with bpf_ktime_get_boot_ns (CLOCK_BOOTTIME),
// which keeps counting across suspend and never jumps with wall-clock
// changes; the Go side speaks time.Time and converts at the map boundary.

func bootNow() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		// CLOCK_BOOTTIME exists since Linux 2.6.39; this cannot fail on
		// any kernel that runs the programs.
		panic("clock_gettime(CLOCK_BOOTTIME): " + err.Error())
	}
	return time.Duration(ts.Nano())
}

// toBoot converts a wall-clock deadline to CLOCK_BOOTTIME nanoseconds. A zero
// or past deadline becomes 0 or a past instant: expired, steering nothing.
func toBoot(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	v := bootNow() + time.Until(t)
	if v < 0 {
		return 0
	}
	return uint64(v)
}

// fromBoot converts CLOCK_BOOTTIME nanoseconds back to wall-clock time.
func fromBoot(ns uint64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Now().Add(time.Duration(ns) - bootNow())
}
