package k8s

import (
	"reflect"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestHints: a slice keeps its endpoints' hints through every way it is
// made (by hand, from the API's object, from protobuf, hints messages
// repeated), reads them back, and HintsFor says what they say about a
// node and its zone.
func TestHints(t *testing.T) {
	es := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "web-1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: ptr(int32(80))}},
		Endpoints: []discoveryv1.Endpoint{
			{Addresses: []string{"10.0.0.1"}, NodeName: ptr("n1"),
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}, ForNodes: []discoveryv1.ForNode{{Name: "n1"}}}},
			{Addresses: []string{"10.0.0.2"}, NodeName: ptr("n2")},
			{Addresses: []string{"10.0.0.3"}, NodeName: ptr("n3"),
				Hints: &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-b"}, {Name: "zone-a"}}}},
			{Addresses: []string{"10.0.0.4"}, Hints: &discoveryv1.EndpointHints{}},
		},
	}
	want := []*Hints{{Zones: []string{"zone-a"}, Nodes: []string{"n1"}}, nil, {Zones: []string{"zone-b", "zone-a"}}, nil}
	wire, err := es.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	fromProto, _, err := SliceFromProto(wire, nil)
	if err != nil {
		t.Fatal(err)
	}
	fromAPI, _ := SliceFrom(es, nil)
	var byHand Slice
	var eps []Endpoint
	for i := range fromAPI.Len() {
		eps = append(eps, fromAPI.Endpoint(i))
	}
	byHand.setEndpoints(eps)
	for name, s := range map[string]*Slice{"SliceFrom": fromAPI, "SliceFromProto": fromProto, "setEndpoints": &byHand} {
		for i, w := range want {
			if got := s.Endpoint(i).Hints; !reflect.DeepEqual(got, w) {
				t.Errorf("%s: endpoint %d: hints %+v, want %+v", name, i, got, w)
			}
		}
		for _, c := range []struct {
			i          int
			zone, node string
			want       uint8
		}{
			{0, "zone-a", "n1", HintZones | HintZoneMatch | HintNodes | HintNodeMatch},
			{0, "zone-b", "n2", HintZones | HintNodes},
			{1, "zone-a", "n2", 0},
			{2, "zone-a", "n1", HintZones | HintZoneMatch},
			{2, "", "n1", HintZones},
			{3, "zone-a", "n1", 0},
		} {
			if got := s.HintsFor(c.i, c.zone, c.node); got != c.want {
				t.Errorf("%s: endpoint %d for %s in %q: hint bits %04b, want %04b", name, c.i, c.node, c.zone, got, c.want)
			}
		}
		if !s.HasHints() {
			t.Errorf("%s: no hints", name)
		}
	}
	// Repeated messages merge as the generated decoder merges them.
	checkSame(t, wire)
	checkSame(t, append(append([]byte{}, wire...), wire...))
	// Without hints, none are kept.
	plain, _ := SliceFrom(&discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4, Ports: es.Ports,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}}, nil)
	if plain.HasHints() || plain.HintsFor(0, "", "") != 0 || plain.Endpoint(0).Hints != nil {
		t.Error("a slice without hints has some")
	}
	if n := testing.AllocsPerRun(100, func() { fromProto.HintsFor(2, "zone-a", "n1") }); n != 0 {
		t.Errorf("HintsFor allocates %v times", n)
	}
}
