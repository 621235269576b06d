package bpf

import (
	"fmt"
	"io"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Readers only the tests need: the node flags, the datagram counters and
// the programs' run-time statistics.

// Draining reads the "something drains on this node" flag the programs see.
func (d *Datapath) Draining() (bool, error) {
	v, err := d.nodeState()
	return v.Draining != 0, err
}

// Gone reads the "something is gone" flag the socket hooks see.
func (d *Datapath) Gone() (bool, error) {
	v, err := d.nodeState()
	return v.Gone != 0, err
}

func (d *Datapath) nodeState() (steerNodeState, error) {
	var v steerNodeState
	zero := uint32(0)
	if err := d.steer.DraindNode.Lookup(&zero, &v); err != nil {
		return v, fmt.Errorf("reading %s: %w", MapNode, err)
	}
	return v, nil
}

// DatagramCounters returns the outcome counters of unconnected UDP
// datagrams, summed over CPUs.
func (d *Datapath) DatagramCounters() (Counters, error) {
	return readCounters(d.steer.DraindUdpCounters)
}

// ProgramStat is the kernel's run-time statistics of one program: what the
// hook itself costs, measured where it runs. The kernel only collects them
// while statistics are enabled (EnableRunTimeStats or the sysctl
// kernel.bpf_stats_enabled).
type ProgramStat struct {
	Name     string // as in Attached
	RunCount uint64
	RunTime  time.Duration
}

// ProgramStats returns the run-time statistics of every program.
func (d *Datapath) ProgramStats() ([]ProgramStat, error) {
	var out []ProgramStat
	for _, a := range d.attachments() {
		st, err := a.prog.Stats()
		if err != nil {
			return nil, fmt.Errorf("reading statistics of %s: %w", a.name, err)
		}
		out = append(out, ProgramStat{Name: a.name, RunCount: st.RunCount, RunTime: st.Runtime})
	}
	return out, nil
}

// EnableRunTimeStats makes the kernel collect the programs' run time and run
// count until the returned Closer is closed (BPF_ENABLE_STATS; needs
// CAP_SYS_ADMIN, so benchmarks use it, the DaemonSet does not).
func EnableRunTimeStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
	}
	return c, nil
}
