// Package helmchart renders the Helm chart deploy/helm/draind with the Helm
// SDK (the library `helm template` and `helm install` run) and compares it
// with the kustomize base: at default values both install the same
// objects, apart from the labels Helm adds for its own bookkeeping.
//
// Words are defined in the repository's docs/glossary.md.
package helmchart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/common/util"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/draind/draind/test/cluster/draindbin"
)

// ReleaseName is the release name the tests install the chart as.
const ReleaseName = "draind"

// KubeVersion is the Kubernetes version the chart is rendered and linted
// for: the one the cluster bed builds.
const KubeVersion = "v1.37.2"

// HelmLabels are the metadata labels the chart adds to every object and
// the kustomize base does not have: Helm's bookkeeping, which differs by
// release and chart version. Selectors and pod templates never carry them.
var HelmLabels = []string{
	"helm.sh/chart",
	"app.kubernetes.io/managed-by",
	"app.kubernetes.io/instance",
	"app.kubernetes.io/version",
}

// ChartDir returns the chart's directory, deploy/helm/draind.
func ChartDir() (string, error) {
	root, err := draindbin.RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "deploy", "helm", "draind"), nil
}

// Capabilities are those of a cluster of KubeVersion.
func Capabilities() (*common.Capabilities, error) {
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		return nil, err
	}
	caps := common.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	return caps, nil
}

// Render renders the chart as `helm template --namespace namespace` with
// the given values (validated against values.schema.json) and returns its
// objects sorted by file name and position, without NOTES.txt.
func Render(namespace string, values map[string]any) ([]*unstructured.Unstructured, error) {
	dir, err := ChartDir()
	if err != nil {
		return nil, err
	}
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("loading chart %s: %w", dir, err)
	}
	caps, err := Capabilities()
	if err != nil {
		return nil, err
	}
	opts := common.ReleaseOptions{Name: ReleaseName, Namespace: namespace, Revision: 1, IsInstall: true}
	vals, err := util.ToRenderValuesWithSchemaValidation(ch, values, opts, caps, false)
	if err != nil {
		return nil, fmt.Errorf("values of chart %s: %w", dir, err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return nil, fmt.Errorf("rendering chart %s: %w", dir, err)
	}
	names := make([]string, 0, len(files))
	for n := range files {
		if strings.HasSuffix(n, ".yaml") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, n := range names {
		objs, err := decodeAll(files[n])
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", n, err)
		}
		out = append(out, objs...)
	}
	return out, nil
}

// decodeAll decodes a multi-document YAML stream, skipping empty documents
// (a template whose condition is off).
func decodeAll(s string) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewBufferString(s), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Key names an object uniquely within one install.
func Key(o *unstructured.Unstructured) string {
	return o.GroupVersionKind().GroupKind().String() + " " + o.GetNamespace() + "/" + o.GetName()
}

// WithoutHelmLabels returns a copy of o without HelmLabels, and an error
// when o lacks any of them (the chart promises them on every object).
func WithoutHelmLabels(o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	c := o.DeepCopy()
	labels := c.GetLabels()
	var missing []string
	for _, l := range HelmLabels {
		if _, ok := labels[l]; !ok {
			missing = append(missing, l)
		}
		delete(labels, l)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s lacks the labels %v", Key(o), missing)
	}
	c.SetLabels(labels)
	return c, nil
}
