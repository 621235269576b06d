package k8s

import (
	"context"
	"slices"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// handlerLog records what a handler was told, in order.
type handlerLog struct{ got []string }

func (l *handlerLog) handler() cache.ResourceEventHandlerFuncs {
	name := func(o any) string {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			return "tombstone:" + t.Key
		}
		s := o.(*Slice)
		return s.Namespace + "/" + s.Name + "@" + s.ResourceVersion
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { l.got = append(l.got, "add "+name(o)) },
		UpdateFunc: func(o, n any) { l.got = append(l.got, "update "+name(o)+" -> "+name(n)) },
		DeleteFunc: func(o any) { l.got = append(l.got, "delete "+name(o)) },
	}
}

func (l *handlerLog) take() []string { out := l.got; l.got = nil; return out }

func apiSlice(name, rv string) *discoveryv1.EndpointSlice {
	s := fullSlice()
	s.Name, s.ResourceVersion = name, rv
	return s
}

// TestSliceInformerStore: what the reflector stores reaches the cache and
// every handler at once, in order, slimmed: a list as adds, then watch
// events as adds, updates (with the cached object as old) and deletions; a
// relist as updates, and what it lacks as deletions of unknown final
// state. Synced only once the first list is handled; a handler added later
// is told of the cache first.
func TestSliceInformerStore(t *testing.T) {
	inf := &Informers{}
	s := NewSliceInformer(nil, &discoveryv1.EndpointSlice{}, cache.Indexers{}, slimTransform(inf, inf.sliceFrom))
	var first handlerLog
	reg, _ := s.AddEventHandler(first.handler())
	if s.HasSynced() || reg.HasSynced() {
		t.Fatal("synced before any list")
	}
	if err := s.Replace([]any{apiSlice("a", "1"), apiSlice("b", "2"), "not an object"}, "2"); err != nil {
		t.Fatalf("a list with an object without metadata: %v", err)
	}
	if !s.HasSynced() || !reg.HasSynced() {
		t.Fatal("not synced after the first list")
	}
	select {
	case <-reg.HasSyncedChecker().Done():
	default:
		t.Fatal("the registration's checker is not done after the first list")
	}
	steps := []struct {
		do   func() error
		want []string
	}{
		{nil, []string{"add shop/a@1", "add shop/b@2"}},
		{func() error { return s.Add(apiSlice("c", "3")) }, []string{"add shop/c@3"}},
		{func() error { return s.Update(apiSlice("a", "4")) }, []string{"update shop/a@1 -> shop/a@4"}},
		{func() error { return s.Delete(apiSlice("b", "5")) }, []string{"delete shop/b@5"}},
		// A relist: a is unchanged, c is gone, d is new.
		{func() error { return s.Replace([]any{apiSlice("a", "4"), apiSlice("d", "6")}, "6") },
			[]string{"update shop/a@4 -> shop/a@4", "add shop/d@6", "delete tombstone:shop/c"}},
	}
	for i, st := range steps {
		if st.do != nil {
			if err := st.do(); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
		}
		if got := first.take(); !slices.Equal(got, st.want) {
			t.Errorf("step %d: handler saw %q, want %q", i, got, st.want)
		}
	}
	keys := s.GetStore().ListKeys()
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"shop/a", "shop/d"}) {
		t.Errorf("cached %v", keys)
	}
	if _, ok := s.GetStore().List()[0].(*Slice); !ok {
		t.Errorf("cached a %T, want the slim *Slice", s.GetStore().List()[0])
	}
	var late handlerLog
	if _, err := s.AddEventHandler(late.handler()); err != nil {
		t.Fatal(err)
	}
	got := late.take()
	slices.Sort(got)
	if want := []string{"add shop/a@4", "add shop/d@6"}; !slices.Equal(got, want) {
		t.Errorf("a handler added after the sync was told %q, want %q", got, want)
	}
}

// TestSliceInformerWatches: against a clientset, the informer lists, then
// follows creates, updates and deletes as they happen.
func TestSliceInformerWatches(t *testing.T) {
	client := fake.NewClientset(apiSlice("a", ""))
	inf := NewInformers(client, Config{Namespace: "draind-system", NodeName: "node-0"})
	events := make(chan string, 16)
	inf.Slices.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { events <- "add " + o.(*Slice).Name },
		UpdateFunc: func(_, n any) { events <- "update " + n.(*Slice).Name },
		DeleteFunc: func(o any) { events <- "delete " + o.(*Slice).Name },
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { inf.Slices.RunWithContext(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	next := func() string {
		select {
		case e := <-events:
			return e
		case <-ctx.Done():
			return "nothing"
		}
	}
	if e := next(); e != "add a" {
		t.Fatalf("first event %q, want the listed slice's add", e)
	}
	if !cache.WaitForCacheSync(ctx.Done(), inf.Slices.HasSynced) {
		t.Fatal("never synced")
	}
	// Each change waits for its event before the next: the fake
	// clientset's watch may end and be re-established (a relist) between
	// two changes, and a change made in between then reaches the handlers
	// as the difference the relist finds, not as its own event.
	sl := client.DiscoveryV1().EndpointSlices("shop")
	b := apiSlice("b", "")
	var got []string
	for _, change := range []func() error{
		func() error { _, err := sl.Create(ctx, b, metav1.CreateOptions{}); return err },
		func() error {
			b.Labels = map[string]string{"x": "y"}
			_, err := sl.Update(ctx, b, metav1.UpdateOptions{})
			return err
		},
		func() error { return sl.Delete(ctx, "a", metav1.DeleteOptions{}) },
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
		got = append(got, next())
	}
	if want := []string{"add b", "update b", "delete a"}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	if n := len(inf.Slices.GetStore().ListKeys()); n != 1 {
		t.Errorf("%d slices cached, want 1", n)
	}
}
