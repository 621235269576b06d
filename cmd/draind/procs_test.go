package main

import (
	"runtime"
	"testing"

	"github.com/draind/draind/daemon"
)

// TestProcs: draind runs on daemon.DefaultProcs Ps unless --procs (or its
// environment variable) says otherwise; an operator's GOMAXPROCS is kept
// when neither is given (unless the runtime ignores it); a negative count is
// refused.
func TestProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "")
	fs := newRunCmd().Flags()
	if got := procsWanted(fs, daemon.DefaultProcs); got != daemon.DefaultProcs {
		t.Errorf("no GOMAXPROCS, no --procs: %d, want %d", got, daemon.DefaultProcs)
	}
	for _, ignored := range []string{"abc", "0", "-2"} { // the runtime ignores these
		t.Setenv("GOMAXPROCS", ignored)
		if got := procsWanted(fs, daemon.DefaultProcs); got != daemon.DefaultProcs {
			t.Errorf("GOMAXPROCS=%s, no --procs: %d, want %d", ignored, got, daemon.DefaultProcs)
		}
	}
	t.Setenv("GOMAXPROCS", "3")
	if got := procsWanted(fs, daemon.DefaultProcs); got != 0 {
		t.Errorf("GOMAXPROCS=3, no --procs: %d, want 0 (the runtime's, from GOMAXPROCS)", got)
	}
	if err := fs.Set("procs", "2"); err != nil {
		t.Fatal(err)
	}
	if got := procsWanted(fs, 2); got != 2 {
		t.Errorf("GOMAXPROCS=3, --procs=2: %d, want 2", got)
	}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	if err := setProcs(-1); err == nil {
		t.Error("--procs=-1 accepted")
	}
	before := runtime.GOMAXPROCS(0)
	if err := setProcs(0); err != nil || runtime.GOMAXPROCS(0) != before {
		t.Errorf("--procs=0: err %v, GOMAXPROCS %d, want %d (unchanged)", err, runtime.GOMAXPROCS(0), before)
	}
	if err := setProcs(1); err != nil || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("--procs=1: err %v, GOMAXPROCS %d, want 1", err, runtime.GOMAXPROCS(0))
	}
}
