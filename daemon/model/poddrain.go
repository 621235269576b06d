package model

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// PodDrain is a drain of a whole pod: from a drain Lease, or from this
// node's own knowledge of a pod it hosts (a deletion, an offline call).
type PodDrain struct {
	UID             types.UID
	Namespace, Name string
	IPs             []netip.Addr
	Reason          string
	Since           time.Time
	Expires         time.Time // zero: no deadline (this node's own drain)
	Holder          string
	Lease           bool
	State           string // as the hosting node published it
	// SteerPodIP: connections made straight to the pod's IP are steered
	// (the pod asked to go offline, its workload opted in, or it is gone);
	// otherwise only its Services' VIPs steer away from it.
	SteerPodIP bool
}

func (d *PodDrain) same(o *PodDrain) bool {
	return d.Reason == o.Reason && d.SteerPodIP == o.SteerPodIP && d.Expires.Equal(o.Expires) && slices.Equal(d.IPs, o.IPs) && d.Namespace == o.Namespace && d.Name == o.Name
}

// Identical reports whether d and o are equal in every field (same
// compares what the entries depend on).
func (d *PodDrain) Identical(o *PodDrain) bool {
	return d.same(o) && d.UID == o.UID && d.Since.Equal(o.Since) && d.Holder == o.Holder && d.Lease == o.Lease && d.State == o.State
}

// KeepPodDrain puts pd into m: the model's object (in prev) if identical,
// else a copy of its own.
func KeepPodDrain(m, prev map[types.UID]*PodDrain, pd *PodDrain) {
	if p := prev[pd.UID]; p != nil && p.Identical(pd) {
		m[pd.UID] = p
		return
	}
	own := *pd
	own.IPs = slices.Clone(pd.IPs)
	m[pd.UID] = &own
}
