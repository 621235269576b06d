// Package fakeapi is a minimal Kubernetes API server for benchmarks: list
// and watch of a few resources over real HTTP and JSON, so that the client
// under test pays the real decoding cost and the objects live in another
// process (the client's memory is its own).
//
// It serves any path of the form /api/v1/<resource>, /apis/<group>/<version>
// /<resource> and their /namespaces/<ns>/ forms; lists ignore selectors and
// paging; watches stream every change after the requested resourceVersion,
// or, asked for initial events (sendInitialEvents=true, the streaming lists
// client-go uses by default against API servers >= 1.34), every object as
// ADDED, a bookmark that marks the end of the initial events, then every
// change.
package fakeapi

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Resource names a collection: "services", "endpointslices", ...
type Resource string

type event struct {
	rv   int64
	typ  string
	res  Resource
	body []byte
}

// Server holds objects as JSON and fans changes out to watchers.
type Server struct {
	mu       sync.Mutex
	rv       int64
	objects  map[Resource]map[string][]byte // key namespace/name -> JSON
	kinds    map[Resource][2]string         // apiVersion, list kind
	log      []event                        // changes, for watches that resume
	maxLog   int
	watchers map[Resource]map[chan event]struct{}
}

// New returns an empty server; register resources with Kind.
func New() *Server {
	return &Server{objects: map[Resource]map[string][]byte{}, kinds: map[Resource][2]string{},
		watchers: map[Resource]map[chan event]struct{}{}, maxLog: 200000}
}

// Kind declares a resource with its apiVersion and list kind.
func (s *Server) Kind(r Resource, apiVersion, listKind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kinds[r] = [2]string{apiVersion, listKind}
	if s.objects[r] == nil {
		s.objects[r] = map[string][]byte{}
		s.watchers[r] = map[chan event]struct{}{}
	}
}

// Object is an API object (with TypeMeta set, so clients can decode it).
type Object interface {
	GetNamespace() string
	GetName() string
	SetResourceVersion(string)
}

// Put stores obj, giving it the next resourceVersion, and tells the
// watchers.
func (s *Server) Put(r Resource, obj Object) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	obj.SetResourceVersion(strconv.FormatInt(s.rv, 10))
	b, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	key := obj.GetNamespace() + "/" + obj.GetName()
	typ := "ADDED"
	if _, ok := s.objects[r][key]; ok {
		typ = "MODIFIED"
	}
	s.objects[r][key] = b
	s.emit(event{rv: s.rv, typ: typ, res: r, body: b})
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

// ServeHTTP implements list and watch.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	res, ns := parse(r.URL.Path)
	s.mu.Lock()
	kind, ok := s.kinds[res]
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
	items := make([][]byte, len(keys))
	for i, k := range keys {
		items[i] = s.objects[res][k]
	}
	rv := s.rv
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 1<<16)
	fmt.Fprintf(bw, `{"kind":%q,"apiVersion":%q,"metadata":{"resourceVersion":"%d"},"items":[`, kind[1], kind[0], rv)
	for i, it := range items {
		if i > 0 {
			bw.WriteByte(',')
		}
		bw.Write(it)
	}
	bw.WriteString("]}")
	bw.Flush()
}

// initialEventsEnd is the annotation of the bookmark that ends a streaming
// list's initial events (metav1.InitialEventsAnnotationKey).
const initialEventsEnd = "k8s.io/initial-events-end"

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
			backlog = append(backlog, event{rv: s.rv, typ: "ADDED", res: res, body: s.objects[res][k]})
		}
		kind := s.kinds[res]
		mark, _ := json.Marshal(map[string]any{"kind": strings.TrimSuffix(kind[1], "List"), "apiVersion": kind[0],
			"metadata": map[string]any{"resourceVersion": strconv.FormatInt(s.rv, 10),
				"annotations": map[string]string{initialEventsEnd: "true"}}})
		backlog = append(backlog, event{rv: s.rv, typ: "BOOKMARK", res: res, body: mark})
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
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	bw := bufio.NewWriterSize(w, 1<<16)
	write := func(e event, flush bool) bool {
		if ns != "" && e.typ != "BOOKMARK" && !strings.Contains(string(e.body[:min(len(e.body), 512)]), `"namespace":"`+ns+`"`) {
			return true
		}
		if _, err := fmt.Fprintf(bw, `{"type":%q,"object":%s}`+"\n", e.typ, e.body); err != nil {
			return false
		}
		if flush {
			if bw.Flush() != nil {
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
