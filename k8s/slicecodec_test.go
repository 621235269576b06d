package k8s

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
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
	want, _ := SliceFrom(es)
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
			go inf.Run(ctx)
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
			want, _ := SliceFrom(es)
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
