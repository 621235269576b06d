// Package fakeapi is a minimal Kubernetes API server for benchmarks: list
// and watch of a few resources over real HTTP, in JSON or, to a client that
// asks for it (as kube-proxy and draind do), protobuf, so that the client
// under test pays the real decoding cost and the objects live in another
// process (the client's memory is its own).
//
// It serves any path of the form /api/v1/<resource>, /apis/<group>/<version>
// /<resource> and their /namespaces/<ns>/ forms; lists ignore selectors and
// paging; watches stream every change after the requested resourceVersion,
// or, asked for initial events (sendInitialEvents=true, the streaming lists
// client-go uses by default against API servers >= 1.34), every object as
// ADDED, a bookmark that marks the end of the initial events, then every
// change. Objects must be of types client-go's scheme knows.
//
// Words are defined in the repository's docs/glossary.md.
package fakeapi

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
)

// Resource names a collection: "services", "endpointslices", ...
type Resource string

// stored is one object as the server keeps it, and its encodings, made
// when a client first needs them: the server runs next to the client
// under test, and an encoding no client reads must not take its CPU.
type stored struct {
	ns  string
	obj runtime.Object // never changed once stored

	jsonOnce, protoOnce sync.Once
	json, proto         []byte
	jsonErr, protoErr   error
}

func (st *stored) jsonBytes() ([]byte, error) {
	st.jsonOnce.Do(func() { st.json, st.jsonErr = json.Marshal(st.obj) })
	return st.json, st.jsonErr
}

func (st *stored) protoBytes() ([]byte, error) {
	st.protoOnce.Do(func() {
		var pb bytes.Buffer
		if st.protoErr = protoInfo.Serializer.Encode(st.obj, &pb); st.protoErr == nil {
			st.proto = pb.Bytes()
		}
	})
	return st.proto, st.protoErr
}

type event struct {
	rv  int64
	typ string
	res Resource
	obj *stored
}

// Server holds objects and fans changes out to watchers.
type Server struct {
	mu       sync.Mutex
	rv       int64
	objects  map[Resource]map[string]*stored // key namespace/name
	kinds    map[Resource]schema.GroupVersionKind
	log      []event // changes, for watches that resume
	maxLog   int
	watchers map[Resource]map[chan event]struct{}
}

// New returns an empty server; register resources with Kind.
func New() *Server {
	return &Server{objects: map[Resource]map[string]*stored{}, kinds: map[Resource]schema.GroupVersionKind{},
		watchers: map[Resource]map[chan event]struct{}{}, maxLog: 200000}
}

// SetHistory sets how many changes the server keeps for watches that
// resume (200,000 by default). Every change it keeps holds its object: a
// benchmark whose watches never resume keeps few, so that its heap, and
// the CPU its collection takes next to the client under test, stay small.
func (s *Server) SetHistory(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxLog = max(n, 2)
}

// Kind declares a resource with its apiVersion and list kind.
func (s *Server) Kind(r Resource, apiVersion, listKind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kinds[r] = schema.FromAPIVersionAndKind(apiVersion, listKind)
	if s.objects[r] == nil {
		s.objects[r] = map[string]*stored{}
		s.watchers[r] = map[chan event]struct{}{}
	}
}

// Object is an API object (with TypeMeta set, so clients can decode it).
type Object interface {
	runtime.Object
	GetNamespace() string
	GetName() string
	SetResourceVersion(string)
}

// protoInfo is the protobuf encoding, for clients that ask for it.
var protoInfo = mediaType(runtime.ContentTypeProtobuf)

func mediaType(t string) runtime.SerializerInfo {
	for _, info := range scheme.Codecs.WithoutConversion().SupportedMediaTypes() {
		if info.MediaType == t {
			return info
		}
	}
	panic("fakeapi: client-go's scheme has no serializer for " + t)
}

// Put stores obj, giving it the next resourceVersion, and tells the
// watchers.
func (s *Server) Put(r Resource, obj Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	obj.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	if _, _, err := scheme.Scheme.ObjectKinds(obj); err != nil {
		return fmt.Errorf("storing %s/%s: %w", obj.GetNamespace(), obj.GetName(), err)
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	typ := "ADDED"
	if _, ok := s.objects[r][key]; ok {
		typ = "MODIFIED"
	}
	st := &stored{ns: obj.GetNamespace(), obj: obj}
	s.objects[r][key] = st
	s.emit(event{rv: s.rv, typ: typ, res: r, obj: st})
	return nil
}

func (s *Server) emit(e event) {
	s.log = append(s.log, e)
	if len(s.log) > s.maxLog {
		s.log = append([]event(nil), s.log[len(s.log)-s.maxLog/2:]...)
	}
	for ch := range s.watchers[e.res] {
		select {
		case ch <- e:
		default: // a watcher that cannot keep up is dropped (it relists)
			delete(s.watchers[e.res], ch)
			close(ch)
		}
	}
}

// parse maps a request path to its resource and namespace.
func parse(path string) (Resource, string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "", ""
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		return Resource(parts[2]), parts[1]
	}
	if len(parts) >= 1 {
		return Resource(parts[0]), ""
	}
	return "", ""
}

// wantsProtobuf reports whether the client accepts protobuf (it lists it
// first when it prefers it; client-go sends one type or the preference).
func wantsProtobuf(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Accept"), runtime.ContentTypeProtobuf)
}

// ServeHTTP implements list and watch.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	res, ns := parse(r.URL.Path)
	s.mu.Lock()
	listKind, ok := s.kinds[res]
	s.mu.Unlock()
	if !ok || r.Method != http.MethodGet {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
		return
	}
	if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
		s.watch(w, r, res, ns)
		return
	}
	s.mu.Lock()
	keys := make([]string, 0, len(s.objects[res]))
	for k := range s.objects[res] {
		if ns == "" || strings.HasPrefix(k, ns+"/") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	items := make([]*stored, len(keys))
	for i, k := range keys {
		items[i] = s.objects[res][k]
	}
	rv := s.rv
	s.mu.Unlock()
	if wantsProtobuf(r) {
		if err := writeProtoList(w, listKind, items, rv); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	bw := bufio.NewWriterSize(w, 1<<16)
	fmt.Fprintf(bw, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"},"items":[`, listKind.Kind, listKind.GroupVersion().String(), rv)
	for i, it := range items {
		b, err := it.jsonBytes()
		if err != nil {
			return // the client sees a truncated list
		}
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(b)
	}
	bw.WriteString("]}")
	bw.Flush()
}

func writeProtoList(w http.ResponseWriter, listKind schema.GroupVersionKind, items []*stored, rv int64) error {
	list, err := scheme.Scheme.New(listKind)
	if err != nil {
		return fmt.Errorf("making a %v: %w", listKind, err)
	}
	objs := make([]runtime.Object, len(items))
	for i, it := range items {
		objs[i] = it.obj
	}
	if err := meta.SetList(list, objs); err != nil {
		return fmt.Errorf("filling a %v: %w", listKind, err)
	}
	la, err := meta.ListAccessor(list)
	if err != nil {
		return err
	}
	la.SetResourceVersion(strconv.FormatInt(rv, 10))
	list.GetObjectKind().SetGroupVersionKind(listKind)
	w.Header().Set("Content-Type", runtime.ContentTypeProtobuf)
	bw := bufio.NewWriterSize(w, 1<<16)
	if err := protoInfo.Serializer.Encode(list, bw); err != nil {
		return err
	}
	return bw.Flush()
}

// initialEventsEnd is the annotation of the bookmark that ends a streaming
// list's initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEnd = "k8s.io/initial-events-end"

// bookmark is the object of the bookmark that ends the initial events: an
// empty object of the resource's kind with the resourceVersion.
func (s *Server) bookmark(res Resource) (*stored, error) {
	lk := s.kinds[res]
	gvk := lk.GroupVersion().WithKind(strings.TrimSuffix(lk.Kind, "List"))
	obj, err := scheme.Scheme.New(gvk)
	if err != nil {
		return nil, fmt.Errorf("making a %v bookmark: %w", gvk, err)
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil, err
	}
	m.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	m.SetAnnotations(map[string]string{initialEventsEnd: "true"})
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	return &stored{obj: obj}, nil
}

// watchWriter writes watch events in the client's encoding.
type watchWriter struct {
	bw    *bufio.Writer
	proto *streaming.Encoder
}

func newWatchWriter(w io.Writer, proto bool) *watchWriter {
	ww := &watchWriter{bw: bufio.NewWriterSize(w, 1<<16)}
	if proto {
		// A length-delimited frame per event: a metav1.WatchEvent whose
		// object is the object's own protobuf encoding (what client-go's
		// rest/watch encoder writes and its decoder reads).
		enc := streaming.NewEncoder(protoInfo.StreamSerializer.Framer.NewFrameWriter(ww.bw), protoInfo.StreamSerializer.Serializer)
		ww.proto = &enc
	}
	return ww
}

func (ww *watchWriter) write(e event) error {
	if ww.proto != nil {
		b, err := e.obj.protoBytes()
		if err != nil {
			return err
		}
		return (*ww.proto).Encode(&metav1.WatchEvent{Type: e.typ, Object: runtime.RawExtension{Raw: b}})
	}
	b, err := e.obj.jsonBytes()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(ww.bw, `{"type":%q,"object":%s}`+"\n", e.typ, b)
	return err
}

func (s *Server) watch(w http.ResponseWriter, r *http.Request, res Resource, ns string) {
	q := r.URL.Query()
	from, _ := strconv.ParseInt(q.Get("resourceVersion"), 10, 64)
	initial := q.Get("sendInitialEvents") == "true"
	ch := make(chan event, 65536)
	s.mu.Lock()
	var backlog []event
	if initial {
		// The state now as ADDED events (in key order), then the
		// bookmark; the watch goes on from the state's resourceVersion.
		keys := make([]string, 0, len(s.objects[res]))
		for k := range s.objects[res] {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			backlog = append(backlog, event{rv: s.rv, typ: string(watch.Added), res: res, obj: s.objects[res][k]})
		}
		mark, err := s.bookmark(res)
		if err != nil {
			s.mu.Unlock()
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		backlog = append(backlog, event{rv: s.rv, typ: string(watch.Bookmark), res: res, obj: mark})
	} else {
		for _, e := range s.log {
			if e.res == res && e.rv > from {
				backlog = append(backlog, e)
			}
		}
	}
	s.watchers[res][ch] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.watchers[res], ch)
		s.mu.Unlock()
	}()
	proto := wantsProtobuf(r)
	if proto {
		w.Header().Set("Content-Type", runtime.ContentTypeProtobuf+";stream=watch")
	} else {
		w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	}
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	ww := newWatchWriter(w, proto)
	write := func(e event, flush bool) bool {
		if ns != "" && e.typ != string(watch.Bookmark) && e.obj.ns != ns {
			return true
		}
		if ww.write(e) != nil {
			return false
		}
		if flush {
			if ww.bw.Flush() != nil {
				return false
			}
			if fl != nil {
				fl.Flush()
			}
		}
		return true
	}
	for i, e := range backlog {
		if !write(e, i == len(backlog)-1) {
			return
		}
	}
	timeout := 5 * time.Minute
	if t, err := strconv.Atoi(r.URL.Query().Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-tm.C:
			return
		case e, ok := <-ch:
			if !ok || !write(e, true) {
				return
			}
		}
	}
}
