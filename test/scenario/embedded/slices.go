package embedded

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/draind/draind/k8s"
)

// sliceManagedBy marks the slices the stand-in writes: the controller's own
// label, as the stand-in plays the EndpointSlice controller (draind trusts
// only the controller's slices of Services with a selector).
const sliceManagedBy = k8s.ManagedByController

// sliceController stands in for kube-controller-manager's EndpointSlice
// controller: one IPv4 slice per selector Service, its endpoints the
// Service's pods with their conditions (ready, serving, terminating), as
// the real controller publishes them. It writes Delay after a change (the
// real one publishes a graceful delete within 12–35 ms here).
type sliceController struct {
	client   kubernetes.Interface
	pods     corelisters.PodLister
	services corelisters.ServiceLister
	delay    time.Duration
	log      *slog.Logger
	kick     chan struct{}

	written map[string]*discoveryv1.EndpointSlice // namespace/name -> last written
}

func newSliceController(client kubernetes.Interface, pods corelisters.PodLister, services corelisters.ServiceLister, delay time.Duration, log *slog.Logger) *sliceController {
	return &sliceController{client: client, pods: pods, services: services, delay: delay, log: log,
		kick: make(chan struct{}, 1), written: map[string]*discoveryv1.EndpointSlice{}}
}

// changed records that pods or Services changed (informer handlers).
func (s *sliceController) changed() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *sliceController) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		if !sleepCtx(ctx, s.delay) {
			return
		}
		s.sync(ctx)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (s *sliceController) sync(ctx context.Context) {
	svcs, _ := s.services.List(labels.Everything())
	pods, _ := s.pods.List(labels.Everything())
	want := map[string]*discoveryv1.EndpointSlice{}
	for _, svc := range svcs {
		if sl := desiredSlice(svc, pods); sl != nil {
			want[sl.Namespace+"/"+sl.Name] = sl
		}
	}
	api := s.client.DiscoveryV1().EndpointSlices
	for key, sl := range want {
		old, ok := s.written[key]
		var err error
		switch {
		case !ok:
			_, err = api(sl.Namespace).Create(ctx, sl, metav1.CreateOptions{})
		case !apiequality.Semantic.DeepEqual(old.Endpoints, sl.Endpoints) || !apiequality.Semantic.DeepEqual(old.Ports, sl.Ports):
			_, err = api(sl.Namespace).Update(ctx, sl, metav1.UpdateOptions{})
		default:
			continue
		}
		if err != nil {
			s.log.Error("writing endpointslice", "slice", key, "err", err)
			continue
		}
		s.written[key] = sl
	}
	for key, old := range s.written {
		if _, ok := want[key]; ok {
			continue
		}
		err := api(old.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			s.log.Error("deleting endpointslice", "slice", key, "err", err)
			continue
		}
		delete(s.written, key)
	}
}

// desiredSlice is the IPv4 EndpointSlice of a selector Service: every pod
// of its namespace matching the selector that has an IPv4 address and has
// not finished, with the real controller's conditions — ready when Ready
// and not terminating, serving when Ready, terminating once deleted. It is
// nil for a Service without a selector.
func desiredSlice(svc *corev1.Service, pods []*corev1.Pod) *discoveryv1.EndpointSlice {
	if len(svc.Spec.Selector) == 0 {
		return nil
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	var eps []discoveryv1.Endpoint
	for _, p := range pods {
		if p.Namespace != svc.Namespace || !sel.Matches(labels.Set(p.Labels)) ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		ip := podIPv4(p)
		if !ip.IsValid() {
			continue
		}
		ready := podReady(p)
		terminating := p.DeletionTimestamp != nil
		node := p.Spec.NodeName
		eps = append(eps, discoveryv1.Endpoint{
			Addresses: []string{ip.String()},
			Conditions: discoveryv1.EndpointConditions{
				Ready: ptr(ready && !terminating), Serving: ptr(ready), Terminating: ptr(terminating),
			},
			NodeName:  &node,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		})
	}
	slices.SortFunc(eps, func(a, b discoveryv1.Endpoint) int { return strings.Compare(a.Addresses[0], b.Addresses[0]) })
	var ports []discoveryv1.EndpointPort
	for _, sp := range svc.Spec.Ports {
		ports = append(ports, discoveryv1.EndpointPort{Name: ptr(sp.Name), Protocol: ptr(sp.Protocol), Port: ptr(sp.TargetPort.IntVal)})
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: svc.Namespace, Name: svc.Name + "-standin",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: sliceManagedBy},
			// The controller's reference to its Service: draind trusts a
			// slice only with it.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID, Controller: ptr(true)}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       ports,
	}
}

func podIPv4(p *corev1.Pod) netip.Addr {
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
