package daemon

import (
	"sync"
	"time"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// Endpoints that vanish without draining (a pod deleted without grace goes
// from ready straight to absent in its EndpointSlice): the informers
// collect the candidates here, and the model (package model, vanish.go)
// decides which vanished and lets them depart.

// vanishIntake collects vanished endpoints from slice events (informer
// goroutines) for the next pass.
type vanishIntake struct {
	mu      sync.Mutex
	pending []model.VanishedEndpoint
}

// observe records the endpoints that were ready in old and are not listed
// (in any condition) in cur.
func (v *vanishIntake) observe(old, cur *k8s.Slice, now time.Time) {
	if old == nil || old.Service == "" {
		return
	}
	// It runs on every slice event: no allocation unless one vanished. A
	// slice is small (at most 1,000 endpoints, usually tens) and an update
	// usually keeps its endpoints in place, so look there first.
	listed := func(i int) bool {
		if cur == nil {
			return false
		}
		addr, pod := old.Addr(i), old.PodKey(i)
		if i < cur.Len() && cur.Addr(i) == addr && cur.PodKey(i) == pod {
			return true
		}
		for j := range cur.Len() {
			if cur.Addr(j) == addr && cur.PodKey(j) == pod {
				return true
			}
		}
		return false
	}
	var out []model.VanishedEndpoint
	for i := range old.Len() {
		if !old.Ready(i) || !old.HasPod(i) || listed(i) {
			continue
		}
		e := old.Endpoint(i)
		for _, p := range old.Ports {
			out = append(out, model.VanishedEndpoint{Service: old.Namespace + "/" + old.Service,
				Key: bpf.EndpointKey{Addr: e.Addr, Port: p.Port, Proto: p.Protocol}, PortName: p.Name,
				Family: old.Family, UID: e.PodUID, Pod: old.Namespace + "/" + e.PodName, At: now})
		}
	}
	if len(out) == 0 {
		return
	}
	v.mu.Lock()
	v.pending = append(v.pending, out...)
	v.mu.Unlock()
}

// add queues eps as if slice events had dropped them.
func (v *vanishIntake) add(eps []model.VanishedEndpoint) {
	if len(eps) == 0 {
		return
	}
	v.mu.Lock()
	v.pending = append(v.pending, eps...)
	v.mu.Unlock()
}

func (v *vanishIntake) take() []model.VanishedEndpoint {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := v.pending
	v.pending = nil
	return out
}

// revisitVanished schedules the next pass for the Services whose vanished
// endpoints drained in this one (runner goroutine, model held).
func (d *Daemon) revisitVanished(now time.Time) {
	keys := d.model.TakeRevisit()
	for _, k := range keys {
		d.tracker.markService(k, now)
	}
	if len(keys) > 0 {
		d.runner.Run()
	}
}
