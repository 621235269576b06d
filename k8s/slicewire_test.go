package k8s

import (
	"encoding/binary"
	"net/netip"
	"reflect"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// wireSlice is an EndpointSlice as the EndpointSlice controller writes it,
// every field set, n endpoints.
func wireSlice(n int) *discoveryv1.EndpointSlice {
	tr, fa := true, false
	name, port, proto, app := "http", int32(8080), corev1.ProtocolTCP, "h2c"
	del := metav1.NewTime(time.Date(2026, 12, 1, 5, 0, 0, 123, time.UTC))
	grace := int64(30)
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "web-abcde", GenerateName: "web-", Namespace: "shop", UID: "5e1c0000-0000-0000-0000-000000000001",
			ResourceVersion: "12345", Generation: 3, DeletionTimestamp: &del, DeletionGracePeriodSeconds: &grace,
			Labels:          map[string]string{discoveryv1.LabelServiceName: "web", discoveryv1.LabelManagedBy: ManagedByController, "app": "web"},
			Annotations:     map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00.123456789Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "web", UID: "5e4f", Controller: &tr}},
			Finalizers:      []string{"x"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto, AppProtocol: &app}},
	}
	for j := range n {
		node, zone, host := "node-"+strconv.Itoa(j%3), "zone-a", "h"
		ready := j%4 != 0
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{"10.0.0." + strconv.Itoa(j+1), "10.1.0." + strconv.Itoa(j+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &tr, Terminating: &fa},
			Hostname:   &host, NodeName: &node, Zone: &zone,
			Hints:     &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: "zone-a"}}, ForNodes: []discoveryv1.ForNode{{Name: node}}},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: "web-7d4b9c8f6-" + strconv.Itoa(j), UID: types.UID("00000000-0000-0000-0000-00000000000" + strconv.Itoa(j%10))},
		})
	}
	return s
}

// checkSame decodes b both ways: where the generated decoder accepts b,
// SliceFromProto must convert it as SliceFrom converts the decoded object.
func checkSame(t *testing.T, b []byte) {
	t.Helper()
	var es discoveryv1.EndpointSlice
	wantErr := es.Unmarshal(b)
	got, gotSkipped, err := SliceFromProto(b, nil)
	if wantErr != nil {
		return // refused by the API's decoder: anything but a panic will do
	}
	if err != nil {
		t.Fatalf("SliceFromProto refused what the generated decoder accepts: %v", err)
	}
	want, wantSkipped := SliceFrom(&es, nil)
	// Only the straight decoding keeps the bookmark's annotation: the
	// reflector reads it from the API's object before SliceFrom runs.
	want.initialEventsEnd = es.Annotations[metav1.InitialEventsAnnotationKey] == "true"
	if gotSkipped != wantSkipped || !reflect.DeepEqual(got, want) {
		t.Fatalf("SliceFromProto:\n%+v (skipped %d)\nSliceFrom(Unmarshal):\n%+v (skipped %d)", got, gotSkipped, want, wantSkipped)
	}
}

func TestSliceFromProto(t *testing.T) {
	for _, n := range []int{0, 1, 15} {
		b, err := wireSlice(n).Marshal()
		if err != nil {
			t.Fatal(err)
		}
		checkSame(t, b)
		sl, _, _ := SliceFromProto(b, nil)
		for _, after := range []time.Duration{time.Second, -time.Second, 20 * 24 * time.Hour} {
			sl.Stamp(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(after))
			if got, want := sl.TriggerTime(), time.Date(2026, 1, 1, 0, 0, 0, 123000000, time.UTC); !got.Equal(want) {
				t.Errorf("received %v after it: trigger time %v, want %v (the annotation, to the millisecond)", after, got, want)
			}
		}
	}
	// Fields repeated (last wins, messages merge) and unknown ones.
	b, _ := wireSlice(2).Marshal()
	extra, _ := (&discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "other", Labels: map[string]string{discoveryv1.LabelServiceName: "web2"}},
		AddressType: discoveryv1.AddressTypeIPv6}).Marshal()
	checkSame(t, append(append([]byte{}, b...), extra...))
	checkSame(t, append(append([]byte{}, b...), 0xf8, 0x07, 0x01)) // field 127, varint
	// A deletion time with nanoseconds (the API server writes none):
	// metav1.Time drops them.
	ts := binary.AppendUvarint([]byte{0x08}, 1700000000) // seconds
	ts = append(ts, 0x10, 0x05)                          // nanos 5
	meta := append([]byte{0x4a, byte(len(ts))}, ts...)   // deletionTimestamp
	checkSame(t, append(append(append([]byte{}, b...), 0x0a, byte(len(meta))), meta...))
}

func FuzzSliceFromProto(f *testing.F) {
	for _, n := range []int{0, 1, 3} {
		b, _ := wireSlice(n).Marshal()
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkSame(t, b) })
}

// BenchmarkSliceFromProto: one 15-endpoint slice update decoded and
// slimmed, straight (proto) and as the informer does today (generated
// decoder, then SliceFrom).
func BenchmarkSliceFromProto(b *testing.B) {
	w, _ := wireSlice(15).Marshal()
	b.Run("generated", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			var es discoveryv1.EndpointSlice
			if err := es.Unmarshal(w); err != nil {
				b.Fatal(err)
			}
			SliceFrom(&es, nil)
		}
	})
	b.Run("proto", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, _, err := SliceFromProto(w, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// FuzzParseAddr: parseAddr, which reads plain IPv4 addresses itself, must
// agree with netip.ParseAddr on every input, as text and as bytes.
func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "0.0.0.0", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5",
		"1..2.3", ".1.2.3", "1.2.3.", "1.2.3.4%eth0", "::1", "::ffff:10.0.0.1", "fe80::1%eth0", "", "1.2.3.04", "1.2.3.-4", "1.2.3.4 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, wantErr := netip.ParseAddr(s)
		check := func(form string, got netip.Addr, err error) {
			if (err != nil) != (wantErr != nil) || got != want {
				t.Fatalf("parseAddr(%s %q) = %v, %v; netip.ParseAddr: %v, %v", form, s, got, err, want, wantErr)
			}
		}
		a, err := parseAddr(s)
		check("text", a, err)
		a, err = parseAddr([]byte(s))
		check("bytes", a, err)
	})
}
