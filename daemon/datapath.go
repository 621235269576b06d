package daemon

import "github.com/draind/draind/bpf"

// Datapath is what the reconciler drives: the real one is *bpf.Datapath,
// tests use datapathtest.Datapath. SetBackends must not keep b.Backends past the
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
