package datapathtest

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/draind/draind/bpf"
)

// Datapath keeps the maps in memory and counts operations.
type Datapath struct {
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
	log     []Op
}

// The kinds of Op.
const (
	OpUpsertFrontend = "upsert-frontend"
	OpDeleteFrontend = "delete-frontend"
	OpSetBackends    = "set-backends"
	OpDeleteBackends = "delete-backends"
	OpUpsertDrain    = "upsert-drain"
	OpDeleteDrain    = "delete-drain"
)

// Op is one mutating call the fake applied, with its argument.
type Op struct {
	Kind     string
	Key      bpf.EndpointKey // deletes of frontends and drains
	Service  bpf.ServicePortID
	Frontend bpf.Frontend
	Backends bpf.Backends
	Drain    bpf.Drain
}

func (o Op) String() string {
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
func (f *Datapath) CrashAfter(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crashIn, f.crashed = n, n == 0
}

// Recover ends a simulated crash (the next daemon starts).
func (f *Datapath) Recover() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.crashIn, f.crashed = 0, false
}

// StartLog starts recording applied operations.
func (f *Datapath) StartLog() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logging, f.log = true, nil
}

// StopLog returns the operations applied since StartLog.
func (f *Datapath) StopLog() []Op {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.logging = false
	return f.log
}

// New returns an empty fake.
func New() *Datapath {
	return &Datapath{
		Frontends: map[bpf.EndpointKey]bpf.Frontend{},
		Backends:  map[bpf.ServicePortID]bpf.Backends{},
		Drains:    map[bpf.EndpointKey]bpf.Drain{},
		Stats:     map[bpf.EndpointKey]bpf.DrainStats{},
	}
}

// op accounts for one mutating call; a nil error means apply it and
// record op.
func (f *Datapath) op(op Op) error {
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
func (f *Datapath) UpsertFrontend(fe bpf.Frontend) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(Op{Kind: OpUpsertFrontend, Frontend: fe}); err != nil {
		return err
	}
	f.Frontends[fe.Key] = fe
	return nil
}

// DeleteFrontend implements Datapath.
func (f *Datapath) DeleteFrontend(k bpf.EndpointKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(Op{Kind: OpDeleteFrontend, Key: k}); err != nil {
		return err
	}
	delete(f.Frontends, k)
	return nil
}

// SetBackends implements Datapath.
func (f *Datapath) SetBackends(b bpf.Backends) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	b.Backends = slices.Clone(b.Backends)
	if err := f.op(Op{Kind: OpSetBackends, Backends: b}); err != nil {
		return err
	}
	f.Backends[b.Service] = b
	return nil
}

// DeleteBackends implements Datapath.
func (f *Datapath) DeleteBackends(id bpf.ServicePortID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(Op{Kind: OpDeleteBackends, Service: id}); err != nil {
		return err
	}
	delete(f.Backends, id)
	return nil
}

// UpsertDrain implements Datapath.
func (f *Datapath) UpsertDrain(d bpf.Drain) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.Drains[d.Key]; !ok && f.Capacity > 0 && len(f.Drains) >= f.Capacity {
		f.Ops++
		return fmt.Errorf("updating draind_drains: %w", bpf.ErrMapFull)
	}
	if err := f.op(Op{Kind: OpUpsertDrain, Drain: d}); err != nil {
		return err
	}
	f.Drains[d.Key] = d
	return nil
}

// DeleteDrain implements Datapath.
func (f *Datapath) DeleteDrain(k bpf.EndpointKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.op(Op{Kind: OpDeleteDrain, Key: k}); err != nil {
		return err
	}
	delete(f.Drains, k)
	delete(f.Stats, k)
	return nil
}

// DrainStats implements Datapath.
func (f *Datapath) DrainStats(k bpf.EndpointKey) (bpf.DrainStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.StatsErr != nil {
		return bpf.DrainStats{}, f.StatsErr
	}
	return f.Stats[k], nil
}

// SetStats sets what DrainStats returns (a test's stand-in for the programs).
func (f *Datapath) SetStats(k bpf.EndpointKey, st bpf.DrainStats) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Stats[k] = st
}

// Counters implements Datapath.
func (f *Datapath) Counters() (bpf.Counters, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Ctr, nil
}

// MapStats implements Datapath.
func (f *Datapath) MapStats() ([]bpf.MapStat, error) {
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
func (f *Datapath) Dump() (*bpf.Dump, error) {
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
func (f *Datapath) DrainKeys() []bpf.EndpointKey {
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
func (f *Datapath) BackendsOfFrontend(vip netip.AddrPort, proto bpf.Protocol) ([]netip.AddrPort, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fe, ok := f.Frontends[bpf.EndpointKey{Addr: vip.Addr(), Port: vip.Port(), Proto: proto}]
	if !ok {
		return nil, false
	}
	return slices.Clone(f.Backends[fe.Service].Backends), true
}

// OpCount returns the number of mutating calls so far.
func (f *Datapath) OpCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Ops
}

// SetStatsErr makes every DrainStats call fail with err (nil: read again),
// as an unreadable map would, while a daemon may be reading.
func (f *Datapath) SetStatsErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.StatsErr = err
}
