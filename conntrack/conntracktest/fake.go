package conntracktest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/draind/draind/conntrack"
)

// ErrInjected is what a Fake returns for a call it was told to fail.
var ErrInjected = errors.New("injected conntrack failure")

// Fake is an in-memory conntrack.Interface for tests of daemon/: it holds
// flows, applies exactly the matching rules conntrack.Netlink applies
// (conntrack.FilterSet.Classify and conntrack.CountedFor), and records
// every call so a test can assert how many operations a reconcile cost,
// not just the final table. The zero value is ready to use.
type Fake struct {
	mu      sync.Mutex
	flows   []conntrack.Flow
	expires [][]conntrack.Filter
	counts  []netip.Addr
	failN   int
	failErr error
	closed  bool
	zone    uint16
	noTS    bool
}

var (
	_ conntrack.Interface  = (*Fake)(nil)
	_ conntrack.FlowLister = (*Fake)(nil)
)

// New returns a Fake holding flows.
func New(flows ...conntrack.Flow) *Fake {
	f := &Fake{}
	f.AddFlow(flows...)
	return f
}

// AddFlow adds flows to the table.
func (f *Fake) AddFlow(flows ...conntrack.Flow) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flows = append(f.flows, flows...)
}

// Flows returns a copy of the table.
func (f *Fake) Flows() []conntrack.Flow {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.flows)
}

// SetZone makes the fake act in zone, as conntrack.Options.Zone does for
// conntrack.Netlink:
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
func (f *Fake) ExpireCalls() [][]conntrack.Filter {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]conntrack.Filter, len(f.expires))
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

// Expire removes the flows conntrack.Netlink.Expire would remove.
func (f *Fake) Expire(ctx context.Context, filters []conntrack.Filter) (conntrack.ExpireResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expires = append(f.expires, slices.Clone(filters))
	res := conntrack.ExpireResult{PerFilter: make([]int, len(filters))}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	if err := f.injected(); err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	set, err := conntrack.NewFilterSet(f.zone, filters)
	if err != nil {
		return res, fmt.Errorf("expiring flows: %w", err)
	}
	f.flows = slices.DeleteFunc(f.flows, func(fl conntrack.Flow) bool {
		switch v, i := set.Classify(fl); v {
		case conntrack.VerdictExpire:
			res.Deleted++
			res.PerFilter[i]++
			return true
		case conntrack.VerdictKeep:
			res.Kept++
		}
		return false
	})
	return res, nil
}

// Count counts the flows whose reply-direction source is addr.
func (f *Fake) Count(ctx context.Context, addr netip.Addr) (conntrack.Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.counts = append(f.counts, addr)
	var c conntrack.Counts
	addr, err := f.begin(ctx, "counting", addr)
	if err != nil {
		return c, err
	}
	for _, fl := range f.flows {
		if conntrack.CountedFor(f.zone, addr, fl) {
			c.Add(fl)
		}
	}
	return c, nil
}

// Close marks the fake closed; later calls fail, as they do on
// conntrack.Netlink.
func (f *Fake) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

// EndpointFlows implements conntrack.FlowLister: the flows of protocol
// proto that Count(addr) includes.
func (f *Fake) EndpointFlows(ctx context.Context, addr netip.Addr, proto conntrack.Proto) ([]conntrack.Flow, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	addr, err := f.begin(ctx, "listing", addr)
	if err != nil {
		return nil, err
	}
	var out []conntrack.Flow
	for _, fl := range f.flows {
		if fl.Proto == proto && conntrack.CountedFor(f.zone, addr, fl) {
			out = append(out, fl)
		}
	}
	return out, nil
}

// begin starts a call that reads the flows of addr (what: "counting" or
// "listing"): it fails as the call would on a cancelled context, an
// injected failure or an unset address, else returns addr unmapped. f.mu
// must be held.
func (f *Fake) begin(ctx context.Context, what string, addr netip.Addr) (netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return addr, fmt.Errorf("%s flows of %s: %w", what, addr, err)
	}
	if err := f.injected(); err != nil {
		return addr, fmt.Errorf("%s flows of %s: %w", what, addr, err)
	}
	if !addr.IsValid() {
		return addr, fmt.Errorf("%s flows: address is not set", what)
	}
	return addr.Unmap(), nil
}
