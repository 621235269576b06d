package k8s

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/draind/draind/bpf"
)

// fullSlice is an EndpointSlice as the API serves it, with every field draind
// does not read filled in too (managed fields, annotations, owner, hints,
// zones, hostnames).
func fullSlice() *discoveryv1.EndpointSlice {
	yes, no := true, false
	port, proto, name := int32(8080), corev1.ProtocolTCP, "http"
	node, zone, host := "node-7", "zone-a", "h"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-x7k2p", GenerateName: "web-", Namespace: "shop", UID: "5e1c0000-0000-0000-0000-000000000001",
			ResourceVersion: "4711", Generation: 3, CreationTimestamp: metav1.Now(),
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: ManagedByController, "app": "web"},
			Annotations:     map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "5e4f0000-0000-0000-0000-000000000001", Controller: &yes}},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: metav1.ManagedFieldsOperationUpdate,
				FieldsV1: metav1.NewFieldsV1(`{"f:endpoints":{}}`)}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto, AppProtocol: &name}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1", "10.0.0.100"}, Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
				NodeName: &node, Zone: &zone, Hostname: &host, DeprecatedTopology: map[string]string{"kubernetes.io/hostname": node},
				Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}, ForNodes: []discoveryv1.ForNode{{Name: node}}},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4b9c8f6-x2kq9", UID: "0f8e2a4c-1b3d-4e5f-9a6b-7c8d9e0fa1b2", ResourceVersion: "99"}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes},
				NodeName: &node, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4b9c8f6-abcde", UID: "not-a-uuid"}},
			{Addresses: []string{"10.0.0.3"}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "other", Name: "x", UID: "u3"}},
		},
	}
}

// fullService is a Service as the API serves it, likewise.
func fullService() *corev1.Service {
	local := corev1.ServiceInternalTrafficPolicyLocal
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "5e4f0000-0000-0000-0000-000000000001", ResourceVersion: "12",
			Labels: map[string]string{"app": "web"},
			Annotations: map[string]string{AnnotationPodIPSteering: "refuse", AnnotationEndDeadConnections: "false",
				"kubectl.kubernetes.io/last-applied-configuration": `{"big":"blob"}`},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: metav1.NewFieldsV1(`{}`)}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
			Selector: map[string]string{"app": "web"}, SessionAffinity: corev1.ServiceAffinityClientIP, InternalTrafficPolicy: &local,
			ExternalIPs: []string{"192.0.2.1"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
				{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}},
	}
}

// TestTransformsKeepWhatDraindReads runs the informers' transforms on full
// API objects and checks every field of the slim forms (all that draind
// reads of Services and slices) against the API objects, field by field;
// and that the slim objects are keyed in the informers' stores like the
// API objects.
func TestTransformsKeepWhatDraindReads(t *testing.T) {
	inf := &Informers{}
	src := fullSlice()
	obj, err := slimTransform(inf, inf.sliceFrom)(src.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	sl := obj.(*Slice)
	// Not the slice's UID: draind never reads it.
	wantMeta := Meta{Name: src.Name, Namespace: src.Namespace, ResourceVersion: src.ResourceVersion}
	if sl.Meta != wantMeta || sl.Service != "web" || !sl.Controller || sl.Family != IPv4 {
		t.Errorf("slice: %+v", sl)
	}
	if want := []SlicePort{{"http", 8080, bpf.TCP}}; !slices.Equal(sl.Ports, want) {
		t.Errorf("slice ports %v, want %v", sl.Ports, want)
	}
	wantEps := []Endpoint{
		{Addr: netip.MustParseAddr("10.0.0.1"), Conds: CondReady | CondServing, Node: "node-7", PodUID: "0f8e2a4c-1b3d-4e5f-9a6b-7c8d9e0fa1b2", PodName: "web-7d4b9c8f6-x2kq9"},
		{Addr: netip.MustParseAddr("10.0.0.2"), Conds: CondServing | CondTerminating, Node: "node-7", PodUID: "not-a-uuid", PodName: "web-7d4b9c8f6-abcde"},
		{Addr: netip.MustParseAddr("10.0.0.3"), Conds: CondReady | CondServing}, // a pod of another namespace: no identity
	}
	if sl.Len() != len(wantEps) {
		t.Fatalf("%d endpoints, want %d", sl.Len(), len(wantEps))
	}
	wantHints := []*Hints{{Zones: []string{"zone-a"}, Nodes: []string{"node-7"}}, nil, nil}
	for i, want := range wantEps {
		got := sl.Endpoint(i)
		if !reflect.DeepEqual(got.Hints, wantHints[i]) {
			t.Errorf("endpoint %d: hints %+v, want %+v", i, got.Hints, wantHints[i])
		}
		if got.Hints = nil; got != want {
			t.Errorf("endpoint %d: %+v, want %+v", i, got, want)
		}
	}
	if !sl.Trusted(&Service{Meta: Meta{UID: "5e4f0000-0000-0000-0000-000000000001"}, HasSelector: true}) {
		t.Error("the controller's slice of a Service with a selector is not trusted")
	}
	if sl.Trusted(&Service{Meta: Meta{UID: "5e4f0000-0000-0000-0000-000000000002"}, HasSelector: true}) {
		t.Error("a slice is trusted for a Service its ownerReference does not name")
	}

	svcSrc := fullService()
	obj, err = slimTransform(inf, ServiceFrom)(svcSrc.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	svc := obj.(*Service)
	want := &Service{Meta: Meta{Name: "web", Namespace: "shop", UID: "5e4f0000-0000-0000-0000-000000000001", ResourceVersion: "12"},
		ClusterIPs: []netip.Addr{netip.MustParseAddr("10.96.0.10"), netip.MustParseAddr("fd00:96::10")},
		Ports:      []ServicePort{{"http", 80, bpf.TCP}, {"dns", 53, bpf.UDP}}, AffinityClientIP: true, InternalLocal: true,
		PodIPSteering: "refuse", HasSelector: true, EndDeadConnections: "false"}
	if svc.Meta != want.Meta || !slices.Equal(svc.ClusterIPs, want.ClusterIPs) || !slices.Equal(svc.Ports, want.Ports) ||
		svc.Headless != want.Headless || svc.AffinityClientIP != want.AffinityClientIP || svc.InternalLocal != want.InternalLocal ||
		svc.PodIPSteering != want.PodIPSteering || svc.HasSelector != want.HasSelector || svc.EndDeadConnections != want.EndDeadConnections {
		t.Errorf("service %+v, want %+v", svc, want)
	}
	if inf.Malformed.Load() != 0 {
		t.Errorf("%d objects counted malformed", inf.Malformed.Load())
	}

	// The stores key slim objects as they key the API objects.
	for _, o := range []struct{ slim, full any }{{sl, src}, {svc, svcSrc}} {
		k1, err1 := cache.DeletionHandlingMetaNamespaceKeyFunc(o.slim)
		k2, err2 := cache.DeletionHandlingMetaNamespaceKeyFunc(o.full)
		if err1 != nil || err2 != nil || k1 != k2 {
			t.Errorf("slim object keyed %q (%v), the API object %q (%v)", k1, err1, k2, err2)
		}
	}
}

// TestTransformsIdempotent: an object the informer delivers again already
// slim (or as a tombstone) passes through unchanged.
func TestTransformsIdempotent(t *testing.T) {
	inf := &Informers{}
	for name, tf := range map[string]func(any) (any, error){"slices": slimTransform(inf, inf.sliceFrom), "services": slimTransform(inf, ServiceFrom)} {
		var full any = fullSlice()
		if name == "services" {
			full = fullService()
		}
		once, err := tf(full)
		if err != nil {
			t.Fatal(err)
		}
		twice, err := tf(once)
		if err != nil || twice != once {
			t.Errorf("%s: transforming a slim object again gave %p (%v), want the same %p", name, twice, err, once)
		}
		tomb := cache.DeletedFinalStateUnknown{Key: "shop/web", Obj: once}
		if got, err := tf(tomb); err != nil || got != tomb {
			t.Errorf("%s: a tombstone became %+v (%v)", name, got, err)
		}
	}
}

// TestInformersCacheSlimObjects: through the real informers (fake API),
// the stores hold the slim objects under the API objects' keys, and an
// update replaces them.
func TestInformersCacheSlimObjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		client := fake.NewClientset(fullSlice(), fullService())
		inf := NewInformers(client, Config{Namespace: "draind-system", NodeName: "node-7"})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go inf.RunAndWait(ctx)
		if err := inf.WaitForSync(ctx); err != nil {
			t.Fatal(err)
		}
		if got := inf.SlicesOf("shop/web"); len(got) != 1 || got[0].Name != "web-x7k2p" || got[0].Len() != 3 {
			t.Fatalf("slices of shop/web: %+v", got)
		}
		if got := inf.SlicesInNamespace("shop"); len(got) != 1 {
			t.Errorf("slices in shop: %d", len(got))
		}
		if got := inf.Service("shop/web"); got == nil || got.PodIPSteering != "refuse" || !got.HasSelector {
			t.Fatalf("service shop/web: %+v", got)
		}
		s := fullSlice()
		s.ResourceVersion = "4712"
		s.Endpoints = s.Endpoints[:1]
		if _, err := client.DiscoveryV1().EndpointSlices("shop").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the informer handles the update
		if got := inf.SlicesOf("shop/web"); len(got) != 1 || got[0].Len() != 1 {
			t.Fatalf("the update did not reach the store: slices of shop/web %+v", got)
		}
		if keys := inf.Slices.GetStore().ListKeys(); !slices.Equal(keys, []string{"shop/web-x7k2p"}) {
			t.Errorf("store keys %v", keys)
		}
	})
}
