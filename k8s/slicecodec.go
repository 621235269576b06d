package k8s

import (
	"bytes"
	"context"
	"slices"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// The EndpointSlice watch, decoded straight into slim slices. Every slice
// update of the cluster reaches every draind: decoding it into a whole
// discoveryv1.EndpointSlice (hundreds of allocations for fifteen
// endpoints) only for SliceFrom to keep a few fields was the largest share
// of draind's CPU per update. draind's EndpointSlice REST client decodes a
// watch event's EndpointSlice in protobuf with SliceFromProto instead;
// everything else (lists, Status objects, JSON) goes through client-go's
// codec, and what SliceFromProto refuses is decoded by the generated
// decoder, then converted, so that nothing the API server sends is lost.

// sliceSerializer is client-go's serializer for generated clients, but
// for the object decoders (a watch's objects are decoded with them).
type sliceSerializer struct {
	runtime.NegotiatedSerializer
	dec sliceDecoder
}

func (s sliceSerializer) SupportedMediaTypes() []runtime.SerializerInfo {
	infos := slices.Clone(s.NegotiatedSerializer.SupportedMediaTypes())
	for i := range infos {
		d := s.dec
		d.Serializer = infos[i].Serializer
		infos[i].Serializer = d
		if ss := infos[i].StreamSerializer; ss != nil && infos[i].MediaType == runtime.ContentTypeProtobuf {
			w := *ss
			w.Serializer = watchEventDecoder{ss.Serializer}
			infos[i].StreamSerializer = &w
		}
	}
	return infos
}

// watchEventDecoder decodes a protobuf watch stream's frames into
// metav1.WatchEvents whose object is read where it lies in the frame: the
// generated decoder copies it (1-2 KB per slice update, a seventh of what
// draind allocated per update). client-go's watch decoder decodes the
// object before it reads the next frame, the only thing that reuses the
// frame's buffer. A frame with anything but one type and one object is
// left to the generated decoder.
type watchEventDecoder struct{ runtime.Serializer }

func (d watchEventDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if ev, ok := into.(*metav1.WatchEvent); ok {
		if typ, raw, ok := parseWatchEvent(data); ok {
			*ev = metav1.WatchEvent{Type: typ, Object: runtime.RawExtension{Raw: raw}}
			gvk := &schema.GroupVersionKind{}
			if defaults != nil {
				*gvk = *defaults
			}
			return ev, gvk, nil
		}
	}
	return d.Serializer.Decode(data, defaults, into)
}

// parseWatchEvent reads a watch event's type (field 1) and its object's
// bytes (field 2, a runtime.RawExtension: its field 1), each present once;
// ok is false for anything else.
func parseWatchEvent(data []byte) (typ string, raw []byte, ok bool) {
	if len(data) == 0 {
		return "", nil, false // the generated path's "empty data" error
	}
	var t, obj []byte
	var hasType, hasObj bool
	r := wireReader{b: data}
	for len(r.b) > 0 {
		field, wt, err := r.tag()
		switch {
		case err != nil || wt != wireLen:
			return "", nil, false
		case field == 1 && !hasType:
			t, err = r.bytes()
			hasType = true
		case field == 2 && !hasObj:
			obj, err = r.bytes()
			hasObj = true
		default:
			return "", nil, false
		}
		if err != nil {
			return "", nil, false
		}
	}
	r = wireReader{b: obj}
	for hasRaw := false; len(r.b) > 0; hasRaw = true {
		field, wt, err := r.tag()
		if err != nil || field != 1 || wt != wireLen || hasRaw {
			return "", nil, false
		}
		if raw, err = r.bytes(); err != nil {
			return "", nil, false
		}
	}
	return eventType(t), raw, true
}

// eventType is a watch event's type as a string, the five the API sends
// without an allocation.
func eventType(b []byte) string {
	for _, t := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted, watch.Bookmark, watch.Error} {
		if string(b) == string(t) {
			return string(t)
		}
	}
	return string(b)
}

// sliceDecoder turns every EndpointSlice a watch delivers into a *Slice,
// stamped with its receipt (taken before decoding: the latency draind
// reports includes it). One in protobuf it decodes straight; any other
// (JSON, or what SliceFromProto refuses) client-go's decoder decodes and
// SliceFrom converts. Other objects (a watch's Status) pass unchanged.
type sliceDecoder struct {
	runtime.Serializer
	clk clock.PassiveClock
	inf *Informers
}

// protoMagic starts the API's protobuf encoding (a runtime.Unknown
// envelope follows).
var protoMagic = []byte{0x6b, 0x38, 0x73, 0x00}

var sliceGVK = discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")

func (d sliceDecoder) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into != nil {
		return d.Serializer.Decode(data, defaults, into)
	}
	received := d.clk.Now()
	if raw, ok := sliceEnvelope(data); ok {
		if sl, skipped, err := SliceFromProto(raw, d.inf.Nodes); err == nil {
			d.inf.noteSkipped(skipped)
			sl.Stamp(received)
			gvk := sliceGVK
			return sl, &gvk, nil
		}
	}
	obj, gvk, err := d.Serializer.Decode(data, defaults, into)
	if es, ok := obj.(*discoveryv1.EndpointSlice); ok && err == nil {
		sl, skipped := SliceFrom(es, d.inf.Nodes)
		d.inf.noteSkipped(skipped)
		sl.initialEventsEnd = es.Annotations[metav1.InitialEventsAnnotationKey] == "true"
		sl.Stamp(received)
		return sl, gvk, nil
	}
	return obj, gvk, err
}

// sliceEnvelope returns the EndpointSlice inside the API's protobuf
// envelope (runtime.Unknown: typeMeta 1, raw 2, contentEncoding 3,
// contentType 4), if that is what data holds, unencoded.
func sliceEnvelope(data []byte) ([]byte, bool) {
	b, ok := bytes.CutPrefix(data, protoMagic)
	if !ok {
		return nil, false
	}
	var apiVersion, kind, raw []byte
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err != nil {
			return nil, false
		}
		switch {
		case field == 1 && typ == wireLen:
			tm, err := r.bytes()
			if err != nil {
				return nil, false
			}
			apiVersion, kind, ok = typeMetaOf(tm, apiVersion, kind)
			if !ok {
				return nil, false
			}
		case field == 2 && typ == wireLen:
			if raw, err = r.bytes(); err != nil {
				return nil, false
			}
		case (field == 3 || field == 4) && typ == wireLen:
			v, err := r.bytes()
			if err != nil || (field == 3 && len(v) > 0) {
				return nil, false // an encoding (none is used today)
			}
		default:
			return nil, false // anything unexpected: the generated path
		}
	}
	if string(apiVersion) != sliceGVK.GroupVersion().String() || string(kind) != sliceGVK.Kind {
		return nil, false
	}
	return raw, true
}

// typeMetaOf reads apiVersion (1) and kind (2) of a TypeMeta, merging into
// the values before.
func typeMetaOf(b, apiVersion, kind []byte) ([]byte, []byte, bool) {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err != nil || typ != wireLen || (field != 1 && field != 2) {
			return nil, nil, false
		}
		v, err := r.bytes()
		if err != nil {
			return nil, nil, false
		}
		if field == 1 {
			apiVersion = v
		} else {
			kind = v
		}
	}
	return apiVersion, kind, true
}

// noteSkipped counts a slice some of whose endpoints or ports could not be
// converted.
func (inf *Informers) noteSkipped(skipped int) {
	if skipped > 0 {
		inf.Malformed.Add(1)
	}
}

// sliceWatcher returns the watch function of draind's EndpointSlice REST
// client, built from cfg: client-go's, with sliceDecoder.
func sliceWatcher(cfg *rest.Config, clk clock.PassiveClock, inf *Informers) (func(context.Context, metav1.ListOptions) (watch.Interface, error), error) {
	c := rest.CopyConfig(cfg)
	gv := discoveryv1.SchemeGroupVersion
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	if c.ContentType == "" {
		c.ContentType = runtime.ContentTypeProtobuf // as client-go's clientset asks
	}
	c.NegotiatedSerializer = sliceSerializer{NegotiatedSerializer: rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion(),
		dec: sliceDecoder{clk: clk, inf: inf}}
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		var timeout time.Duration
		if o.TimeoutSeconds != nil {
			timeout = time.Duration(*o.TimeoutSeconds) * time.Second
		}
		o.Watch = true
		return rc.Get().Resource("endpointslices").VersionedParams(&o, scheme.ParameterCodec).Timeout(timeout).Watch(ctx)
	}, nil
}
