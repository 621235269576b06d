package kube

import (
	"context"
	"net/netip"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func slice(name, service string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
	}
}

func endpoint(ip string, ready, terminating bool) discoveryv1.Endpoint {
	serving := true
	return discoveryv1.Endpoint{
		Addresses:  []string{ip},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
	}
}

func TestEndpointsWatch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, b := netip.MustParseAddr("10.244.0.10"), netip.MustParseAddr("10.244.1.10")
	cs := fake.NewClientset(
		slice("web-1", "web", endpoint(a.String(), true, false)),
		slice("other-1", "other", endpoint("10.244.9.9", true, false)),
	)
	slices := cs.DiscoveryV1().EndpointSlices("default")
	w, err := WatchEndpoints(ctx, cs, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if cur := w.Current(); len(cur.Endpoints) != 1 || cur.Endpoints[0].Addr != a {
		t.Fatalf("initial state %+v: want only %s (slices of other services excluded)", cur.Endpoints, a)
	}

	// A second slice of the same service is merged.
	if _, err := slices.Create(ctx, slice("web-2", "web", endpoint(b.String(), true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WaitReady(ctx, a, b); err != nil {
		t.Fatal(err)
	}

	terminating := func(s EndpointsSnapshot) bool {
		e, ok := s.Find(a)
		return ok && e.Terminating
	}
	since := time.Now()
	if _, err := slices.Update(ctx, slice("web-1", "web", endpoint(a.String(), false, true)), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	first, err := w.Wait(ctx, since, terminating)
	if err != nil {
		t.Fatal(err)
	}
	if first.At.Before(since) || first.Ready() != 1 {
		t.Errorf("terminating state %+v seen at %v, want after %v with one ready endpoint", first.Endpoints, first.At, since)
	}

	// Later changes do not move the answer: asked again after another
	// update, Wait still returns the state where the condition first held.
	if err := slices.Delete(ctx, "web-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Wait(ctx, since, func(s EndpointsSnapshot) bool { return len(s.Endpoints) == 1 }); err != nil {
		t.Fatal(err)
	}
	again, err := w.Wait(ctx, since, terminating)
	if err != nil {
		t.Fatal(err)
	}
	if !again.At.Equal(first.At) {
		t.Errorf("second Wait returned the state of %v, want the first one of %v", again.At, first.At)
	}

	// States from before since do not count: nothing has changed since now,
	// so waiting for the (still true) condition ends with the context.
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelShort()
	if s, err := w.Wait(short, time.Now(), terminating); err == nil {
		t.Errorf("Wait since now returned the earlier state %+v seen at %v", s.Endpoints, s.At)
	}
}
