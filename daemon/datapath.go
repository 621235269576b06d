package daemon

import (
	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/reconcile"
)

// Datapath is what the daemon drives: the real one is *bpf.Datapath, tests
// use datapathtest.Datapath. The reconciler writes its maps
// (reconcile.Datapath); the rest is read.
type Datapath interface {
	reconcile.Datapath
	DrainStats(bpf.EndpointKey) (bpf.DrainStats, error)
	Counters() (bpf.Counters, error)
	MapStats() ([]bpf.MapStat, error)
	Dump() (*bpf.Dump, error)
}

var _ Datapath = (*bpf.Datapath)(nil)
