package daemon

import (
	"time"

	"github.com/draind/draind/bpf"
)

// Drain states of a pod.
const (
	StateDraining  = "draining"
	StateDrained   = "drained"
	StateTimedOut  = "timed-out"
	StateGone      = "gone"      // the pod was deleted; its IP still steered
	StateLingering = "lingering" // departed endpoint, seen from another node
	StateCancelled = "cancelled" // /v1/online or undrain
)

// PodStatus is one drained pod, as `draind status` shows it.
type PodStatus struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       string    `json:"uid,omitempty"`
	IPs       []string  `json:"ips"`
	Reason    string    `json:"reason"`
	Since     time.Time `json:"since"`
	Deadline  time.Time `json:"deadline,omitzero"`
	State     string    `json:"state"`
	// Local: the pod runs on this node, so SYNs and connections are seen.
	Local           bool     `json:"local"`
	SYNs            uint64   `json:"syns"`
	SYNsLast10s     uint64   `json:"syns_last_10s"`
	LiveConnections int      `json:"live_connections"`
	Steered         uint64   `json:"steered"`
	Entries         []string `json:"entries,omitempty"`
}

// Status is the daemon's state for `draind status`.
type Status struct {
	Node      string          `json:"node"`
	Version   string          `json:"version"`
	Time      time.Time       `json:"time"`
	Healthy   bool            `json:"healthy"`
	Problems  []string        `json:"problems,omitempty"`
	Features  bpf.Features    `json:"features"`
	Attached  []string        `json:"attached"`
	Informers map[string]bool `json:"informers"`
	Counters  []CounterStat   `json:"counters"`
	Maps      []bpf.MapStat   `json:"maps"`
	Pods      []PodStatus     `json:"pods"`
}

// CounterStat is one datapath outcome counter.
type CounterStat struct {
	Outcome string `json:"outcome"`
	IPv4    uint64 `json:"ipv4"`
	IPv6    uint64 `json:"ipv6"`
}

// StatusSource supplies what only the caller of the daemon knows (kernel
// features probed at start, attached programs).
type StatusSource struct {
	Features bpf.Features
	Attached func() []string
}

// Status assembles the current status.
func (d *Daemon) Status(src StatusSource) Status {
	st := Status{Node: d.cfg.Node, Version: d.cfg.Version, Time: d.clock.Now(), Features: src.Features,
		Informers: d.inf.Synced(), Pods: d.PodStatuses()}
	if src.Attached != nil {
		st.Attached = src.Attached()
	}
	if c, err := d.datapath.Counters(); err == nil {
		for o := bpf.Outcome(0); int(o) < bpf.NumOutcomes; o++ {
			st.Counters = append(st.Counters, CounterStat{Outcome: o.String(), IPv4: c.Get(o, bpf.IPv4), IPv6: c.Get(o, bpf.IPv6)})
		}
	} else {
		st.Problems = append(st.Problems, "reading counters: "+err.Error())
	}
	if ms, err := d.datapath.MapStats(); err == nil {
		st.Maps = ms
		for _, m := range ms {
			if m.Capacity > 0 && m.Entries >= m.Capacity && !m.FullIsNormal && m.Name != bpf.MapCounters {
				st.Problems = append(st.Problems, "map "+string(m.Name)+" is full")
			}
		}
	} else {
		st.Problems = append(st.Problems, "reading maps: "+err.Error())
	}
	for name, ok := range st.Informers {
		if !ok {
			st.Problems = append(st.Problems, "informer "+name+" not synced")
		}
	}
	if !d.attached.Load() {
		st.Problems = append(st.Problems, "programs not attached")
	}
	if !d.Ready() {
		st.Problems = append(st.Problems, "not ready")
	}
	st.Healthy = len(st.Problems) == 0
	return st
}
