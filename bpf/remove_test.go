package bpf

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRemoveReportsUnreadablePins: Remove of a pin directory that does not
// exist is nothing to do, but one it cannot list is an error, not a
// silent success.
func TestRemoveReportsUnreadablePins(t *testing.T) {
	if err := Remove(filepath.Join(t.TempDir(), "absent")); err != nil {
		t.Errorf("a missing pin directory: %v", err)
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Remove(notDir); err == nil {
		t.Error("a pin directory that cannot be listed was removed without an error")
	}
}
