package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// testOnlyModules are libraries only the demo and the tests need: the
// daemon's binary must not link them.
var testOnlyModules = []string{
	"github.com/google/nftables",
	"sigs.k8s.io/kustomize",
	"k8s.io/client-go/kubernetes/fake",
}

// TestBinaryCarriesNoTestCode keeps the DaemonSet's binary free of the test
// bed, the fake API server and the demo: `go list -deps ./cmd/draind` may
// name no package under the module's test/ tree and none of the test-only
// libraries.
func TestBinaryCarriesNoTestCode(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("SKIP: the go command is not on the PATH: %v", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 50 || !slices.Contains(pkgs, "github.com/draind/draind/daemon") {
		t.Fatalf("go list -deps gave %d packages without the daemon package: not a real listing", len(pkgs))
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p, "github.com/draind/draind/test/") {
			t.Errorf("the daemon binary links test code: %s", p)
		}
		for _, m := range testOnlyModules {
			if p == m || strings.HasPrefix(p, m+"/") {
				t.Errorf("the daemon binary links the test-only library %s", p)
			}
		}
	}
}
