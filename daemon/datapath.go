package daemon

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/draind/draind/bpf"
)

// Datapath is what the reconciler drives: the real one is *bpf.Datapath,
// tests use FakeDatapath. SetBackends must not keep b.Backends past the
// call: the reconciler reuses the array.
type Datapath interface {
	UpsertFrontend(bpf.Frontend) error
	DeleteFrontend(bpf.EndpointKey) error
	SetBackends(bpf.Backends) error
	DeleteBackends(bpf.ServicePortID) error
	UpsertDrain(bpf.Drain) error
	DeleteDrain(bpf.EndpointKey) error
	DrainStats(bpf.EndpointKey) (bpf.DrainStats, error)
	Counters() (bpf.Counters, error)
	MapStats() ([]bpf.MapStat, error)
	Dump() (*bpf.Dump, error)
}

var _ Datapath = (*bpf.Datapath)(nil)
var _ Datapath = (*FakeDatapath)(nil)

// FakeDatapath keeps the maps in memory and counts operations.
type FakeDatapath struct {
	mu        sync.Mutex
	Frontends map[bpf.EndpointKey]bpf.Frontend
	Backends  map[bpf.ServicePortID]bpf.Backends
	Drains    map[bpf.EndpointKey]bpf.Drain
	Stats     map[bpf.EndpointKey]bpf.DrainStats
	Ctr       bpf.Counters
	// Ops counts every mutating call.
	Ops int
	// FailNext makes the next n mutating calls fail.
	FailNext int
	// Capacity limits the drains map (0: unlimited), as a full BPF map would.
	Capacity int
	// StatsErr, if set, is what DrainStats fails with (an unreadable map).
	StatsErr error

	crashIn int // > 0: operations left before a simulated crash
	crashed bool
	logging bool
	log     []FakeOp
}

// The kinds of FakeOp.
const (
	OpUpsertFrontend = "upsert-frontend"
	OpDeleteFrontend = "delete-frontend"
	OpSetBackends    = "set-backends"
	OpDeleteBackends = "delete-backends"
	OpUpsertDrain    = "upsert-drain"
	OpDeleteDrain    = "delete-drain"
)

// FakeOp is one mutating call the fake applied, with its argument.
type FakeOp struct {
	Kind     string
	Key      bpf.EndpointKey // deletes of frontends and drains
	Service  bpf.ServicePortID
	Frontend bpf.Frontend
	Backends bpf.Backends
	Drain    bpf.Drain
}

func (o FakeOp) String() string {
	switch o.Kind {
	case OpUpsertFrontend:
		return fmt.Sprintf("%s %v -> %d", o.Kind, o.Frontend.Key, o.Frontend.Service)
	case OpSetBackends:
		return fmt.Sprintf("%s %d %v", o.Kind, o.Backends.Service, o.Backends.Backends)
	case OpDeleteBackends:
		return fmt.Sprintf("%s %d", o.Kind, o.Service)
	case OpUpsertDrain:
		return fmt.Sprintf("%s %v %v svc %d", o.Kind, o.Drain.Key, o.Drain.Policy, o.Drain.Service)
	}
	return fmt.Sprintf("%s %v", o.Kind, o.Key)
}

// CrashAfter makes the fake stop applying anything after n more
// operations, as if draind died there: later calls fail and change nothing.
func (f *FakeDatapath) CrashAfter(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crashIn, f.crashed = n, n == 0
}

// Recover ends a simulated crash (the next daemon starts).
func (f *FakeDatapath) Recover() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crashIn, f.crashed = 0, false
}

// StartLog starts recording applied operations.
func (f *FakeDatapath) StartLog() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logging, f.log = true, nil
}

// StopLog returns the operations applied since StartLog.
func (f *FakeDatapath) StopLog() []FakeOp {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logging = false
	return f.log
}

// NewFakeDatapath returns an empty fake.
func NewFakeDatapath() *FakeDatapath {
	return &FakeDatapath{
		Frontends: map[bpf.EndpointKey]bpf.Frontend{},
		Backends:  map[bpf.ServicePortID]bpf.Backends{},
		Drains:    map[bpf.EndpointKey]bpf.Drain{},
		Stats:     map[bpf.EndpointKey]bpf.DrainStats{},
	}
}

// op accounts for one mutating call; a nil error means apply it and
// record op.
func (f *FakeDatapath) op(op FakeOp) error {
	f.Ops++
	if f.crashed {
		return fmt.Errorf("fake datapath: crashed")
	}
	if f.FailNext > 0 {
		f.FailNext--
		return fmt.Errorf("fake datapath: injected failure")
	}
	if f.crashIn > 0 {
		f.crashIn--
		f.crashed = f.crashIn == 0
	}
	if f.logging {
		f.log = append(f.log, op)
	}
	return nil
}

// UpsertFrontend implements Datapath.
func (f *FakeDatapath) UpsertFrontend(fe bpf.Frontend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(FakeOp{Kind: OpUpsertFrontend, Frontend: fe}); err != nil {
		return err
	}
	f.Frontends[fe.Key] = fe
	return nil
}

// DeleteFrontend implements Datapath.
func (f *FakeDatapath) DeleteFrontend(k bpf.EndpointKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(FakeOp{Kind: OpDeleteFrontend, Key: k}); err != nil {
		return err
	}
	delete(f.Frontends, k)
	return nil
}

// SetBackends implements Datapath.
func (f *FakeDatapath) SetBackends(b bpf.Backends) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b.Backends = slices.Clone(b.Backends)
	if err := f.op(FakeOp{Kind: OpSetBackends, Backends: b}); err != nil {
		return err
	}
	f.Backends[b.Service] = b
	return nil
}

// DeleteBackends implements Datapath.
func (f *FakeDatapath) DeleteBackends(id bpf.ServicePortID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(FakeOp{Kind: OpDeleteBackends, Service: id}); err != nil {
		return err
	}
	delete(f.Backends, id)
	return nil
}

// UpsertDrain implements Datapath.
func (f *FakeDatapath) UpsertDrain(d bpf.Drain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Drains[d.Key]; !ok && f.Capacity > 0 && len(f.Drains) >= f.Capacity {
		f.Ops++
		return fmt.Errorf("updating draind_drains: %w", bpf.ErrMapFull)
	}
	if err := f.op(FakeOp{Kind: OpUpsertDrain, Drain: d}); err != nil {
		return err
	}
	f.Drains[d.Key] = d
	return nil
}

// DeleteDrain implements Datapath.
func (f *FakeDatapath) DeleteDrain(k bpf.EndpointKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(FakeOp{Kind: OpDeleteDrain, Key: k}); err != nil {
		return err
	}
	delete(f.Drains, k)
	delete(f.Stats, k)
	return nil
}

// DrainStats implements Datapath.
func (f *FakeDatapath) DrainStats(k bpf.EndpointKey) (bpf.DrainStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.StatsErr != nil {
		return bpf.DrainStats{}, f.StatsErr
	}
	return f.Stats[k], nil
}

// SetStats sets what DrainStats returns (a test's stand-in for the programs).
func (f *FakeDatapath) SetStats(k bpf.EndpointKey, st bpf.DrainStats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Stats[k] = st
}

// Counters implements Datapath.
func (f *FakeDatapath) Counters() (bpf.Counters, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Ctr, nil
}

// MapStats implements Datapath.
func (f *FakeDatapath) MapStats() ([]bpf.MapStat, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	nb := 0
	for _, b := range f.Backends {
		nb += len(b.Backends)
	}
	return []bpf.MapStat{
		{Name: bpf.MapFrontends, Entries: len(f.Frontends), Capacity: 16384},
		{Name: bpf.MapServices, Entries: len(f.Backends), Capacity: 16384},
		{Name: bpf.MapBackends, Entries: nb, Capacity: 131072},
		{Name: bpf.MapDrains, Entries: len(f.Drains), Capacity: max(f.Capacity, 65536)},
		{Name: bpf.MapDrainStats, Entries: len(f.Stats), Capacity: 65536},
		{Name: bpf.MapCounters, Entries: bpf.NumOutcomes * 2, Capacity: bpf.NumOutcomes * 2},
	}, nil
}

// Dump implements Datapath.
func (f *FakeDatapath) Dump() (*bpf.Dump, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := &bpf.Dump{Stats: map[bpf.EndpointKey]bpf.DrainStats{}, Counters: f.Ctr}
	for _, fe := range f.Frontends {
		d.Frontends = append(d.Frontends, fe)
	}
	for _, b := range f.Backends {
		b.Backends = slices.Clone(b.Backends)
		d.Backends = append(d.Backends, b)
	}
	for _, dr := range f.Drains {
		d.Drains = append(d.Drains, dr)
	}
	for k, s := range f.Stats {
		d.Stats[k] = s
	}
	slices.SortFunc(d.Frontends, func(a, b bpf.Frontend) int { return a.Key.Compare(b.Key) })
	slices.SortFunc(d.Drains, func(a, b bpf.Drain) int { return a.Key.Compare(b.Key) })
	slices.SortFunc(d.Backends, func(a, b bpf.Backends) int { return int(a.Service) - int(b.Service) })
	return d, nil
}

// DrainKeys returns the drained keys, sorted (for test assertions).
func (f *FakeDatapath) DrainKeys() []bpf.EndpointKey {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []bpf.EndpointKey
	for k := range f.Drains {
		out = append(out, k)
	}
	slices.SortFunc(out, bpf.EndpointKey.Compare)
	return out
}

// BackendsOfFrontend returns the backends a frontend steers to.
func (f *FakeDatapath) BackendsOfFrontend(vip netip.AddrPort, proto bpf.Protocol) ([]netip.AddrPort, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fe, ok := f.Frontends[bpf.EndpointKey{Addr: vip.Addr(), Port: vip.Port(), Proto: proto}]
	if !ok {
		return nil, false
	}
	return slices.Clone(f.Backends[fe.Service].Backends), true
}

// OpCount returns the number of mutating calls so far.
func (f *FakeDatapath) OpCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Ops
}
