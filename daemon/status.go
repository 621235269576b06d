package daemon

import (
	"fmt"
	"slices"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/hosted"
)

// Drain states of a pod: those of a hosted drain (package hosted), and
// lingering.
const (
	StateDraining  = hosted.StateDraining
	StateDrained   = hosted.StateDrained
	StateTimedOut  = hosted.StateTimedOut
	StateGone      = hosted.StateGone // the pod was deleted; its IP still steered
	StateLingering = "lingering"      // departed endpoint, seen from another node
	StateCancelled = hosted.StateCancelled
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
	// Live connections by source (package hosted): each source's count, the
	// one LiveConnections came from, and whether the socket count misses
	// connections older than counting on this node.
	LiveSockets        *int   `json:"live_sockets,omitempty"`
	LiveConntrack      *int   `json:"live_conntrack,omitempty"`
	LiveSource         string `json:"live_source,omitempty"`
	LiveSocketsPartial bool   `json:"live_sockets_partial,omitempty"`
}

// setLocal fills the row of a pod this node hosts with what it measured.
func (ps *PodStatus) setLocal(p hosted.Progress) {
	ps.Local = true
	ps.State = p.State
	ps.SYNs, ps.LiveConnections, ps.Steered = p.SYNs, p.Live, p.Steered
	ps.SYNsLast10s = p.SYNsLast10s
	lc := p.LiveBy
	ps.LiveSockets, ps.LiveConntrack, ps.LiveSource, ps.LiveSocketsPartial = lc.Sockets, lc.Conntrack, lc.Source, lc.SocketsPartial
}

// Health levels of Status.Health.
const (
	HealthHealthy   = "healthy"
	HealthDegraded  = "degraded"  // works, with less than it should (Warnings say what)
	HealthUnhealthy = "unhealthy" // Problems say what
)

// Status is the daemon's state for `draind status`.
type Status struct {
	Node    string    `json:"node"`
	Version string    `json:"version"`
	Time    time.Time `json:"time"`
	// Healthy is false when there is any problem; Health also says
	// "degraded" when only warnings remain.
	Healthy  bool     `json:"healthy"`
	Health   string   `json:"health"`
	Problems []string `json:"problems,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// Started is when the process started; LastSync the end of the event
	// loop's last datapath pass (zero before the first; passes the slice
	// watch runs itself do not count: they refresh nothing).
	Started   time.Time       `json:"started,omitzero"`
	LastSync  time.Time       `json:"last_sync,omitzero"`
	Features  bpf.Features    `json:"features"`
	Cgroup    string          `json:"cgroup"`
	PinDir    string          `json:"pin_dir"`
	Attached  []string        `json:"attached"`
	Conntrack ConntrackStatus `json:"conntrack"`
	Config    []ConfigEntry   `json:"config,omitempty"`
	Informers map[string]bool `json:"informers"`
	Counters  []CounterStat   `json:"counters"`
	Maps      []bpf.MapStat   `json:"maps"`
	Sockets   SocketStatus    `json:"sockets"`
	Pods      []PodStatus     `json:"pods"`
	// ServicePorts are the service-ports draind steers for.
	ServicePorts []ServicePortStatus `json:"service_ports"`
}

// ServicePortStatus is one service-port draind steers for: the id the
// datapath's maps name it by (what `draind bpf dump` prints), its Service
// port, its ClusterIP:port frontends, how many endpoints a steered
// connection may be sent to, and the entries that keep it: the keys of
// its draining endpoints and of its departed ones still lingering.
type ServicePortStatus struct {
	ID         uint32   `json:"id"`
	Service    string   `json:"service"`
	Port       string   `json:"port,omitempty"`
	Protocol   string   `json:"protocol"`
	Family     string   `json:"family"`
	Frontends  []string `json:"frontends,omitempty"`
	Selectable int      `json:"selectable"`
	Draining   []string `json:"draining,omitempty"`
	Lingering  []string `json:"lingering,omitempty"`
}

// ConntrackStatus says whether conntrack is used: without it "drained"
// means only "no new SYN for quiet" (live connections are not counted) and
// stale flows are not expired. Without timestamps
// (net.netfilter.nf_conntrack_timestamp) flows of a reused pod IP are left
// alone.
type ConntrackStatus struct {
	Enabled    bool   `json:"enabled"`
	Timestamps bool   `json:"timestamps"`
	Reason     string `json:"reason,omitempty"` // why it is off
}

// ConfigEntry is one setting of the running daemon (a `draind run` flag
// with its effective value, after the environment and defaults).
type ConfigEntry struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// CounterStat is one datapath outcome counter.
type CounterStat struct {
	Outcome string `json:"outcome"`
	IPv4    uint64 `json:"ipv4"`
	IPv6    uint64 `json:"ipv6"`
}

// StatusSource supplies what only the caller of the daemon knows: kernel
// features probed at start, where the programs are attached and pinned,
// whether conntrack could be opened, the effective flags, the start time.
type StatusSource struct {
	Features  bpf.Features
	Attached  func() []string
	Cgroup    string
	PinDir    string
	Conntrack ConntrackStatus // Enabled is taken from the daemon itself
	Config    []ConfigEntry
	Started   time.Time
}

// Status assembles the current status. Problems and warnings come in a
// fixed order (datapath, maps, informers by name, attachment, readiness,
// sync age, conntrack), so two calls on the same state read the same.
func (d *Daemon) Status(src StatusSource) Status {
	st := Status{Node: d.cfg.Node, Version: d.cfg.Version, Time: d.clock.Now(), Features: src.Features,
		Cgroup: src.Cgroup, PinDir: src.PinDir, Conntrack: src.Conntrack, Config: src.Config, Started: src.Started,
		Informers: d.inf.Synced(), Pods: d.PodStatuses(), ServicePorts: d.servicePortStatuses()}
	if ns := d.lastSync.Load(); ns != 0 {
		st.LastSync = time.Unix(0, ns).In(st.Time.Location())
	}
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
	names := make([]string, 0, len(st.Informers))
	for name := range st.Informers {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !st.Informers[name] {
			st.Problems = append(st.Problems, "informer "+name+" not synced")
		}
	}
	if !d.attached.Load() {
		st.Problems = append(st.Problems, "programs not attached")
	}
	if !d.Ready() {
		st.Problems = append(st.Problems, "not ready")
	} else if age := st.Time.Sub(st.LastSync); !st.LastSync.IsZero() && age > d.cfg.EntryTTL/2 {
		// Passes refresh the entries every EntryTTL/4: steering is about to
		// expire by itself.
		st.Problems = append(st.Problems, fmt.Sprintf("no datapath pass for %v (steering entries expire after %v)", age.Round(time.Second), d.cfg.EntryTTL))
	}
	var sockWarnings []string
	st.Sockets, sockWarnings = d.socketStatus(src.Features, src.Config)
	st.Conntrack.Enabled = d.conntrack != nil
	if !st.Conntrack.Enabled {
		st.Conntrack.Timestamps = false
		reason := st.Conntrack.Reason
		if reason == "" {
			reason = "disabled"
		}
		st.Warnings = append(st.Warnings, conntrackOffWarning(reason, st.Sockets.Loaded))
	}
	st.Warnings = append(st.Warnings, sockWarnings...)
	st.Healthy = len(st.Problems) == 0
	switch {
	case !st.Healthy:
		st.Health = HealthUnhealthy
	case len(st.Warnings) > 0:
		st.Health = HealthDegraded
	default:
		st.Health = HealthHealthy
	}
	return st
}

// servicePortStatuses returns the active service-ports as the status view
// shows them. It walks the model, as PodStatuses does.
func (d *Daemon) servicePortStatuses() []ServicePortStatus {
	d.modelMu.Lock()
	rows := d.model.ServicePortStatuses()
	d.modelMu.Unlock()
	out := make([]ServicePortStatus, len(rows))
	for i, r := range rows {
		out[i] = ServicePortStatus{ID: uint32(r.ID), Service: r.Service, Port: r.Port, Protocol: r.Protocol.String(),
			Family: fmt.Sprintf("IPv%d", r.Family), Frontends: keyStrings(r.Frontends), Selectable: r.Selectable,
			Draining: keyStrings(r.Draining), Lingering: keyStrings(r.Lingering)}
	}
	return out
}

// keyStrings formats keys for the status view.
func keyStrings(keys []bpf.EndpointKey) []string {
	if len(keys) == 0 {
		return nil
	}
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = k.String()
	}
	return out
}
