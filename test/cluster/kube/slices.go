package kube

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Endpoint is one endpoint of a Service as its EndpointSlices publish it.
type Endpoint struct {
	Addr        netip.Addr
	Pod         string // targetRef name, "" if none
	Node        string
	Ready       bool
	Serving     bool
	Terminating bool
}

// EndpointsSnapshot is the merged endpoints of a Service at one moment.
type EndpointsSnapshot struct {
	// At is when the watch saw the change that produced this state.
	At        time.Time
	Endpoints []Endpoint
}

// Ready counts the ready endpoints.
func (s EndpointsSnapshot) Ready() int {
	n := 0
	for _, e := range s.Endpoints {
		if e.Ready {
			n++
		}
	}
	return n
}

// Find returns the endpoint with address a.
func (s EndpointsSnapshot) Find(a netip.Addr) (Endpoint, bool) {
	for _, e := range s.Endpoints {
		if e.Addr == a {
			return e, true
		}
	}
	return Endpoint{}, false
}

// EndpointsWatch follows the EndpointSlices of one Service and keeps the
// history of their merged state with the time each change was seen, so a
// test can ask when something became true after an action, even if it asks
// after the fact.
type EndpointsWatch struct {
	namespace, service string
	cancel             context.CancelFunc
	done               chan struct{}

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every change
	history []EndpointsSnapshot
	store   cache.Store
}

// maxEndpointsHistory bounds the history of a long-running watch.
const maxEndpointsHistory = 100_000

// WatchEndpoints starts watching the EndpointSlices of namespace/service
// (label kubernetes.io/service-name) and returns once the initial list is
// in.
func WatchEndpoints(ctx context.Context, client kubernetes.Interface, namespace, service string) (*EndpointsWatch, error) {
	wctx, cancel := context.WithCancel(context.Background())
	w := &EndpointsWatch{namespace: namespace, service: service, cancel: cancel, done: make(chan struct{}), changed: make(chan struct{})}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = discoveryv1.LabelServiceName + "=" + service
		}))
	inf := factory.Discovery().V1().EndpointSlices().Informer()
	w.store = inf.GetStore()
	record := func(any) { w.record() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, o any) { record(o) },
		DeleteFunc: record,
	}); err != nil {
		cancel()
		return nil, fmt.Errorf("watching endpointslices of %s/%s: %w", namespace, service, err)
	}
	go func() {
		defer close(w.done)
		inf.Run(wctx.Done())
	}()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		w.Stop()
		return nil, fmt.Errorf("watching endpointslices of %s/%s: %w", namespace, service, context.Cause(ctx))
	}
	w.record()
	return w, nil
}

func (w *EndpointsWatch) record() {
	now := time.Now()
	snap := EndpointsSnapshot{At: now}
	for _, o := range w.store.List() {
		s := o.(*discoveryv1.EndpointSlice)
		for _, e := range s.Endpoints {
			ep := Endpoint{
				Ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
				Serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
				Terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
			}
			if e.TargetRef != nil {
				ep.Pod = e.TargetRef.Name
			}
			if e.NodeName != nil {
				ep.Node = *e.NodeName
			}
			for _, a := range e.Addresses {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				ep.Addr = addr
				snap.Endpoints = append(snap.Endpoints, ep)
			}
		}
	}
	slices.SortFunc(snap.Endpoints, func(a, b Endpoint) int { return a.Addr.Compare(b.Addr) })
	w.mu.Lock()
	defer w.mu.Unlock()
	if n := len(w.history); n > 0 && slices.Equal(w.history[n-1].Endpoints, snap.Endpoints) {
		return // a no-op update (resync, unrelated field)
	}
	if len(w.history) >= maxEndpointsHistory {
		w.history = slices.Delete(w.history, 0, len(w.history)/2)
	}
	w.history = append(w.history, snap)
	close(w.changed)
	w.changed = make(chan struct{})
}

// Current returns the latest state.
func (w *EndpointsWatch) Current() EndpointsSnapshot {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.history[len(w.history)-1]
}

// Wait returns the first state seen at or after since that satisfies cond,
// waiting for it if it has not happened yet.
func (w *EndpointsWatch) Wait(ctx context.Context, since time.Time, cond func(EndpointsSnapshot) bool) (EndpointsSnapshot, error) {
	for {
		w.mu.Lock()
		for _, s := range w.history {
			if !s.At.Before(since) && cond(s) {
				w.mu.Unlock()
				return s, nil
			}
		}
		// Everything up to now has been checked.
		if n := len(w.history); n > 0 && w.history[n-1].At.After(since) {
			since = w.history[n-1].At.Add(time.Nanosecond)
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			cur := w.Current()
			return EndpointsSnapshot{}, fmt.Errorf("waiting for endpoints of %s/%s (now %+v): %w", w.namespace, w.service, cur.Endpoints, context.Cause(ctx))
		}
	}
}

// WaitReady waits until the Service's endpoints are exactly addrs, all
// ready.
func (w *EndpointsWatch) WaitReady(ctx context.Context, addrs ...netip.Addr) (EndpointsSnapshot, error) {
	return w.Wait(ctx, time.Time{}, func(s EndpointsSnapshot) bool {
		if len(s.Endpoints) != len(addrs) {
			return false
		}
		for _, a := range addrs {
			if e, ok := s.Find(a); !ok || !e.Ready {
				return false
			}
		}
		return true
	})
}

// Stop ends the watch.
func (w *EndpointsWatch) Stop() {
	w.cancel()
	<-w.done
}
