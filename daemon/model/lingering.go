package model

import (
	"container/heap"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// Lingering: a departed endpoint stays steered (its last contribution,
// kind fromLinger) until --linger ends, its pod's drain Lease is deleted
// or another pod claims its IP. A rollout departs endpoints as fast as the
// cluster replaces pods, so lingering records are many (a thousand a second
// for two minutes: 120,000) and nothing here walks them all: they are
// indexed by service-port, by pod and by end.

// lingerRecord is a departed endpoint still steered until until.
type lingerRecord struct {
	c     contribution
	until time.Time
}

// lingerQueue is a min-heap of lingering records by end. A record that
// ended early (cleared, or replaced by another) stays until it comes up,
// then is dropped, or until such records outnumber the live ones (a
// listing that flaps, IPs reused), when the queue keeps only the live.
type lingerQueue []queuedLinger

type queuedLinger struct {
	key bpf.EndpointKey
	rec *lingerRecord
}

func (q lingerQueue) Len() int           { return len(q) }
func (q lingerQueue) Less(i, j int) bool { return q[i].rec.until.Before(q[j].rec.until) }
func (q lingerQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *lingerQueue) Push(x any)        { *q = append(*q, x.(queuedLinger)) }
func (q *lingerQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	old[len(old)-1] = queuedLinger{} // keeps no record alive
	*q = old[:len(old)-1]
	return x
}

func (m *Model) setLinger(k bpf.EndpointKey, l *lingerRecord) {
	m.clearLinger(k)
	m.lingering[k] = l
	m.lingerKeys[l.c.servicePort] = append(m.lingerKeys[l.c.servicePort], k)
	m.lingerByPod[l.c.uid] = append(m.lingerByPod[l.c.uid], k)
	heap.Push(&m.lingerQueue, queuedLinger{k, l})
	m.addContribution(k, l.c)
	if stale := len(m.lingerQueue) - len(m.lingering); stale > len(m.lingering)+64 {
		m.lingerQueue = slices.DeleteFunc(m.lingerQueue, func(q queuedLinger) bool { return m.lingering[q.key] != q.rec })
		heap.Init(&m.lingerQueue)
	}
}

func (m *Model) clearLinger(k bpf.EndpointKey) {
	l := m.lingering[k]
	if l == nil {
		return
	}
	delete(m.lingering, k)
	dropKey(m.lingerKeys, l.c.servicePort, k)
	dropKey(m.lingerByPod, l.c.uid, k)
	m.removeContribution(k, func(c contribution) bool { return c.kind == fromLinger })
	if l.c.servicePort != 0 {
		m.releaseIfUnused(l.c.servicePort)
	}
}

// dropKey removes k from index[at], and the entry when that empties it.
func dropKey[K comparable](index map[K][]bpf.EndpointKey, at K, k bpf.EndpointKey) {
	if keys := slices.DeleteFunc(index[at], func(x bpf.EndpointKey) bool { return x == k }); len(keys) > 0 {
		index[at] = keys
	} else {
		delete(index, at)
	}
}

// lingeringOf reports whether pod uid has a lingering entry.
func (m *Model) lingeringOf(uid types.UID) bool { return len(m.lingerByPod[uid]) > 0 }

// EndLingersOf ends the lingering entries of a pod: its drain Lease was
// deleted, which the node hosting it does when the pod's IP is reused (or
// its own linger ended). Remote nodes learn of a new owner no other way
// when the new pod is in no Service.
func (m *Model) EndLingersOf(uid types.UID) {
	if uid == "" {
		return
	}
	for _, k := range slices.Clone(m.lingerByPod[uid]) { // clearLinger edits it
		m.clearLinger(k)
	}
}

// ExpireLingering ends the lingers that ran out, in order of end.
func (m *Model) ExpireLingering(now time.Time) {
	for len(m.lingerQueue) > 0 && !now.Before(m.lingerQueue[0].rec.until) {
		q := heap.Pop(&m.lingerQueue).(queuedLinger)
		if m.lingering[q.key] == q.rec {
			m.clearLinger(q.key)
		}
	}
}

// firstLingerEnd is the earliest end of a lingering record (zero: none).
// Records that ended early are dropped from the queue's head first, so
// that they wake no pass.
func (m *Model) firstLingerEnd() time.Time {
	for len(m.lingerQueue) > 0 {
		q := m.lingerQueue[0]
		if m.lingering[q.key] == q.rec {
			return q.rec.until
		}
		heap.Pop(&m.lingerQueue)
	}
	return time.Time{}
}
