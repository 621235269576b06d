package k8s

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

func ptr[T any](v T) *T { return &v }

func TestSliceFrom(t *testing.T) {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "shop", ResourceVersion: "7", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("http"), Port: ptr(int32(8080))}, // protocol unset: TCP
			{Name: ptr("dns"), Port: ptr(int32(53)), Protocol: ptr(corev1.ProtocolUDP)},
			{Name: ptr("sctp"), Port: ptr(int32(9)), Protocol: ptr(corev1.ProtocolSCTP)}, // left alone
			{Name: ptr("bad"), Port: ptr(int32(70000))},                                  // skipped, counted
		},
		Endpoints: []discoveryv1.Endpoint{
			// nil conditions: ready and serving (API semantics).
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr("node-a"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "p1", UID: "u1"}},
			{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}},
			{Addresses: []string{"fd00::1"}}, // wrong family: skipped
			{Addresses: []string{"bogus"}},   // skipped
			{},                               // no address: skipped
			{Addresses: []string{"10.0.0.3"}, TargetRef: &corev1.ObjectReference{Kind: "Node", Name: "n", UID: "n1"}}, // not a pod
		},
	}
	sl, skipped := SliceFrom(s, nil)
	if skipped != 4 {
		t.Errorf("skipped %d, want 4 (a bad port, three bad endpoints)", skipped)
	}
	if sl.Service != "web" || sl.Family != IPv4 || sl.Name != "web-1" || sl.ResourceVersion != "7" {
		t.Errorf("slim slice %+v", sl.Meta)
	}
	wantPorts := []SlicePort{{"http", 8080, bpf.TCP}, {"dns", 53, bpf.UDP}}
	if !slices.Equal(sl.Ports, wantPorts) {
		t.Errorf("ports %v, want %v", sl.Ports, wantPorts)
	}
	if sl.Len() != 3 {
		t.Fatalf("endpoints %+v", sl.endpoints)
	}
	e := sl.Endpoint(0)
	if !e.Ready() || e.Conds&CondServing == 0 || e.Terminating() || e.Node != "node-a" || e.PodUID != "u1" || e.PodName != "p1" {
		t.Errorf("endpoint 0 %+v", e)
	}
	e = sl.Endpoint(1)
	if e.Ready() || e.Conds&CondServing == 0 || !e.Terminating() {
		t.Errorf("endpoint 1 %+v", e)
	}
	if e := sl.Endpoint(2); e.PodUID != "" || e.Addr != netip.MustParseAddr("10.0.0.3") {
		t.Errorf("a non-pod target is not a pod: %+v", e)
	}
	// FQDN slices carry nothing draind steers.
	fq, _ := SliceFrom(&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeFQDN,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"example.com"}}}}, nil)
	if fq.Family != 0 || fq.Len() != 0 {
		t.Errorf("FQDN slice %+v", fq)
	}
}

func TestServiceFrom(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     corev1.ServiceSpec
		ann      string
		ips      []string
		headless bool
		ports    int
		skipped  int
	}{
		{"dual-stack", corev1.ServiceSpec{ClusterIP: "10.96.0.1", ClusterIPs: []string{"10.96.0.1", "fd00:96::1"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}, "", []string{"10.96.0.1", "fd00:96::1"}, false, 1, 0},
		{"clusterIP only (old objects)", corev1.ServiceSpec{ClusterIP: "10.96.0.2",
			Ports: []corev1.ServicePort{{Port: 80}, {Port: 90, Protocol: corev1.ProtocolSCTP}}}, "", []string{"10.96.0.2"}, false, 1, 0},
		{"headless", corev1.ServiceSpec{ClusterIP: "None", ClusterIPs: []string{"None"}}, "off", nil, true, 0, 0},
		{"ExternalName has no VIP", corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "x.example"}, "", nil, false, 0, 0},
		{"bad VIP skipped", corev1.ServiceSpec{ClusterIPs: []string{"nope"}}, "", nil, false, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "n", Annotations: map[string]string{AnnotationPodIPSteering: tc.ann}}, Spec: tc.spec}
			got, skipped := ServiceFrom(s)
			var ips []string
			for _, ip := range got.ClusterIPs {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tc.ips) || got.Headless != tc.headless || len(got.Ports) != tc.ports || skipped != tc.skipped || got.PodIPSteering != tc.ann {
				t.Errorf("got %+v skipped %d", got, skipped)
			}
		})
	}
	affinity := &corev1.Service{Spec: corev1.ServiceSpec{SessionAffinity: corev1.ServiceAffinityClientIP,
		InternalTrafficPolicy: ptr(corev1.ServiceInternalTrafficPolicyLocal)}}
	if got, _ := ServiceFrom(affinity); !got.AffinityClientIP || !got.InternalLocal {
		t.Errorf("traffic semantics lost: %+v", got)
	}
}

func TestPodFrom(t *testing.T) {
	now := metav1.Now()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "n", UID: "u", DeletionTimestamp: &now, Labels: map[string]string{"a": "b"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", HostNetwork: true},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			PodIPs:     []corev1.PodIP{{IP: "10.0.0.1"}, {IP: "fd00::1"}, {IP: "junk"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	got := PodFrom(p)
	if got.Node != "node-a" || !got.HostNetwork || !got.Ready || got.Phase != corev1.PodRunning || !got.Deleting() ||
		len(got.IPs) != 2 || got.Labels != nil {
		t.Errorf("slim pod %+v", got)
	}
	// Only status.podIP (old kubelets): still known.
	if got := PodFrom(&corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.2"}}); len(got.IPs) != 1 {
		t.Errorf("podIP only: %+v", got.IPs)
	}
}

// TestSliceEndpointsPacked: what a slice stores packed reads back as it was
// given, in every address form; what the API would refuse is skipped.
func TestSliceEndpointsPacked(t *testing.T) {
	in := []Endpoint{
		{Addr: netip.MustParseAddr("10.0.0.1"), Conds: CondReady | CondServing, Node: "node-a", PodUID: "u1", PodName: "p1"},
		{Addr: netip.MustParseAddr("fd00::1"), Conds: CondTerminating, Node: "node-b", PodUID: "u2", PodName: "p2"},
		{Addr: netip.MustParseAddr("::ffff:10.0.0.2"), Node: "node-a"},                         // stays IPv4-mapped IPv6
		{Addr: netip.MustParseAddr("10.0.0.3")},                                                // no node, no pod
		{Addr: netip.MustParseAddr("fe80::1%eth0"), PodUID: "u5"},                              // a zone: skipped
		{Addr: netip.MustParseAddr("10.0.0.6"), PodUID: types.UID(strings.Repeat("u", 70000))}, // skipped
	}
	var s Slice
	if skipped := s.setEndpoints(in); skipped != 2 {
		t.Errorf("skipped %d, want 2", skipped)
	}
	if s.Len() != 4 {
		t.Fatalf("%d endpoints, want 4", s.Len())
	}
	for i := range s.Len() {
		if got := s.Endpoint(i); got != in[i] {
			t.Errorf("endpoint %d: %+v, want %+v", i, got, in[i])
		}
	}
	checkAccessors(t, &s, in)
}

// checkAccessors checks the allocation-free accessors against the
// endpoints the slice was given.
func checkAccessors(t *testing.T, s *Slice, in []Endpoint) {
	t.Helper()
	for i := range s.Len() {
		if s.Addr(i) != in[i].Addr || s.HasPod(i) != (in[i].PodUID != "") || s.Ready(i) != in[i].Ready() {
			t.Errorf("endpoint %d: Addr %v HasPod %v Ready %v, want %+v", i, s.Addr(i), s.HasPod(i), s.Ready(i), in[i])
		}
		if s.PodKey(i) != PodKeyOf(in[i].PodUID) {
			t.Errorf("endpoint %d: PodKey %+v, PodKeyOf(%q) %+v", i, s.PodKey(i), in[i].PodUID, PodKeyOf(in[i].PodUID))
		}
		for j := range s.Len() {
			same := in[i].PodUID == in[j].PodUID
			if (s.PodKey(i) == s.PodKey(j)) != same || (s.PodKey(i).Compare(s.PodKey(j)) == 0) != same {
				t.Errorf("endpoints %d and %d: equal keys %v, equal UIDs %v", i, j, s.PodKey(i) == s.PodKey(j), same)
			}
		}
	}
}

// TestSliceEndpointsCompact: the compact forms (binary UUIDs, names split
// in a shared prefix and a suffix, 4-byte addresses) read back exactly as
// given, and whatever does not fit them is stored as text.
func TestSliceEndpointsCompact(t *testing.T) {
	const uuid = "0f8e2a4c-1b3d-4e5f-9a6b-7c8d9e0fa1b2"
	in := []Endpoint{
		{Addr: netip.MustParseAddr("10.0.0.1"), PodUID: uuid, PodName: "web-7d4b9c8f6-x2kq9"},
		{Addr: netip.MustParseAddr("10.0.0.2"), PodUID: "0F8E2A4C-1B3D-4E5F-9A6B-7C8D9E0FA1B2", PodName: "web-7d4b9c8f6-abcde"}, // upper case: text
		{Addr: netip.MustParseAddr("10.0.0.3"), PodUID: "0f8e2a4c-1b3d-4e5f-9a6b-7c8d9e0fa1bz", PodName: "web-0"},               // not hex: text
		{Addr: netip.MustParseAddr("10.0.0.4"), PodUID: "0f8e2a4c+1b3d-4e5f-9a6b-7c8d9e0fa1b2", PodName: "nodash"},              // no dash where due
		{Addr: netip.MustParseAddr("10.0.0.5"), PodUID: types.UID(uuid[:35]), PodName: "trailing-"},
		{Addr: netip.MustParseAddr("10.0.0.6"), PodUID: "short", PodName: "-"},
		{Addr: netip.MustParseAddr("10.0.0.7"), PodName: "no-uid"},
		{Addr: netip.MustParseAddr("10.0.0.8"), PodUID: uuid},
		{Addr: netip.MustParseAddr("10.0.0.9")},
	}
	// More owners than the shared prefixes are kept for.
	for i := range 20 {
		in = append(in, Endpoint{Addr: netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}), Conds: CondReady,
			PodUID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", i)), PodName: fmt.Sprintf("owner%d-%d", i, i)})
	}
	var s Slice
	if skipped := s.setEndpoints(in); skipped != 0 {
		t.Fatalf("skipped %d", skipped)
	}
	if s.wide || len(s.addrs) != 4*len(in) {
		t.Errorf("IPv4 only: %d address bytes for %d endpoints (wide %v)", len(s.addrs), len(in), s.wide)
	}
	for i := range s.Len() {
		if got := s.Endpoint(i); got != in[i] {
			t.Errorf("endpoint %d: %+v, want %+v", i, got, in[i])
		}
	}
	checkAccessors(t, &s, in)
	if got := s.endpoints[0].flags & (uuidUID | textUID); got != uuidUID {
		t.Errorf("an API server's UUID not stored binary: flags %b", got)
	}
	if got := s.endpoints[1].flags & (uuidUID | textUID); got != textUID {
		t.Errorf("an upper-case UUID not stored as text: flags %b", got)
	}
	// The two pods of one ReplicaSet share its name's copy.
	if strings.Count(s.strs, "web-7d4b9c8f6-") != 1 {
		t.Errorf("prefix stored %d times in %q", strings.Count(s.strs, "web-7d4b9c8f6-"), s.strs)
	}
	if strings.Contains(s.strs, uuid) {
		t.Errorf("a UUID stored as text: %q", s.strs)
	}
	// Reading a binary UUID back costs one allocation, with or without a
	// name in two parts (categorize reads every endpoint of a Service).
	for _, i := range []int{0, 7} {
		if n := testing.AllocsPerRun(100, func() { _ = s.Endpoint(i) }); n > 1 {
			t.Errorf("endpoint %d read with %v allocations, want at most 1", i, n)
		}
	}
}

// TestNodeNumbersConcurrent: slices are converted on several informer
// goroutines while the model reads others (run with -race).
func TestNodeNumbersConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				node := fmt.Sprintf("concurrent-%d-%d", g, i%50)
				var s Slice
				s.setEndpoints([]Endpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Node: node}})
				if got := s.Endpoint(0).Node; got != node {
					t.Errorf("node %q read back as %q", node, got)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestCachedSizes: the informers keep a Slice and a Service per slice and
// Service of the cluster (10,000 of each in BenchmarkClusterScale). A field
// that pushes one into a larger allocation size class costs 160 KB of heap
// per 10,000 and about twice that in RSS: place flags beside flags. A
// Slice is 216 bytes (the 224-byte class): its flags' word holds the
// change-trigger time, the owner's UID hash, which trust needs, takes one
// more word, and the node table its informers number names in (rather than
// one table for the process) one more.
func TestCachedSizes(t *testing.T) {
	for name, got := range map[string]uintptr{"Slice": unsafe.Sizeof(Slice{}), "Service": unsafe.Sizeof(Service{})} {
		if want := map[string]uintptr{"Slice": 224, "Service": 176}[name]; got > want {
			t.Errorf("a %s takes %d bytes, more than the %d-byte size class it had", name, got, want)
		}
	}
}

// TestNodeNamesBounded: anyone who may write an EndpointSlice can name any
// node, so the node-name table stops numbering at maxNodeNames; a name it
// does not know then stays with its slice, read back the same, through
// every way a slice is made.
func TestNodeNamesBounded(t *testing.T) {
	nodes := new(NodeTable)
	known := "bounded-known"
	if _, ok := nodeIndex(nodes, known); !ok {
		t.Fatal("an empty table did not number a name")
	}
	long := strings.Repeat("n", 300) // more than the API allows: kept without its node, full table or not
	s := Slice{nodes: nodes}
	before := nodes.Len()
	if skipped := s.setEndpoints([]Endpoint{{Addr: netip.MustParseAddr("10.0.0.1"), Node: long}}); skipped != 1 || s.Len() != 1 || s.Node(0) != "" || nodes.Len() != before {
		t.Fatalf("a 300-byte node name: %d skipped, %d endpoints, node %q, table %d -> %d", skipped, s.Len(), s.Node(0), before, nodes.Len())
	}
	for n := 0; nodes.Len() < maxNodeNames; n++ {
		eps := make([]Endpoint, 1000)
		for i := range eps {
			eps[i] = Endpoint{Addr: netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), Node: fmt.Sprintf("made-up-%d-%d", n, i)}
		}
		s := Slice{nodes: nodes}
		s.setEndpoints(eps)
	}
	if n := nodes.Len(); n != maxNodeNames {
		t.Fatalf("the table numbers %d names, want %d", n, maxNodeNames)
	}
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(80))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr("late-node-a"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4-a", UID: "not-a-uuid"}},
			{Addresses: []string{"10.0.0.2"}, NodeName: ptr(known), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4-b", UID: "0b7e6a5c-3f52-4d4a-9a39-1d2a2f6c9e01"}},
			{Addresses: []string{"10.0.0.3"}, NodeName: ptr("late-node-b"), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4-c", UID: "also-text"}},
			{Addresses: []string{"10.0.0.4"}, NodeName: ptr("late-node-a")},
			{Addresses: []string{"10.0.0.5"}, NodeName: ptr(long)},
		},
	}
	wire, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	fromProto, protoSkipped, err := SliceFromProto(wire, nodes)
	if err != nil {
		t.Fatal(err)
	}
	fromAPI, apiSkipped := SliceFrom(es, nodes)
	for name, got := range map[string]struct {
		s       *Slice
		skipped int
	}{"SliceFrom": {fromAPI, apiSkipped}, "SliceFromProto": {fromProto, protoSkipped}} {
		if got.s.Len() != 5 || got.skipped != 1 {
			t.Fatalf("%s: %d endpoints, %d skipped; want 5 and 1 (the node name too long)", name, got.s.Len(), got.skipped)
		}
		for i, want := range []Endpoint{
			{Node: "late-node-a", PodUID: "not-a-uuid", PodName: "web-7d4-a"},
			{Node: known, PodUID: "0b7e6a5c-3f52-4d4a-9a39-1d2a2f6c9e01", PodName: "web-7d4-b"},
			{Node: "late-node-b", PodUID: "also-text", PodName: "web-7d4-c"},
			{Node: "late-node-a"},
			{Node: ""},
		} {
			e := got.s.Endpoint(i)
			if e.Node != want.Node || got.s.Node(i) != want.Node || e.PodUID != want.PodUID || e.PodName != want.PodName {
				t.Errorf("%s: endpoint %d is node %q (Node %q), pod %q %q; want %q, %q %q", name, i, e.Node, got.s.Node(i), e.PodUID, e.PodName, want.Node, want.PodUID, want.PodName)
			}
		}
		if n := strings.Count(got.s.strs, "late-node-a"); n != 1 {
			t.Errorf("%s: a node name two endpoints share is kept %d times", name, n)
		}
	}
	if n := nodes.Len(); n != maxNodeNames {
		t.Errorf("the table numbers %d names after the late slice, want %d", n, maxNodeNames)
	}
}

// TestHostileForgedSliceTrust: a slice is the cluster's record of a
// Service's pods only with the controller's label, a controller
// ownerReference naming that Service with its UID, and Pod targetRefs in
// the slice's namespace; every forgery, decoded from the API's object and
// from protobuf alike, is not trusted or names no pod.
func TestHostileForgedSliceTrust(t *testing.T) {
	const svcUID = "0b7e6a5c-3f52-4d4a-9a39-1d2a2f6c9e77"
	svc := &Service{Meta: Meta{Name: "web", Namespace: "shop", UID: svcUID}, HasSelector: true}
	yes, no := true, false
	base := func() *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "shop",
				Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: ManagedByController},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: svcUID, Controller: &yes}}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(80))}},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"},
				TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "p", UID: "u1"}}},
		}
	}
	for _, tc := range []struct {
		name         string
		mod          func(*discoveryv1.EndpointSlice)
		trusted, pod bool
	}{
		{"the controller's slice", func(*discoveryv1.EndpointSlice) {}, true, true},
		{"no managed-by label", func(s *discoveryv1.EndpointSlice) { delete(s.Labels, discoveryv1.LabelManagedBy) }, false, true},
		{"no ownerReference", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences = nil }, false, true},
		{"a made-up Service UID", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences[0].UID = "0b7e6a5c-3f52-4d4a-9a39-1d2a2f6c9e78" }, false, true},
		{"an owner that is not the controller", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences[0].Controller = &no }, false, true},
		{"an owner of another kind", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences[0].Kind = "Deployment" }, false, true},
		{"an owner naming another Service", func(s *discoveryv1.EndpointSlice) { s.OwnerReferences[0].Name = "other" }, false, true},
		{"a targetRef without kind", func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].TargetRef.Kind = "" }, true, false},
		{"a targetRef without namespace", func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].TargetRef.Namespace = "" }, true, false},
		{"a targetRef into another namespace", func(s *discoveryv1.EndpointSlice) { s.Endpoints[0].TargetRef.Namespace = "bank" }, true, false},
	} {
		es := base()
		tc.mod(es)
		wire, err := es.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		fromProto, _, err := SliceFromProto(wire, nil)
		if err != nil {
			t.Fatal(err)
		}
		fromAPI, _ := SliceFrom(es, nil)
		for path, sl := range map[string]*Slice{"SliceFrom": fromAPI, "SliceFromProto": fromProto} {
			if got := sl.Trusted(svc); got != tc.trusted {
				t.Errorf("%s, %s: trusted %v, want %v", tc.name, path, got, tc.trusted)
			}
			if got := sl.HasPod(0); got != tc.pod {
				t.Errorf("%s, %s: names a pod %v, want %v", tc.name, path, got, tc.pod)
			}
		}
	}
}

// setEndpoints replaces the endpoints of a slice built by hand, as
// SliceFrom packs them (see packEndpoints for what is skipped and
// counted). A slice with no node table keeps its node names itself.
func (s *Slice) setEndpoints(eps []Endpoint) (skipped int) {
	in := make([]endpointIn[string], len(eps))
	for i := range eps {
		e := &eps[i]
		in[i] = endpointIn[string]{addr: e.Addr, conds: e.Conds, node: e.Node, uid: string(e.PodUID), name: e.PodName}
		if h := e.Hints; h != nil {
			for _, z := range h.Zones {
				in[i].hints = append(in[i].hints, hintPart[string]{name: z})
			}
			for _, n := range h.Nodes {
				in[i].hints = append(in[i].hints, hintPart[string]{name: n, node: true})
			}
		}
	}
	return packEndpoints(s, in)
}
