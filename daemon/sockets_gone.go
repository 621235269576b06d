package daemon

import (
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon/gonepeers"
	"github.com/draind/draind/k8s"
)

// newGonePeers wires the gone peers (package gonepeers: ending client
// sockets to gone pods) to the daemon's datapath and conntrack.
func (d *Daemon) newGonePeers() *gonepeers.Peers {
	cfg := gonepeers.Config{State: d.state, EntryTTL: d.cfg.EntryTTL,
		DatapathErrors: d.Metrics.DatapathErrors, CTErrors: d.Metrics.CTErrors, Log: d.log,
		OnWarning: func(svc, value string) {
			d.log.Warn("invalid "+k8s.AnnotationEndDeadConnections+" annotation, using the default (true)", logKeyService, svc, logKeyValue, value)
		}}
	if sd := socketsOf(d.datapath); sd != nil {
		cfg.Sockets = sd
	}
	if fl, ok := d.conntrack.(conntrack.FlowLister); ok && d.conntrack != nil {
		cfg.Flows = fl
	}
	if d.cfg.FlowLister != nil && d.conntrack != nil {
		cfg.Flows = d.cfg.FlowLister
	}
	return gonepeers.New(cfg)
}
