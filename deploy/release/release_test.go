package release

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestBaseDeploysTheRelease: the kustomize base pins draind's image to
// Version, never to a moving tag.
func TestBaseDeploysTheRelease(t *testing.T) {
	b, err := os.ReadFile("../daemonset/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
			Digest  string `json:"digest"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, img := range k.Images {
		if img.Name != "ghcr.io/draind/draind" {
			continue
		}
		found = true
		if img.NewTag != Version {
			t.Errorf("the base deploys ghcr.io/draind/draind:%s, want the release %s", img.NewTag, Version)
		}
		if img.NewName != "" || img.Digest != "" {
			t.Errorf("the base renames or pins the image by digest (%+v): the release tag is what it must deploy", img)
		}
	}
	if !found {
		t.Error("the base has no images entry for ghcr.io/draind/draind")
	}
}

// TestDockerfileStampsTheRelease: the Dockerfile's VERSION defaults to
// Version, its -X flags are exactly LDFlags' (so an image builder using
// LDFlags stamps the same), and every base image is pinned by digest.
func TestDockerfileStampsTheRelease(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	df := string(b)
	if !strings.Contains(df, "\nARG VERSION="+Version+"\n") {
		t.Errorf("the Dockerfile's VERSION does not default to %s", Version)
	}
	m := regexp.MustCompile(`-ldflags "([^"]*)"`).FindStringSubmatch(df)
	if m == nil {
		t.Fatal("no -ldflags in the Dockerfile")
	}
	want := "-s -w " + LDFlags(Stamp{Version: "${VERSION}", Commit: "${COMMIT}", Date: "${DATE}"})
	if m[1] != want {
		t.Errorf("the Dockerfile stamps with %q, want %q (release.LDFlags)", m[1], want)
	}
	from := regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?(\S+)`).FindAllStringSubmatch(df, -1)
	if len(from) < 2 {
		t.Fatalf("want a build and a final stage, found %d FROM lines", len(from))
	}
	pinned := regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)
	for _, f := range from {
		if !pinned.MatchString(f[1]) {
			t.Errorf("base image %s is not pinned by digest", f[1])
		}
	}
}

func TestLDFlags(t *testing.T) {
	for _, tc := range []struct {
		s    Stamp
		want string
	}{
		{Stamp{Version: "v1.2.3", Commit: "abc", Date: "2026-11-30T00:00:00Z"}, "-X main.version=v1.2.3 -X main.commit=abc -X main.date=2026-11-30T00:00:00Z"},
		{Stamp{Commit: "abc"}, "-X main.version=" + Version + " -X main.commit=abc"},
		{Stamp{}, "-X main.version=" + Version},
	} {
		if got := LDFlags(tc.s); got != tc.want {
			t.Errorf("LDFlags(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}
