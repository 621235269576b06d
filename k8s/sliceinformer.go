package k8s

import (
	"context"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// SliceInformer is the EndpointSlice watch: client-go's Reflector (list,
// watch, resume, relist, streaming lists, backoff) storing each event
// straight into an indexer, with the handlers called as it is stored, in
// the reflector's own goroutine.
//
// Why not a shared informer: it queues each event (a FIFO), stores it from
// another goroutine, and hands it to each handler through two more (the
// handler's listener). Every hop waits for a CPU; with 10 updates at once
// on a 2-CPU node, those waits were most of draind's event-to-datapath
// latency (BenchmarkClusterScale's intake-p50/p99-ms: 0.18-0.26 and
// 0.6-1.7 ms through a shared informer, 0.04 and 0.3-0.8 here). A handler
// here holds up the watch while it runs, so it must never block: draind's
// records what changed and, when no pass is running, runs one (tens of µs
// per Service; daemon/pass.go, passNow). The watch buffers what comes
// meanwhile.
//
// It has no resync (draind's handlers drop resyncs anyway).
type SliceInformer struct {
	lw        cache.ListerWatcher
	objType   runtime.Object
	indexer   cache.Indexer
	transform cache.TransformFunc

	// mu orders every change of the indexer with its handler calls, and
	// handler registration with both.
	mu       sync.Mutex
	handlers []cache.ResourceEventHandler
	synced   chan struct{} // closed once the first list is stored and handled
	listing  atomic.Bool   // Replace is storing a list
}

var _ cache.TransformingStore = (*SliceInformer)(nil)

// NewSliceInformer returns an informer of objType from lw, indexed by
// indexers, that stores what transform makes of each object.
func NewSliceInformer(lw cache.ListerWatcher, objType runtime.Object, indexers cache.Indexers, transform cache.TransformFunc) *SliceInformer {
	if transform == nil {
		transform = func(o any) (any, error) { return o, nil }
	}
	return &SliceInformer{lw: lw, objType: objType, transform: transform, synced: make(chan struct{}),
		indexer: cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, indexers)}
}

// RunWithContext lists and watches until ctx ends.
func (s *SliceInformer) RunWithContext(ctx context.Context) {
	cache.NewReflectorWithOptions(s.lw, s.objType, s, cache.ReflectorOptions{Name: "endpointslices"}).RunWithContext(ctx)
}

// HasSynced reports whether the first list is stored and every handler
// has seen it.
func (s *SliceInformer) HasSynced() bool {
	select {
	case <-s.synced:
		return true
	default:
		return false
	}
}

// Listing reports whether the informer is storing a (re)list: its handlers
// then see one object of a list at a time, a state of the cache that is
// neither the one before the list nor the one after.
func (s *SliceInformer) Listing() bool { return s.listing.Load() }

// GetStore returns the cache (read it; writing it bypasses the handlers).
func (s *SliceInformer) GetStore() cache.Store { return s.indexer }

// GetIndexer returns the cache with its indexes.
func (s *SliceInformer) GetIndexer() cache.Indexer { return s.indexer }

// AddEventHandler registers h. Added after the first list, h is first
// told of every cached object (as a shared informer does).
func (s *SliceInformer) AddEventHandler(h cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handlers = append(s.handlers, h)
	if s.HasSynced() {
		for _, o := range s.indexer.List() {
			h.OnAdd(o, false)
		}
	}
	return sliceRegistration{s}, nil
}

type sliceRegistration struct{ s *SliceInformer }

func (r sliceRegistration) HasSynced() bool                     { return r.s.HasSynced() }
func (r sliceRegistration) HasSyncedChecker() cache.DoneChecker { return r }
func (r sliceRegistration) Name() string                        { return "endpointslices handler" }
func (r sliceRegistration) Done() <-chan struct{}               { return r.s.synced }

// The reflector's store (cache.ReflectorStore).

// Transformer lets the reflector's temporary store of a streamed list keep
// slim objects too.
func (s *SliceInformer) Transformer() cache.TransformFunc { return s.transform }

// Add stores a watched or listed object.
func (s *SliceInformer) Add(obj any) error { return s.Update(obj) }

// Update stores a watched object.
func (s *SliceInformer) Update(obj any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err := s.store(obj)
	return err
}

func (s *SliceInformer) store(obj any) (string, error) {
	obj, err := s.transform(obj)
	if err != nil {
		return "", err
	}
	key, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return "", err
	}
	old, exists, _ := s.indexer.GetByKey(key)
	if err := s.indexer.Update(obj); err != nil {
		return "", err
	}
	initial := !s.HasSynced()
	for _, h := range s.handlers {
		if exists {
			h.OnUpdate(old, obj)
		} else {
			h.OnAdd(obj, initial)
		}
	}
	return key, nil
}

// Delete removes a watched object; the handlers get it as the watch
// delivered it.
func (s *SliceInformer) Delete(obj any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	obj, err := s.transform(obj)
	if err != nil {
		return err
	}
	if err := s.indexer.Delete(obj); err != nil {
		return err
	}
	for _, h := range s.handlers {
		h.OnDelete(obj)
	}
	return nil
}

// Replace stores a (re)list: its objects as adds or updates, then what it
// no longer holds as deletions of unknown final state. It never fails.
func (s *SliceInformer) Replace(list []any, _ string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listing.Store(true)
	defer s.listing.Store(false)
	// Slim the whole list first, letting go of each API object as it is
	// slimmed: the handlers below allocate, and a collection meanwhile
	// must not find a list response of 150,000 endpoints live (its goal
	// would then keep that much garbage in RSS for a long while).
	for i, o := range list {
		if slim, err := s.transform(o); err == nil {
			list[i] = slim
		} else {
			list[i] = nil
		}
	}
	listed := make(map[string]struct{}, len(list))
	for _, o := range list {
		// An object that cannot be stored (no metadata) is left out, not
		// the whole list: relisting would meet it again.
		if o == nil {
			continue
		}
		if key, err := s.store(o); err == nil {
			listed[key] = struct{}{}
		}
	}
	for _, key := range s.indexer.ListKeys() {
		if _, ok := listed[key]; ok {
			continue
		}
		old, exists, _ := s.indexer.GetByKey(key)
		if !exists {
			continue
		}
		if err := s.indexer.Delete(old); err != nil {
			return err
		}
		for _, h := range s.handlers {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: key, Obj: old})
		}
	}
	if !s.HasSynced() {
		close(s.synced)
	}
	return nil
}

// Resync does nothing: nothing here resyncs.
func (s *SliceInformer) Resync() error { return nil }
