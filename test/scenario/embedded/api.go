package embedded

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// nodeView is one node's draind's view of the shared fake API. The fake
// ignores field selectors, so without it every daemon would take every
// pod of the cluster for one of its own node's (spec.nodeName): it
// filters pod lists and watches by the field selector the way the real
// apiserver does. Embedding the concrete *fake.Clientset keeps what the
// informers probe for (no WatchList support).
type nodeView struct {
	*fake.Clientset
}

var _ kubernetes.Interface = nodeView{}

func (v nodeView) CoreV1() typedcorev1.CoreV1Interface {
	return coreView{v.Clientset.CoreV1()}
}

type coreView struct {
	typedcorev1.CoreV1Interface
}

func (c coreView) Pods(namespace string) typedcorev1.PodInterface {
	return podView{c.CoreV1Interface.Pods(namespace)}
}

type podView struct {
	typedcorev1.PodInterface
}

// podFields are the pod fields a field selector may name here.
func podFields(p *corev1.Pod) fields.Set {
	return fields.Set{
		"metadata.name":      p.Name,
		"metadata.namespace": p.Namespace,
		"spec.nodeName":      p.Spec.NodeName,
		"status.phase":       string(p.Status.Phase),
	}
}

func (p podView) List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
	sel, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, err
	}
	l, err := p.PodInterface.List(ctx, opts)
	if err != nil || sel.Empty() {
		return l, err
	}
	out := l.DeepCopy()
	out.Items = out.Items[:0]
	for _, it := range l.Items {
		if sel.Matches(podFields(&it)) {
			out.Items = append(out.Items, it)
		}
	}
	return out, nil
}

func (p podView) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	sel, err := fields.ParseSelector(opts.FieldSelector)
	if err != nil {
		return nil, err
	}
	w, err := p.PodInterface.Watch(ctx, opts)
	if err != nil || sel.Empty() {
		return w, err
	}
	return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
		pod, ok := e.Object.(*corev1.Pod)
		return e, !ok || sel.Matches(podFields(pod))
	}), nil
}
