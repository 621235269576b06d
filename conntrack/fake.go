package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
)

// ErrInjected is what a Fake returns for a call it was told to fail.
var ErrInjected = errors.New("injected conntrack failure")

// Fake is an in-memory Interface for tests of daemon/: it holds flows,
// applies exactly the matching rules Netlink applies (the same FilterSet.Classify and CountedFor),
// and records every call so a test can assert how many operations a
// reconcile cost, not just the final table. The zero value is ready to use.
type Fake struct {
	mu      sync.Mutex
	flows   []Flow
	expires [][]Filter
	counts  []netip.Addr
	failN   int
	failErr error
	closed  bool
	zone    uint16
	noTS    bool
}

var _ Interface = (*Fake)(nil)

// NewFake returns a Fake holding flows.
func NewFake(flows ...Flow) *Fake {
	f := &Fake{}
	f.AddFlow(flows...)
	return f
}

// AddFlow adds flows to the table.
func (f *Fake) AddFlow(flows ...Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append(f.flows, flows...)
}

// Flows returns a copy of the table.
func (f *Fake) Flows() []Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// SetZone makes the fake act in zone, as Options.Zone does for Netlink:
// flows of other zones are neither expired nor counted.
func (f *Fake) SetZone(zone uint16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.zone = zone
}

// SetTimestamps sets what Timestamps reports (true until told otherwise),
// to exercise a caller's handling of a table without start times.
func (f *Fake) SetTimestamps(on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.noTS = !on
}

// Timestamps reports what SetTimestamps set; true by default.
func (f *Fake) Timestamps() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.noTS
}

// FailNext makes the next n calls to Expire or Count fail with err
// (ErrInjected when err is nil) without touching the table, to exercise a
// caller's retries.
func (f *Fake) FailNext(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		err = ErrInjected
	}
	f.failN, f.failErr = n, err
}

// ExpireCalls returns the filters of every Expire call so far, failed ones
// included, in call order.
func (f *Fake) ExpireCalls() [][]Filter {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]Filter, len(f.expires))
	for i, c := range f.expires {
		out[i] = slices.Clone(c)
	}
	return out
}

// CountCalls returns the address of every Count call so far, failed ones
// included, in call order.
func (f *Fake) CountCalls() []netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.counts)
}

// Closed reports whether Close was called.
func (f *Fake) Closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.closed
}

// injected consumes one injected failure, if any. f.mu must be held.
func (f *Fake) injected() error {
	if f.closed {
		return errors.New("conntrack handle is closed")
	}
	if f.failN > 0 {
		f.failN--
		return f.failErr
	}
	return nil
}

// Expire removes the flows Netlink.Expire would remove.
func (f *Fake) Expire(ctx context.Context, filters []Filter) (ExpireResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expires = append(f.expires, slices.Clone(filters))
	res := ExpireResult{PerFilter: make([]int, len(filters))}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	if err := f.injected(); err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	set, err := NewFilterSet(f.zone, filters)
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	f.flows = slices.DeleteFunc(f.flows, func(fl Flow) bool {
		switch v, i := set.Classify(fl); v {
		case VerdictExpire:
			res.Deleted++
			res.PerFilter[i]++
			return true
		case VerdictKeep:
			res.Kept++
		}
		return false
	})
	return res, nil
}

// Count counts the flows whose reply-direction source is addr.
func (f *Fake) Count(ctx context.Context, addr netip.Addr) (Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts = append(f.counts, addr)
	var c Counts
	if err := ctx.Err(); err != nil {
		return c, fmt.Errorf("counting flows of %s: %w", addr, err)
	}
	if err := f.injected(); err != nil {
		return c, fmt.Errorf("counting flows of %s: %w", addr, err)
	}
	if !addr.IsValid() {
		return c, errors.New("counting flows: address is not set")
	}
	addr = addr.Unmap()
	for _, fl := range f.flows {
		if CountedFor(f.zone, addr, fl) {
			c.Add(fl)
		}
	}
	return c, nil
}

// Close marks the fake closed; later calls fail, as they do on Netlink.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}
