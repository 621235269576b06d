package realnode_test

import (
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/deploy/image"
	"github.com/draind/draind/test/cluster/realnode"
	"github.com/draind/draind/test/readme"
)

// TestREADMERecipe checks, without root, that the documented curl-less
// preStop recipe fits the image: the init container runs the binary where
// the image has it, from a pinned tag of draind's repository (":latest" is
// always pulled), copies it where the preStop hook runs it, and the grace
// period outlasts the wait.
func TestREADMERecipe(t *testing.T) {
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	recipe, err := realnode.READMEBlock([]byte(doc.Text), recipeMarker)
	if err != nil {
		t.Fatal(err)
	}
	spec, err := realnode.WithRecipe(recipe)
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.InitContainers) != 1 {
		t.Fatalf("want one init container, got %d", len(spec.InitContainers))
	}
	ic := spec.InitContainers[0]
	if len(ic.Command) != 3 || ic.Command[0] != image.DraindBinary || ic.Command[1] != "copy-self" {
		t.Errorf("init container command %q: want [%s copy-self DEST]", ic.Command, image.DraindBinary)
	}
	repo, tag, ok := strings.Cut(ic.Image, ":")
	if !ok || repo != image.DraindRepository || tag == "latest" || tag == "" {
		t.Errorf("init container image %q: want %s:<pinned tag>", ic.Image, image.DraindRepository)
	}
	app := spec.Containers[0]
	if app.Name != "app" || app.Image != realnode.AppImage {
		t.Fatalf("the recipe did not merge into the app container: %+v", app)
	}
	ps := app.Lifecycle.PreStop
	if ps == nil || ps.Exec == nil || len(ps.Exec.Command) < 2 || ps.Exec.Command[1] != "offline" {
		t.Fatalf("app preStop %+v: want [<copied draind> offline ...]", ps)
	}
	if ps.Exec.Command[0] != ic.Command[2] {
		t.Errorf("preStop runs %s but the init container copies to %s", ps.Exec.Command[0], ic.Command[2])
	}
	var wait time.Duration
	for _, a := range ps.Exec.Command[2:] {
		if v, ok := strings.CutPrefix(a, "--wait="); ok {
			if wait, err = time.ParseDuration(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= wait {
		t.Errorf("terminationGracePeriodSeconds %v does not outlast --wait=%v", g, wait)
	}
	if len(app.Env) < 2 {
		t.Errorf("app env %v: want POD_NAME and the recipe's HOST_IP", app.Env)
	}
}
