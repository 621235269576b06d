package k8s

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/draind/draind/test/fakeapi"
)

// encodeProto is an object as the API server writes it in protobuf (the
// runtime.Unknown envelope).
func encodeProto(t *testing.T, obj runtime.Object) []byte {
	t.Helper()
	for _, info := range scheme.Codecs.WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeProtobuf {
			b, err := runtime.Encode(info.Serializer, obj)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatal("no protobuf serializer")
	return nil
}

func TestSliceEnvelope(t *testing.T) {
	es := wireSlice(3)
	es.TypeMeta = metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}
	raw, ok := sliceEnvelope(encodeProto(t, es))
	if !ok {
		t.Fatal("an EndpointSlice's envelope was not recognised")
	}
	checkSame(t, raw)
	for name, obj := range map[string]runtime.Object{
		"a Status":  &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Message: "too old"},
		"a Service": &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}},
		"an EndpointSlice of another version": &discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1beta1"}},
	} {
		if _, ok := sliceEnvelope(encodeProto(t, obj)); ok {
			t.Errorf("%s was taken for an EndpointSlice", name)
		}
	}
	for _, bad := range [][]byte{nil, []byte("{}"), protoMagic, append(append([]byte{}, protoMagic...), 0x0a, 0x05)} {
		if _, ok := sliceEnvelope(bad); ok {
			t.Errorf("%q was taken for an EndpointSlice", bad)
		}
	}
}

// TestSliceDecoder: whatever a watch delivers, the decoder hands the
// reflector a *Slice, stamped before decoding: an EndpointSlice in
// protobuf decoded straight, one that only the generated decoder accepts
// or one in JSON converted; a Status passes as it is.
func TestSliceDecoder(t *testing.T) {
	clk := clocktesting.NewFakePassiveClock(time.Unix(1700000000, 0))
	inf := &Informers{}
	ser := sliceSerializer{NegotiatedSerializer: scheme.Codecs.WithoutConversion(), dec: sliceDecoder{clk: clk, inf: inf}}
	decoders := map[string]runtime.Decoder{}
	for _, info := range ser.SupportedMediaTypes() {
		decoders[info.MediaType] = info.Serializer
	}
	es := wireSlice(2)
	es.TypeMeta = metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}
	del := metav1.NewTime(es.DeletionTimestamp.Truncate(time.Second).Local()) // JSON keeps seconds; both decode to local time
	es.DeletionTimestamp = &del
	want, _ := SliceFrom(es, nil)
	want.Stamp(clk.Now())

	jsonBytes, err := runtime.Encode(scheme.Codecs.LegacyCodec(discoveryv1.SchemeGroupVersion), es)
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		mediaType string
		data      []byte
	}{
		"protobuf": {runtime.ContentTypeProtobuf, encodeProto(t, es)},
		"json":     {runtime.ContentTypeJSON, jsonBytes},
	} {
		obj, _, err := decoders[c.mediaType].Decode(c.data, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got, ok := obj.(*Slice); !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %T %+v, want %+v", name, obj, obj, want)
		}
	}

	// A bookmark of a watch-list's end: the reflector reads the
	// annotation from the slice.
	bm := &discoveryv1.EndpointSlice{TypeMeta: es.TypeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: "77",
		Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	obj, _, err := decoders[runtime.ContentTypeProtobuf].Decode(encodeProto(t, bm), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := obj.(*Slice); m.GetResourceVersion() != "77" || m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark decoded as %+v (annotations %v)", m, m.GetAnnotations())
	}

	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Message: "too old resource version"}
	obj, _, err = decoders[runtime.ContentTypeProtobuf].Decode(encodeProto(t, st), nil, nil)
	if s, ok := obj.(*metav1.Status); err != nil || !ok || s.Message != st.Message {
		t.Errorf("a Status decoded as %T %+v, %v", obj, obj, err)
	}
}

// TestSlimSliceWatch runs the informers against an API server stand-in
// over HTTP, in protobuf (decoded straight) and in JSON: the cached
// slices and the handlers' ones are what SliceFrom makes of the API's
// objects, stamped; the streamed initial list ends (its bookmark is seen).
func TestSlimSliceWatch(t *testing.T) {
	for _, contentType := range []string{"", runtime.ContentTypeJSON} {
		t.Run("content-type="+contentType, func(t *testing.T) {
			api := fakeapi.New()
			api.Kind("services", "v1", "ServiceList")
			api.Kind("endpointslices", "discovery.k8s.io/v1", "EndpointSliceList")
			api.Kind("leases", "coordination.k8s.io/v1", "LeaseList")
			api.Kind("pods", "v1", "PodList")
			es := wireSlice(3)
			es.TypeMeta = metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"}
			es.DeletionTimestamp, es.DeletionGracePeriodSeconds = nil, nil
			if err := api.Put("endpointslices", es.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			// The initial list must come streamed (a watch's initial events,
			// ended by a bookmark the reflector reads from a slice), not listed.
			var lists atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if strings.HasSuffix(r.URL.Path, "/endpointslices") && r.URL.Query().Get("watch") != "true" {
					lists.Add(1)
				}
				api.ServeHTTP(w, r)
			}))
			defer srv.Close()
			cfg := &rest.Config{Host: srv.URL}
			cfg.ContentType = contentType
			client, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			inf := NewInformers(client, Config{Namespace: "draind-system", NodeName: "node-0", REST: cfg})
			if inf.SliceDecoding != "slim" {
				t.Fatalf("SliceDecoding = %q", inf.SliceDecoding)
			}
			var mu sync.Mutex
			var seen []*Slice
			if _, err := inf.Slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o any) { mu.Lock(); seen = append(seen, o.(*Slice)); mu.Unlock() },
				UpdateFunc: func(_, o any) { mu.Lock(); seen = append(seen, o.(*Slice)); mu.Unlock() },
			}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			go inf.RunAndWait(ctx)
			if err := inf.WaitForSync(ctx); err != nil {
				t.Fatal(err)
			}
			if n := lists.Load(); n != 0 {
				t.Errorf("the slices were listed %d times: the streamed initial list was not exercised", n)
			}
			// An update: one endpoint no longer ready.
			fa := false
			es.Endpoints[1].Conditions.Ready = &fa
			if err := api.Put("endpointslices", es.DeepCopy()); err != nil {
				t.Fatal(err)
			}
			// Polled, not in a synctest bubble: the API stand-in serves
			// over a real HTTP server, whose socket reads never count as
			// idle in one.
			for {
				mu.Lock()
				n := len(seen)
				mu.Unlock()
				if n >= 2 {
					break
				}
				select {
				case <-ctx.Done():
					t.Fatalf("the update did not arrive: %d events", n)
				case <-time.After(10 * time.Millisecond):
				}
			}
			mu.Lock()
			last := seen[1]
			mu.Unlock()
			es.ResourceVersion = last.ResourceVersion
			want, _ := SliceFrom(es, inf.Nodes)
			want.Receipt = last.Receipt
			if last.Received().IsZero() || !reflect.DeepEqual(last, want) {
				t.Errorf("the handler got %+v, want %+v (stamped)", last, want)
			}
			if got := inf.SlicesOf("shop/web"); len(got) != 1 || got[0] != last {
				t.Errorf("cached: %v", got)
			}
		})
	}
}

// watchEventSeeds are watch events as the API server frames them, and the
// shapes parseWatchEvent leaves to the generated decoder.
func watchEventSeeds(t testing.TB) [][]byte {
	obj, err := wireSlice(2).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, ev := range []metav1.WatchEvent{
		{Type: "MODIFIED", Object: runtime.RawExtension{Raw: obj}},
		{Type: "BOOKMARK", Object: runtime.RawExtension{Raw: []byte{}}},
		{Type: "NOT-A-TYPE"},
		{},
	} {
		b, err := ev.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	out = append(out,
		append(slices.Clone(out[0]), out[2]...),  // the type twice: the last wins
		append(slices.Clone(out[0]), 0x18, 0x01), // field 3, varint: unknown
		[]byte{0x12, 0x02, 0x0a, 0x00},           // an object with an empty raw
		[]byte{0x12, 0x03, 0x0a, 0x05, 0x01},     // truncated
	)
	return out
}

// TestWatchEventDecoder: a watch event's object is read where it lies in
// the frame, the same as the generated decoder reads it; what the fast path
// leaves (a field repeated or unknown) decodes as before.
func TestWatchEventDecoder(t *testing.T) {
	var dec runtime.Serializer
	for _, info := range scheme.Codecs.WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeProtobuf {
			dec = watchEventDecoder{info.StreamSerializer.Serializer}
		}
	}
	seeds := watchEventSeeds(t)
	for i, b := range seeds {
		var got, want metav1.WatchEvent
		_, _, gotErr := dec.Decode(b, nil, &got)
		wantErr := want.Unmarshal(b)
		if (gotErr != nil) != (wantErr != nil) || got.Type != want.Type || !bytes.Equal(got.Object.Raw, want.Object.Raw) {
			t.Errorf("seed %d: decoded %q %d bytes (%v), the generated decoder %q %d bytes (%v)", i, got.Type, len(got.Object.Raw), gotErr, want.Type, len(want.Object.Raw), wantErr)
		}
	}
	if _, raw, ok := parseWatchEvent(seeds[0]); !ok || &raw[0] != &seeds[0][bytes.Index(seeds[0], raw)] {
		t.Error("the object of a MODIFIED event was copied, or not read")
	}
	if n := testing.AllocsPerRun(100, func() { parseWatchEvent(seeds[0]) }); n != 0 {
		t.Errorf("parsing an event allocates %v times", n)
	}
}

// FuzzWatchEvent: whatever parseWatchEvent reads, the generated decoder
// reads the same.
func FuzzWatchEvent(f *testing.F) {
	for _, b := range watchEventSeeds(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, raw, ok := parseWatchEvent(b)
		if !ok {
			return
		}
		var want metav1.WatchEvent
		if err := want.Unmarshal(b); err != nil {
			t.Fatalf("parsed %q, but the generated decoder fails: %v", typ, err)
		}
		if typ != want.Type || !bytes.Equal(raw, want.Object.Raw) {
			t.Fatalf("parsed %q %x, the generated decoder %q %x", typ, raw, want.Type, want.Object.Raw)
		}
	})
}
