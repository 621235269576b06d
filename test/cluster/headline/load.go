package headline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// LoadNamespace holds the extra Services.
const LoadNamespace = "load"

// load is a busy cluster: Services without selector, each with a hand-made
// EndpointSlice of two endpoints (every kube-proxy programs them, every
// draind caches them), and a churn of slice updates elsewhere in the
// cluster (an endpoint's readiness flips), so that kube-proxy syncs as
// slowly as on a busy cluster.
type load struct {
	client kubernetes.Interface
	log    *slog.Logger

	mu     sync.Mutex
	slices []*discoveryv1.EndpointSlice // last written

	cancel  context.CancelFunc
	done    chan struct{}
	updates atomic.Int64
	errs    atomic.Int64
}

func ptr[T any](v T) *T { return &v }

// loadEndpoint i of slice n: 10.246.x.y, outside every pod range in use.
func loadEndpoint(n, i int) string {
	k := 2*n + i + 1
	return netip.AddrFrom4([4]byte{10, 246, byte(k >> 8), byte(k)}).String()
}

// createLoad creates n Services and their slices with workers parallel
// writers.
func createLoad(ctx context.Context, client kubernetes.Interface, n, workers int, log *slog.Logger) (*load, error) {
	l := &load{client: client, log: log, slices: make([]*discoveryv1.EndpointSlice, n)}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: LoadNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("creating namespace %s: %w", LoadNamespace, err)
	}
	start := time.Now()
	jobs := make(chan int)
	errc := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				if err := l.createOne(ctx, i); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range n {
		select {
		case jobs <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	if err != nil {
		return l, fmt.Errorf("creating the load Services: %w", err)
	}
	took := time.Since(start)
	log.Info("load created", "services", n, "took", took.Round(time.Millisecond),
		"service_and_slice_pairs_per_second", fmt.Sprintf("%.0f", float64(n)/took.Seconds()))
	return l, nil
}

func (l *load) createOne(ctx context.Context, i int) error {
	name := fmt.Sprintf("load-%04d", i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: LoadNamespace, Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	if _, err := l.client.CoreV1().Services(LoadNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating service %s: %w", name, err)
	}
	sl := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: LoadNamespace, Name: name + "-1", Labels: map[string]string{
			discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "headline-load.draind.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)}},
	}
	for e := range 2 {
		sl.Endpoints = append(sl.Endpoints, discoveryv1.Endpoint{Addresses: []string{loadEndpoint(i, e)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}})
	}
	created, err := l.client.DiscoveryV1().EndpointSlices(LoadNamespace).Create(ctx, sl, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = l.client.DiscoveryV1().EndpointSlices(LoadNamespace).Get(ctx, sl.Name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("creating endpointslice %s: %w", sl.Name, err)
	}
	l.mu.Lock()
	l.slices[i] = created
	l.mu.Unlock()
	return nil
}

// startChurn updates perSecond slices a second, round robin: the first
// endpoint's readiness flips, which every kube-proxy must program.
func (l *load) startChurn(perSecond int) {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan struct{})
	go func() {
		defer close(l.done)
		t := time.NewTicker(time.Second / time.Duration(perSecond))
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			l.mu.Lock()
			sl := l.slices[i%len(l.slices)].DeepCopy()
			l.mu.Unlock()
			ready := !*sl.Endpoints[0].Conditions.Ready
			sl.Endpoints[0].Conditions.Ready, sl.Endpoints[0].Conditions.Serving = &ready, &ready
			updated, err := l.client.DiscoveryV1().EndpointSlices(LoadNamespace).Update(ctx, sl, metav1.UpdateOptions{})
			if err != nil {
				if ctx.Err() == nil {
					l.errs.Add(1)
					l.log.Warn("churn update failed", "slice", sl.Name, "err", err)
				}
				continue
			}
			l.updates.Add(1)
			l.mu.Lock()
			l.slices[i%len(l.slices)] = updated
			l.mu.Unlock()
		}
	}()
}

func (l *load) stopChurn() {
	if l.cancel != nil {
		l.cancel()
		<-l.done
		l.cancel = nil
	}
}

// remove stops the churn and deletes the Services and slices.
func (l *load) remove(ctx context.Context) error {
	l.stopChurn()
	var errs []error
	for i, sl := range l.slices {
		if sl == nil {
			continue
		}
		name := fmt.Sprintf("load-%04d", i)
		if err := l.client.CoreV1().Services(LoadNamespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
		if err := l.client.DiscoveryV1().EndpointSlices(LoadNamespace).Delete(ctx, sl.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
