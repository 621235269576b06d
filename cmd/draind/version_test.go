package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/draind/draind/deploy/release"
)

// TestVersionStamped builds draind stamped as release.LDFlags does (the
// function image builders use), static and with -trimpath as the image is
// built (which also shares the Go build cache with the other static
// builds), and checks both outputs of `draind version`.
func TestVersionStamped(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("SKIP: the go command is not on the PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "draind")
	stamp := release.Stamp{Version: "v9.8.7-test", Commit: "0123456789abcdef", Date: "2026-11-30T12:00:00Z"}
	build := exec.Command("go", "build", "-trimpath", "-ldflags", release.LDFlags(stamp), "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	b, err := build.CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	text, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"draind v9.8.7-test\n", "commit:    0123456789abcdef\n", "built:     2026-11-30T12:00:00Z\n",
		"go:        " + runtime.Version() + "\n", "platform:  " + runtime.GOOS + "/" + runtime.GOARCH + "\n"} {
		if !strings.Contains(string(text), want) {
			t.Errorf("draind version lacks %q:\n%s", want, text)
		}
	}
	js, err := exec.Command(bin, "version", "-o", "json").Output()
	if err != nil {
		t.Fatal(err)
	}
	var got buildInfo
	if err := json.Unmarshal(js, &got); err != nil {
		t.Fatalf("draind version -o json: %v\n%s", err, js)
	}
	want := buildInfo{Version: stamp.Version, Commit: stamp.Commit, Date: stamp.Date, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if got != want {
		t.Errorf("draind version -o json = %+v, want %+v", got, want)
	}
	if err := exec.Command(bin, "version", "-o", "yaml").Run(); err == nil {
		t.Error("draind version -o yaml succeeded: want an error")
	}
}

// TestVersionDefaultsToRelease: an unstamped build reports the release
// version and says what it does not know instead of printing nothing.
func TestVersionDefaultsToRelease(t *testing.T) {
	b := currentBuild()
	if b.Version != release.Version {
		t.Errorf("unstamped version %q, want release.Version %q", b.Version, release.Version)
	}
	if b.Commit == "" || b.Date == "" || b.GoVersion == "" {
		t.Errorf("empty fields in %+v", b)
	}
	var out bytes.Buffer
	if err := printVersion(&out, b, ""); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "draind "+release.Version+"\n") {
		t.Errorf("first line of %q is not \"draind %s\"", out.String(), release.Version)
	}
}
