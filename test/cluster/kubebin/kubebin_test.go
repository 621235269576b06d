package kubebin

import (
	"os/exec"
	"strings"
	"testing"
)

// TestVersionMatchesGoMod keeps Version (stamped into the binaries and
// keying the cache) equal to the k8s.io/kubernetes version go.mod requires.
func TestVersionMatchesGoMod(t *testing.T) {
	dir, err := ModuleDir()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "k8s.io/kubernetes")
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("asking go list for the k8s.io/kubernetes version: %v", err)
	}
	if got := strings.TrimSpace(string(out)); got != Version {
		t.Fatalf("go.mod requires k8s.io/kubernetes %s but kubebin.Version is %s", got, Version)
	}
}

func TestLDFlags(t *testing.T) {
	got := LDFlags()
	for _, want := range []string{
		"-X k8s.io/component-base/version.gitVersion=" + Version,
		"-X k8s.io/component-base/version.gitMajor=1",
		"-X k8s.io/client-go/pkg/version.gitVersion=" + Version,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("LDFlags() = %q, missing %q", got, want)
		}
	}
	minor := strings.Split(Version, ".")[1]
	if !strings.Contains(got, "-X k8s.io/component-base/version.gitMinor="+minor+" ") {
		t.Errorf("LDFlags() = %q, missing gitMinor=%s", got, minor)
	}
}
