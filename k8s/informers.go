package k8s

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

// Config selects what the informers watch.
type Config struct {
	// Namespace holds the drain Leases (draind's own namespace).
	Namespace string
	// NodeName restricts the Pod informer to this node's pods.
	NodeName string
	// Resync re-delivers every cached object periodically (0: never);
	// not the EndpointSlices (SliceInformer never resyncs).
	Resync time.Duration
	// Clock stamps each object's receipt (nil: the real clock).
	Clock clock.PassiveClock
	// REST, when set, is the client configuration the clientset was made
	// from: the EndpointSlice watch then decodes straight into slim slices
	// (slicecodec.go). Without it (a fake clientset) slices are decoded by
	// the clientset and converted.
	REST *rest.Config
}

// Informers are draind's four watches, each caching slim objects.
type Informers struct {
	Slices   *SliceInformer
	Services cache.SharedIndexInformer
	Leases   cache.SharedIndexInformer
	Pods     cache.SharedIndexInformer

	// Malformed counts objects that could not be (fully) converted.
	Malformed atomic.Uint64
	// SliceDecoding says how EndpointSlice watch events are decoded:
	// "slim" (draind's own slice client: protobuf straight into slices,
	// other encodings converted as they are decoded) or why not.
	SliceDecoding string
	// Nodes numbers the node names of the slices the informers decode.
	Nodes *NodeTable

	node string
}

// IndexByService indexes slices by "namespace/service".
const IndexByService = "service"

// NewInformers builds the informers; Start runs them.
func NewInformers(client kubernetes.Interface, cfg Config) *Informers {
	inf := &Informers{node: cfg.NodeName, Nodes: new(NodeTable)}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	// Every transform stamps the object's receipt (see Receipt).
	setTransform := func(i cache.SharedIndexInformer, f cache.TransformFunc) {
		if err := i.SetTransform(stampReceipt(clk, f)); err != nil {
			panic(err) // only if the informer had started: a bug here
		}
	}
	// Streaming lists (WatchList) only where the client supports them: the
	// fake clientset of the tests does not.
	lw := func(l *cache.ListWatch) cache.ListerWatcher {
		return cache.ToListWatcherWithWatchListSemantics(reconnecting(l), client)
	}
	opts := func(ix cache.Indexers) cache.SharedIndexInformerOptions {
		return cache.SharedIndexInformerOptions{ResyncPeriod: cfg.Resync, Indexers: ix}
	}
	inf.Slices = newSlices(inf, client, cfg, clk, lw)

	core := client.CoreV1()
	inf.Services = cache.NewSharedIndexInformerWithOptions(lw(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return core.Services(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return core.Services(metav1.NamespaceAll).Watch(ctx, o)
		},
	}), &corev1.Service{}, opts(cache.Indexers{}))
	setTransform(inf.Services, slimTransform(inf, ServiceFrom))

	coord := client.CoordinationV1()
	leaseOpts := func(o *metav1.ListOptions) { o.LabelSelector = WatchSelector() }
	inf.Leases = cache.NewSharedIndexInformerWithOptions(lw(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			leaseOpts(&o)
			return coord.Leases(cfg.Namespace).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			leaseOpts(&o)
			return coord.Leases(cfg.Namespace).Watch(ctx, o)
		},
	}), &coordinationv1.Lease{}, opts(cache.Indexers{}))
	setTransform(inf.Leases, leaseTransform(inf))

	inf.Pods = cache.NewSharedIndexInformerWithOptions(lw(nodePods(core, cfg.NodeName)), &corev1.Pod{}, opts(cache.Indexers{}))
	setTransform(inf.Pods, func(obj any) (any, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return obj, nil
		}
		return PodFrom(p), nil
	})
	return inf
}

// newSlices is the cluster's EndpointSlice informer: decoded straight
// into *Slice by draind's own watch where a REST configuration allows it
// (inf.SliceDecoding says which).
func newSlices(inf *Informers, client kubernetes.Interface, cfg Config, clk clock.PassiveClock, lw func(*cache.ListWatch) cache.ListerWatcher) *SliceInformer {
	disc := client.DiscoveryV1()
	// The watch delivers *Slice when it decodes them itself (lists still
	// come as the API's objects, converted by the transform).
	var sliceType runtime.Object = &discoveryv1.EndpointSlice{}
	watchSlices := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return disc.EndpointSlices(metav1.NamespaceAll).Watch(ctx, o)
	}
	inf.SliceDecoding = "generic: no REST configuration (a fake clientset)"
	if cfg.REST != nil {
		if w, err := sliceWatcher(cfg.REST, clk, inf); err != nil {
			inf.SliceDecoding = "generic: " + err.Error()
		} else {
			sliceType, watchSlices, inf.SliceDecoding = &Slice{}, w, "slim"
		}
	}
	// Slices: the busiest watch by far, handled as it arrives (see
	// SliceInformer).
	return NewSliceInformer(lw(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return disc.EndpointSlices(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: watchSlices,
	}), sliceType, cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
		IndexByService: func(obj any) ([]string, error) {
			s, ok := obj.(*Slice)
			if !ok || s.Service == "" {
				return nil, nil
			}
			return []string{s.Namespace + "/" + s.Service}, nil
		},
	}, stampReceipt(clk, slimTransform(inf, inf.sliceFrom)))
}

// sliceFrom converts a slice, its node names numbered in the informers'
// table.
func (inf *Informers) sliceFrom(es *discoveryv1.EndpointSlice) (*Slice, int) {
	return SliceFrom(es, inf.Nodes)
}

// nodePods lists and watches the pods of one node.
func nodePods(core corev1client.CoreV1Interface, node string) *cache.ListWatch {
	podOpts := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", node).String()
	}
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			podOpts(&o)
			return core.Pods(metav1.NamespaceAll).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			podOpts(&o)
			return core.Pods(metav1.NamespaceAll).Watch(ctx, o)
		},
	}
}

// leaseTransform parses drain Leases as the cache stores them. A malformed
// one becomes a keyed placeholder (counted in inf.Malformed) so that its
// updates and deletes still match, with no pod: the model ignores it.
func leaseTransform(inf *Informers) cache.TransformFunc {
	return func(obj any) (any, error) {
		l, ok := obj.(*coordinationv1.Lease)
		if !ok {
			return obj, nil
		}
		dl, err := ParseLease(l)
		if err != nil {
			inf.Malformed.Add(1)
			return &DrainLease{ObjectMeta: slimMeta(&l.ObjectMeta)}, nil
		}
		return dl, nil
	}
}

// stampReceipt wraps an informer's transform: the slim object it makes
// records when it was received (the clock read before converting it). An
// object that is slim already (informers may deliver one twice) keeps its
// first stamp.
func stampReceipt(clk clock.PassiveClock, transform cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, slim := obj.(stamped); slim {
			return transform(obj)
		}
		now := clk.Now()
		out, err := transform(obj)
		if s, ok := out.(stamped); ok && err == nil {
			s.Stamp(now)
		}
		return out, err
	}
}

// slimTransform is an informer's transform that caches the slim form of
// an API object of type *T (from converts it and counts what it skipped).
// Anything else (a tombstone, an object already slim: informers may
// deliver an object twice) passes through unchanged.
func slimTransform[T any, S any](inf *Informers, from func(*T) (S, int)) func(any) (any, error) {
	return func(obj any) (any, error) {
		o, ok := obj.(*T)
		if !ok {
			return obj, nil
		}
		slim, skipped := from(o)
		inf.noteSkipped(skipped)
		return slim, nil
	}
}

// informer is what Run and the sync checks need of an informer.
type informer interface {
	RunWithContext(context.Context)
	HasSynced() bool
}

// All returns the informers with their names.
func (inf *Informers) All() map[string]informer {
	return map[string]informer{
		"endpointslices": inf.Slices, "services": inf.Services, "leases": inf.Leases, "pods": inf.Pods,
	}
}

// RunAndWait runs the informers until ctx ends and returns once they all
// stopped.
func (inf *Informers) RunAndWait(ctx context.Context) {
	var wg sync.WaitGroup
	for _, i := range inf.All() {
		wg.Go(func() { i.RunWithContext(ctx) })
	}
	wg.Wait()
}

// WaitForSync blocks until every informer has synced or ctx ends.
func (inf *Informers) WaitForSync(ctx context.Context) error {
	for name, i := range inf.All() {
		if !cache.WaitForCacheSync(ctx.Done(), i.HasSynced) {
			return fmt.Errorf("waiting for the %s informer to sync: %w", name, ctx.Err())
		}
	}
	return nil
}

// Synced reports per informer whether it has synced.
func (inf *Informers) Synced() map[string]bool {
	out := map[string]bool{}
	for name, i := range inf.All() {
		out[name] = i.HasSynced()
	}
	return out
}

// SlicesOf returns the cached slices of a Service ("namespace/name").
func (inf *Informers) SlicesOf(key string) []*Slice {
	objs, _ := inf.Slices.GetIndexer().ByIndex(IndexByService, key)
	out := make([]*Slice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*Slice); ok {
			out = append(out, s)
		}
	}
	return out
}

// Service returns a cached Service ("namespace/name").
func (inf *Informers) Service(key string) *Service {
	o, ok, _ := inf.Services.GetIndexer().GetByKey(key)
	if !ok {
		return nil
	}
	s, _ := o.(*Service)
	return s
}

// SlicesInNamespace returns the cached slices of a namespace.
func (inf *Informers) SlicesInNamespace(ns string) []*Slice {
	objs, _ := inf.Slices.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	out := make([]*Slice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*Slice); ok {
			out = append(out, s)
		}
	}
	return out
}

// LocalPods returns this node's cached pods. The watch selects them by
// spec.nodeName already; the check here keeps a pod of another node out
// whatever the API (or a test's fake) sends.
func (inf *Informers) LocalPods() []*Pod {
	var out []*Pod
	for _, o := range inf.Pods.GetStore().List() {
		if p, ok := o.(*Pod); ok && (inf.node == "" || p.Node == inf.node) {
			out = append(out, p)
		}
	}
	return out
}

// DrainLeases returns the cached, well-formed drain Leases.
func (inf *Informers) DrainLeases() []*DrainLease {
	var out []*DrainLease
	for _, o := range inf.Leases.GetStore().List() {
		if l, ok := o.(*DrainLease); ok && l.PodUID != "" && !l.Claim {
			out = append(out, l)
		}
	}
	return out
}

// ClaimLeases returns the cached, well-formed claim Leases.
func (inf *Informers) ClaimLeases() []*DrainLease {
	var out []*DrainLease
	for _, o := range inf.Leases.GetStore().List() {
		if l, ok := o.(*DrainLease); ok && l.PodUID != "" && l.Claim {
			out = append(out, l)
		}
	}
	return out
}
