package k8s

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestUnreachable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("dial tcp 127.0.0.1:6443: %w", syscall.ECONNREFUSED), true},
		{fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{apierrors.NewServiceUnavailable("starting"), true},
		{apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "x", errors.New("rbac")), false},
		{apierrors.NewResourceExpired("too old"), false},
		{errors.New("something else"), false},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRetryUnreachable: connection errors are retried inside the call (the
// reflector never backs off); answers pass through at once; the context
// ends the wait.
func TestRetryUnreachable(t *testing.T) {
	n := 0
	v, err := retryUnreachable(context.Background(), func() (int, error) {
		n++
		if n < 3 {
			return 0, fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
		}
		return 42, nil
	})
	if v != 42 || err != nil || n != 3 {
		t.Fatalf("got %v, %v after %d calls", v, err, n)
	}
	n = 0
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "leases"}, "x", errors.New("rbac"))
	if _, err := retryUnreachable(context.Background(), func() (int, error) { n++; return 0, forbidden }); !apierrors.IsForbidden(err) || n != 1 {
		t.Fatalf("an answer was retried: %v after %d calls", err, n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := retryUnreachable(ctx, func() (int, error) { return 0, syscall.ECONNREFUSED }); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("after the context ended: %v", err)
	}
}
