package model

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// fuzzState is an in-memory State for the model fuzzer.
type fuzzState struct {
	svc    *k8s.Service
	slices []*k8s.Slice
	leases []*k8s.DrainLease
	pods   []*k8s.Pod
}

func (s *fuzzState) Service(key string) *k8s.Service {
	if s.svc != nil && s.svc.Namespace+"/"+s.svc.Name == key {
		return s.svc
	}
	return nil
}
func (s *fuzzState) SlicesOf(key string) []*k8s.Slice {
	var out []*k8s.Slice
	for _, sl := range s.slices {
		if sl.Namespace+"/"+sl.Service == key {
			out = append(out, sl)
		}
	}
	return out
}
func (s *fuzzState) SlicesInNamespace(ns string) []*k8s.Slice { return s.slices }
func (s *fuzzState) DrainLeases() []*k8s.DrainLease           { return s.leases }
func (s *fuzzState) LocalPods() []*k8s.Pod                    { return s.pods }

// FuzzModel feeds API objects as an attacker (or a buggy controller) could
// write them, annotations included, through the slim transforms, the
// categorisation, the model and the merge into entries: nothing panics,
// and every entry that rewrites names a backend set that exists.
func FuzzModel(f *testing.F) {
	svc, _ := json.Marshal(corev1.Service{Spec: corev1.ServiceSpec{ClusterIPs: []string{"10.96.0.10", "fd00:96::10"},
		Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Name: "http", Port: 80}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}}})
	sl, _ := json.Marshal(seedSlice())
	pod, _ := json.Marshal(corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pod-a", Namespace: "default", UID: "a"},
		Spec: corev1.PodSpec{NodeName: testNode}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}}})
	lease, _ := json.Marshal(coordinationv1.Lease{})
	f.Add(svc, sl, pod, lease, "rewrite")
	f.Add(svc, sl, pod, lease, "refuse")
	f.Add(svc, sl, pod, lease, "bogus\x00value")
	f.Add([]byte(`{"metadata":{"name":"web","namespace":"default"},"spec":{"clusterIP":"None","ports":[{"port":70000}]}}`),
		[]byte(`{"metadata":{"name":"x","namespace":"default","labels":{"kubernetes.io/service-name":"web","endpointslice.kubernetes.io/managed-by":"endpointslice-controller.k8s.io"}},"addressType":"IPv4","ports":[{"port":-1}],"endpoints":[{"addresses":["::1"]},{"addresses":[]},{"addresses":["10.0.0.1"],"targetRef":{"kind":"Pod","namespace":"other","uid":"z"}}]}`),
		[]byte(`{"status":{"podIPs":[{"ip":"junk"}]}}`),
		[]byte(`{"metadata":{"name":"drain-z","annotations":{"draind.io/pod-uid":"z","draind.io/pod-name":"p","draind.io/pod-namespace":"default","draind.io/pod-ips":"10.0.0.1,::ffff:10.0.0.1,zz"}},"spec":{"leaseDurationSeconds":-5}}`),
		"off")
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON, podJSON, leaseJSON []byte, policy string) {
		var (
			s  corev1.Service
			es discoveryv1.EndpointSlice
			p  corev1.Pod
			l  coordinationv1.Lease
		)
		st := &fuzzState{}
		if json.Unmarshal(svcJSON, &s) == nil {
			s.Name, s.Namespace = "web", "default"
			if s.Annotations == nil {
				s.Annotations = map[string]string{}
			}
			s.Annotations[k8s.AnnotationPodIPSteering] = policy
			st.svc, _ = k8s.ServiceFrom(&s)
		}
		if json.Unmarshal(sliceJSON, &es) == nil {
			es.Namespace = "default"
			sl, _ := k8s.SliceFrom(&es, nil)
			st.slices = append(st.slices, sl)
		}
		if json.Unmarshal(podJSON, &p) == nil {
			st.pods = append(st.pods, k8s.PodFrom(&p))
		}
		if json.Unmarshal(leaseJSON, &l) == nil {
			if dl, err := k8s.ParseLease(&l); err == nil {
				st.leases = append(st.leases, dl)
			}
		}
		cl := NewClaims(clock.RealClock{}, time.Minute)
		for _, sl := range st.slices {
			cl.SetSlice(sl.Namespace+"/"+sl.Name, sl)
		}
		cl.SetLocalPods(st.pods)
		m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: time.Minute, RegistryOnlyPolicy: bpf.PolicyRefuse}, st, cl)
		now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
		drains := map[types.UID]*PodDrain{}
		for _, dl := range st.leases {
			drains[dl.PodUID] = &PodDrain{UID: dl.PodUID, Namespace: dl.PodNamespace, Name: dl.PodName, IPs: dl.IPs, Reason: dl.Reason, Expires: dl.Expires()}
		}
		m.SetPodDrains(drains)
		m.RecomputeService("default/web", now)
		checkContributionIndex(t, m)
		m.RecomputeService("default/web", now) // again: the same keys withdrawn and contributed anew
		checkContributionIndex(t, m)
		listed := st.slices
		st.slices = nil // every endpoint departs
		m.RecomputeService("default/web", now.Add(time.Second))
		checkContributionIndex(t, m)
		defer func() {
			st.slices = listed // listed again: lingers of endpoints not draining end
			m.RecomputeService("default/web", now.Add(2*time.Second))
			checkContributionIndex(t, m)
			m.ExpireLingering(now.Add(time.Hour))
			checkContributionIndex(t, m)
			if len(m.lingering) != 0 {
				t.Fatalf("%d lingering after every linger ended", len(m.lingering))
			}
		}()
		for k := range m.contributions {
			dr, ok := m.desiredDrain(k, now)
			if !ok || dr.Policy != bpf.PolicyRewrite {
				continue
			}
			if _, be := m.desiredServicePort(dr.Service, now); be == nil || len(m.servicePorts[dr.Service].selectable.AppendAddrPorts(nil)) == 0 {
				t.Fatalf("%v rewrites to service-port %d, which has no backends", k, dr.Service)
			}
		}
		m.PodStatuses()
	})
}

// checkContributionIndex: every key in the model's contributions has one,

// seedSlice is the EndpointSlice controller's slice of Service web: a terminating, a
// ready and a not-ready endpoint at port http 8080.
func seedSlice() *discoveryv1.EndpointSlice {
	name, port, proto, yes := "http", int32(8080), corev1.ProtocolTCP, true
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: "web",
			discoveryv1.LabelManagedBy: k8s.ManagedByController},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "svc-default-web", Controller: &yes}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for _, e := range []struct {
		ip, uid                     string
		ready, serving, terminating bool
	}{{"10.0.0.1", "a", false, true, true}, {"10.0.0.2", "b", true, true, false}, {"10.0.0.3", "c", false, false, false}} {
		node := testNode
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: &e.ready, Serving: &e.serving, Terminating: &e.terminating},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "pod-" + e.uid, UID: types.UID(e.uid)}})
	}
	return s
}

// and byIP lists exactly those keys.
func checkContributionIndex(t *testing.T, m *Model) {
	t.Helper()
	n := 0
	for k, cs := range m.contributions {
		if len(cs) == 0 {
			t.Fatalf("%v kept with no contribution", k)
		}
		if !slices.Contains(m.byIP[k.Addr], k) {
			t.Fatalf("%v missing from byIP", k)
		}
	}
	for _, keys := range m.byIP {
		n += len(keys)
	}
	if n != len(m.contributions) {
		t.Fatalf("byIP lists %d keys, contributions %d", n, len(m.contributions))
	}
	// lingerKeys and lingerByPod list each lingering key once, under its
	// service-port and its pod; the queue holds every record.
	checkLingerIndex(t, "lingerKeys", m.lingerKeys, m.lingering, func(l *lingerRecord) bpf.ServicePortID { return l.c.servicePort })
	checkLingerIndex(t, "lingerByPod", m.lingerByPod, m.lingering, func(l *lingerRecord) types.UID { return l.c.uid })
	for k, l := range m.lingering {
		if !slices.Contains(m.lingerQueue, queuedLinger{k, l}) {
			t.Fatalf("%v lingers until %v, not in the queue", k, l.until)
		}
	}
}

// checkLingerIndex: index lists every lingering key once, under the
// record's own of (its service-port, its pod).
func checkLingerIndex[K comparable](t *testing.T, name string, index map[K][]bpf.EndpointKey, lingering map[bpf.EndpointKey]*lingerRecord, of func(*lingerRecord) K) {
	t.Helper()
	n := 0
	for at, keys := range index {
		for _, k := range keys {
			if l := lingering[k]; l == nil || of(l) != at {
				t.Fatalf("%s lists %v under %v: not lingering there", name, k, at)
			}
		}
		n += len(keys)
	}
	if n != len(lingering) {
		t.Fatalf("%s lists %d keys, lingering %d", name, n, len(lingering))
	}
}
