package kube

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// WorkloadControllers are the kube-controller-manager controllers that turn
// Deployments into pods; add them with Config.ControllerManagerArgs
// ("--controllers=" + WorkloadControllers: the flag's values add up). There
// is no garbage collector: a test deletes what it created itself, or leaves
// it to the cluster's end.
const WorkloadControllers = "deployment,replicaset"

// CreateObjects creates rendered manifests (kustomize output) as the admin,
// with strict field validation, in order. Kinds are resolved through
// discovery, retried for up to a minute (CRDs appear in discovery shortly
// after they are established).
func (c *Cluster) CreateObjects(ctx context.Context, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		return fmt.Errorf("creating a dynamic client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.AdminConfig)
	if err != nil {
		return fmt.Errorf("creating a discovery client: %w", err)
	}
	var m meta.RESTMapper
	var last error
	err = Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		groups, err := restmapper.GetAPIGroupResources(dc)
		if err != nil {
			last = err
			return false, nil
		}
		m = restmapper.NewDiscoveryRESTMapper(groups)
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			if _, err := m.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				last = err
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("resolving the kinds to create (last: %v): %w", last, err)
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		mapping, err := m.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return err
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			return fmt.Errorf("creating %s %s/%s: %w", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
	}
	return nil
}
