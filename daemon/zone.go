package daemon

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// This node's zone: kube-proxy keeps zone-hinted traffic in the zone its
// Node's topology.kubernetes.io/zone label names, and steering picks from
// the same backends (package model, topology.go). draind reads its Node (get, never a
// watch of every node) when it starts and every zoneRefresh after, and
// recomputes the Services that drain when the label changes.

// zoneRefresh is how often the Node's zone label is read again.
const zoneRefresh = time.Minute

// readZone returns the node's zone label ("": none, or the Node could not
// be read; ok false then).
func readZone(ctx context.Context, nodes typedcorev1.NodeInterface, node string) (zone string, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := nodes.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		return "", false
	}
	return n.Labels[corev1.LabelTopologyZone], true
}

// setZone makes zone the model's and marks every Service that steers for
// recomputation; it reports whether the zone changed.
func (d *Daemon) setZone(zone string) bool {
	d.modelMu.Lock()
	defer d.modelMu.Unlock()
	changed, services := d.model.SetZone(zone)
	now := d.clock.Now()
	for _, key := range services {
		d.tracker.markService(key, now)
	}
	return changed
}

// followZone reads the zone in zoneLoop, at once and then every
// zoneRefresh, until ctx ends or the loop stops; start-up never waits for
// it. Until the first read, and while the Node cannot be read, the model
// keeps the zone it had (none at first: zone hints then never match, and
// steering picks from every candidate, as kube-proxy does on a node
// without a zone label).
func (d *Daemon) followZone(ctx context.Context) {
	warned := false
	read := func(ctx context.Context) {
		zone, ok := readZone(ctx, d.nodes, d.cfg.Node)
		if !ok {
			if !warned && ctx.Err() == nil {
				d.log.Warn("cannot read this node's zone label; zone hints are not kept while steering", "node", d.cfg.Node)
				warned = true
			}
			return
		}
		warned = false
		if d.setZone(zone) {
			d.log.Info("node zone", "zone", zone)
			d.runner.Run()
		}
	}
	d.zoneLoop.Start(ctx, func(ctx context.Context) {
		t := d.clock.NewTicker(zoneRefresh)
		defer t.Stop()
		read(ctx)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C():
				read(ctx)
			}
		}
	})
}
