package inject

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/deploy/release"
	"github.com/draind/draind/test/readme"
)

// TestREADMEExample: the README's before/after of an injected pod is what
// Mutate does (the README leaves out the init container's security context,
// resources and pull policy, the fieldRef's apiVersion, and the
// KeySteerOnDelete annotation, which docs/trust.md explains).
func TestREADMEExample(t *testing.T) {
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	i := -1
	for j, b := range doc.Blocks {
		if b.Lang == "yaml" && strings.Contains(b.Text, KeyInjected+": app") {
			if i >= 0 {
				t.Fatalf("%s and %s: two blocks show an injected pod", doc.Blocks[i].Where(), b.Where())
			}
			i = j
		}
	}
	if i < 1 {
		t.Fatal("the README shows no injected pod after a pod as written")
	}
	decode := func(b readme.Block) *corev1.Pod {
		t.Helper()
		var p corev1.Pod
		if err := yaml.UnmarshalStrict([]byte(b.Text), &p); err != nil {
			t.Fatalf("%s: %v", b.Where(), err)
		}
		return &p
	}
	before, after := decode(doc.Blocks[i-1]), decode(doc.Blocks[i])
	grace := int64(30) // the API server's default, set before admission
	before.Spec.TerminationGracePeriodSeconds = &grace
	raw, _ := json.Marshal(before)
	r, err := Mutate(before, true, Options{Image: "ghcr.io/draind/draind:" + release.Version, Namespace: "draind-system", Wait: time.Minute, FallbackSleep: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, got := apply(t, raw, r)
	for i := range got.Spec.InitContainers {
		c := &got.Spec.InitContainers[i]
		c.SecurityContext, c.Resources, c.ImagePullPolicy, c.TerminationMessagePolicy = nil, corev1.ResourceRequirements{}, "", ""
	}
	for i := range got.Spec.Containers {
		for j := range got.Spec.Containers[i].Env {
			if f := got.Spec.Containers[i].Env[j].ValueFrom; f != nil && f.FieldRef != nil {
				f.FieldRef.APIVersion = ""
			}
		}
	}
	delete(got.Annotations, KeySteerOnDelete)
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(after)
	if string(g) != string(w) {
		t.Errorf("%s shows\n%s\nMutate gives\n%s", doc.Blocks[i].Where(), w, g)
	}
}
