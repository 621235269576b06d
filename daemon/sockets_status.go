package daemon

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/draind/draind/bpf"
)

// SocketStatus says what the socket hooks do on this node, for `draind
// status`: where live connections are counted from, whether client sockets
// to gone pods are ended, and what the hooks did.
type SocketStatus struct {
	// Loaded: the sock_ops and egress programs are loaded (and attached
	// with the rest); Reason says why not.
	Loaded bool   `json:"loaded"`
	Reason string `json:"reason,omitempty"`
	// CountingSince: connections accepted since then are counted.
	CountingSince time.Time `json:"counting_since,omitzero"`
	// LiveFrom lists the sources of live-connection counts in use.
	LiveFrom []string `json:"live_from"`
	// EndTCP and EndUDP: client sockets to gone pods are ended (TCP at the
	// next retransmission timeout, connected UDP at the next send).
	EndTCP bool `json:"end_tcp"`
	EndUDP bool `json:"end_udp"`
	// Iterators is what the kernel says of socket iterators (never used).
	Iterators string `json:"socket_iterators,omitempty"`
	GonePeers int    `json:"gone_peers"`
	GoneFlows int    `json:"gone_flows"`
	// Events counts what the hooks did, by event (v4/v6).
	Events []CounterStat `json:"events,omitempty"`
}

// socketStatus assembles SocketStatus; the warnings it finds are returned
// for Status. Hooks that are off are no warning by themselves: conntrack
// still counts where the CNI shows it the flows (and its absence warns).
func (d *Daemon) socketStatus(f bpf.Features, cfg []ConfigEntry) (st SocketStatus, warnings []string) {
	st.Iterators = f.SocketIterators
	sd := socketsOf(d.datapath)
	if sd != nil {
		st.LiveFrom = append(st.LiveFrom, LiveFromSockets)
	}
	if d.conntrack != nil {
		st.LiveFrom = append(st.LiveFrom, LiveFromConntrack)
	}
	if len(st.LiveFrom) == 0 {
		st.LiveFrom = []string{LiveFromNone}
	}
	if sd == nil {
		st.Reason = "not loaded"
		switch {
		case slices.Contains(cfg, ConfigEntry{Name: "socket-hooks", Value: "false"}):
			st.Reason = "--socket-hooks=false"
		case f.SocketsMissing != "":
			st.Reason = "kernel lacks " + f.SocketsMissing
		}
		return st, nil
	}
	st.Loaded, st.EndTCP, st.EndUDP = true, f.UserTimeoutFromBPF, true
	// A figure that cannot be read is left out and said so: a 0 shown in
	// its place would read as "none".
	if since, err := sd.CountingSince(); err == nil {
		st.CountingSince = since
	} else {
		warnings = append(warnings, "reading when socket counting started: "+err.Error())
	}
	if peers, flows, err := sd.GoneEntries(); err == nil {
		st.GonePeers, st.GoneFlows = len(peers), len(flows)
	} else {
		warnings = append(warnings, "reading the gone peers: "+err.Error()+" (gone peers and flows shown as 0)")
	}
	c, err := sd.SocketCounters()
	if err != nil {
		warnings = append(warnings, "reading the socket counters: "+err.Error())
	}
	if err == nil {
		for e := bpf.SocketEvent(0); int(e) < bpf.NumSocketEvents; e++ {
			st.Events = append(st.Events, CounterStat{Outcome: e.String(), IPv4: c.Get(e, bpf.IPv4), IPv6: c.Get(e, bpf.IPv6)})
		}
		if n := c.Get(bpf.SockTCPSetsockoptError, bpf.IPv4) + c.Get(bpf.SockTCPSetsockoptError, bpf.IPv6); n > 0 {
			st.EndTCP = false
			warnings = append(warnings, "the kernel refused TCP_USER_TIMEOUT from the sock_ops program: TCP sockets to gone pods are not ended")
		}
	}
	return st, warnings
}

// socketCollector exports the socket hooks' figures at scrape time.
type socketCollector struct {
	d *Daemon
}

var (
	descSocketsEnded = prometheus.NewDesc(ns+"_sockets_ended_total",
		"Client sockets to gone pods that draind ended, by protocol and by what named the peer (peer: the socket's own peer is the gone pod IP; flow: conntrack translated the socket's VIP flow to it).",
		[]string{"proto", "via"}, nil)
	descSocketEvents = prometheus.NewDesc(ns+"_socket_events_total",
		"What the socket hooks did, by event and family (conn_counted, conn_closed, tcp_ended, udp_send_refused, ..._spared_newer, ...).",
		[]string{"event", "family"}, nil)
	descGonePeers = prometheus.NewDesc(ns+"_gone_peers",
		"Gone pod IPs whose client sockets end (entries of draind_gone_peers).", nil, nil)
	descGoneFlows = prometheus.NewDesc(ns+"_gone_flows",
		"Client VIP flows translated to a gone pod (entries of draind_gone_flows).", nil, nil)
	descSocketHooks = prometheus.NewDesc(ns+"_socket_hooks_loaded",
		"1 when the socket hooks (live connections from sockets, ending sockets to gone pods) are loaded.", nil, nil)
	descPodLiveBySource = prometheus.NewDesc(ns+"_draining_pod_live_connections_by_source",
		"Live connections of a draining pod hosted on this node, as each source counts them (sockets: the pod's own sockets; conntrack: the node's flows).",
		[]string{"namespace", "pod", "source"}, nil)
)

func (c *socketCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSocketsEnded, descSocketEvents, descGonePeers, descGoneFlows, descSocketHooks, descPodLiveBySource} {
		ch <- d
	}
}

func (c *socketCollector) Collect(ch chan<- prometheus.Metric) {
	sd := socketsOf(c.d.datapath)
	loaded := 0.0
	if sd != nil {
		loaded = 1
	}
	ch <- prometheus.MustNewConstMetric(descSocketHooks, prometheus.GaugeValue, loaded)
	c.collectSocketCounters(ch, sd)
	c.collectGone(ch, sd)
	for _, p := range c.d.hosted.Progress() {
		if p.State == StateGone || p.State == StateCancelled {
			continue
		}
		if p.LiveBy.Sockets != nil {
			ch <- prometheus.MustNewConstMetric(descPodLiveBySource, prometheus.GaugeValue, float64(*p.LiveBy.Sockets), p.Namespace, p.Name, LiveFromSockets)
		}
		if p.LiveBy.Conntrack != nil {
			ch <- prometheus.MustNewConstMetric(descPodLiveBySource, prometheus.GaugeValue, float64(*p.LiveBy.Conntrack), p.Namespace, p.Name, LiveFromConntrack)
		}
	}
}

// collectSocketCounters exports the socket hooks' counters. A counter that
// cannot be read is left out of the scrape: exported as 0 it would read as
// a counter reset.
func (c *socketCollector) collectSocketCounters(ch chan<- prometheus.Metric, sd SocketDatapath) {
	var ctr bpf.SocketCounters
	if sd != nil {
		var err error
		if ctr, err = sd.SocketCounters(); err != nil {
			c.d.log.Warn("reading the socket hooks' counters for metrics", logKeyErr, err)
			return
		}
	}
	sum := func(e bpf.SocketEvent) float64 { return float64(ctr.Get(e, bpf.IPv4) + ctr.Get(e, bpf.IPv6)) }
	ch <- prometheus.MustNewConstMetric(descSocketsEnded, prometheus.CounterValue, sum(bpf.SockTCPEnded), "tcp", "peer")
	ch <- prometheus.MustNewConstMetric(descSocketsEnded, prometheus.CounterValue, sum(bpf.SockTCPEndedFlow), "tcp", "flow")
	ch <- prometheus.MustNewConstMetric(descSocketsEnded, prometheus.CounterValue, sum(bpf.SockUDPEnded), "udp", "peer")
	for e := bpf.SocketEvent(0); int(e) < bpf.NumSocketEvents; e++ {
		for f, fam := range families {
			ch <- prometheus.MustNewConstMetric(descSocketEvents, prometheus.CounterValue, float64(ctr.Get(e, bpf.Family(f))), e.String(), fam)
		}
	}
}

// collectGone exports how many gone peers and flows the maps hold; an
// unreadable map is left out of the scrape rather than read as 0.
func (c *socketCollector) collectGone(ch chan<- prometheus.Metric, sd SocketDatapath) {
	peers, flows := 0, 0
	if sd != nil {
		p, fl, err := sd.GoneEntries()
		if err != nil {
			c.d.log.Warn("reading the gone peers for metrics", logKeyErr, err)
			return
		}
		peers, flows = len(p), len(fl)
	}
	ch <- prometheus.MustNewConstMetric(descGonePeers, prometheus.GaugeValue, float64(peers))
	ch <- prometheus.MustNewConstMetric(descGoneFlows, prometheus.GaugeValue, float64(flows))
}

// conntrackOffWarning says what a node without conntrack loses: with the
// socket hooks, live connections are still counted.
func conntrackOffWarning(reason string, sockets bool) string {
	if sockets {
		return "conntrack off (" + reason + "): live connections are counted from the pods' sockets only, stale flows are not expired"
	}
	return "conntrack off (" + reason + "): drained means only no new SYN, live connections are not counted, stale flows are not expired"
}
