package hosted

import (
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// Drains are the drains of the pods this node hosts.
type Drains struct {
	cfg Config

	broadcaster record.EventBroadcaster // between Start and Stop
	recorder    record.EventRecorder

	mu       sync.Mutex
	pods     map[types.UID]*drain
	nwait    int                             // waits of every pod
	podWaits map[types.UID]int               // waits per pod
	keysFor  map[types.UID][]bpf.EndpointKey // from the last pass
	seen     map[types.UID]*k8s.Pod          // local pods at the last look (drainVanished)
	// looked is the snapshot of that look and unlisted the count of
	// drains forgotten then: drainDeleting decides again only if either
	// changed since (a forgotten drain of a deleting pod starts again).
	// Invariant: while both are the same, every deleting local pod has a
	// drain. Checked by FuzzSequenceDifferential.
	looked          *LocalPods
	unlisted, lookU uint64
	claimed         map[types.UID]*claimPub // this node's claim Leases (claims.go)
}

// New returns the hosted drains over cfg; nothing runs until Start.
func New(cfg Config) *Drains {
	return &Drains{cfg: cfg, pods: map[types.UID]*drain{}, podWaits: map[types.UID]int{},
		keysFor: map[types.UID][]bpf.EndpointKey{}}
}

// Start starts sending Kubernetes Events.
func (l *Drains) Start() {
	l.broadcaster = record.NewBroadcaster()
	l.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: l.cfg.Events})
	l.recorder = l.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "draind", Host: l.cfg.Node})
}

// Stop answers every waiter with why (503) and flushes the queued Events.
// Called again, it does nothing more.
func (l *Drains) Stop(why string) {
	l.cancelAll(why)
	if l.broadcaster != nil {
		l.broadcaster.Shutdown() // flushes queued Events, ends its goroutines
		l.broadcaster = nil
	}
}

func (l *Drains) event(ld *drain, typ, reason, msg string) {
	if ld.told[reason] {
		return
	}
	if ld.told == nil {
		ld.told = map[string]bool{}
	}
	ld.told[reason] = true
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ld.namespace, Name: ld.name, UID: ld.uid}
	if l.recorder != nil {
		l.recorder.Event(ref, typ, reason, msg)
	}
}

// EachPodDrain calls fn with this node's drains as the model takes them: no
// deadline (this node renews nothing to itself), and a gone pod's drain
// lasts its linger. fn may keep nothing of the object but a copy.
func (l *Drains) EachPodDrain(fn func(*model.PodDrain)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ld := range l.pods {
		if ld.state == StateCancelled {
			continue
		}
		pd := model.PodDrain{UID: ld.uid, Namespace: ld.namespace, Name: ld.name, IPs: ld.ips, Reason: ld.reason,
			Since: ld.started, Holder: l.cfg.Node, Lease: ld.published, State: ld.state,
			SteerPodIP: ld.steerPodIP || ld.state == StateGone}
		if ld.state == StateGone {
			pd.Expires = ld.goneAt.Add(l.cfg.Linger)
		}
		fn(&pd)
	}
}

// uids returns the pods drained on this node.
func (l *Drains) uids() []types.UID {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]types.UID, 0, len(l.pods))
	for uid := range l.pods {
		out = append(out, uid)
	}
	return out
}

// SetKeys records the entry keys of this node's drained pods, as keysOf
// gives them for their UIDs (runner goroutine): their SYN counters are
// read under them.
func (l *Drains) SetKeys(keysOf func([]types.UID) map[types.UID][]bpf.EndpointKey) {
	keys := keysOf(l.uids())
	l.mu.Lock()
	changed := len(keys) != len(l.keysFor)
	for uid, k := range keys {
		if !slices.Equal(k, l.keysFor[uid]) {
			changed = true
		}
	}
	l.keysFor = keys
	l.mu.Unlock()
	if changed {
		l.cfg.Wake() // measure under the new keys now
	}
}

// Progress returns what this node knows of each of its drains, by pod
// UID.
func (l *Drains) Progress() map[types.UID]Progress {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Clock.Now()
	out := make(map[types.UID]Progress, len(l.pods))
	for uid, ld := range l.pods {
		out[uid] = ld.progress(now)
	}
	return out
}

// SawLease records that the informer has shown the Lease of this node's
// drain of pod uid (the Lease handler). Recorded at the event, not at the
// next reconcile: a Lease deleted before that reconcile (draind undrain
// right after an offline call) is then a deletion, which cancels the
// drain, not a Lease that never landed, which step would publish again.
func (l *Drains) SawLease(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ld := l.pods[uid]; ld != nil {
		ld.leaseSeen = true
	}
}

// ObserveLocalPods starts the drains of local pods being deleted: they
// drain even without an offline call. The runner calls it at the start of
// every pass, so a deletion reaches the datapath in that same pass.
func (l *Drains) ObserveLocalPods(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drainDeleting(l.localPods(), now)
}

// localPods reads this node's pods (under l.mu where two reads are compared:
// the reads are then in order, and so are the snapshots they get).
func (l *Drains) localPods() *LocalPods { return l.cfg.LocalPods() }

// unlist forgets uid's drain (l.mu held).
func (l *Drains) unlist(uid types.UID) {
	delete(l.pods, uid)
	l.unlisted++
}

// LocalPods is this node's pods, indexed: a snapshot a pod event takes
// (the informer calls the handler after each change to its store, so the
// last snapshot has every change). Passes, one per slice update, read it
// instead of listing the store and building the indexes each time (that
// cost more than the rest of a pass on a node of 110 pods). Nothing
// writes to a snapshot once stored: readers compare two by pointer.
type LocalPods struct {
	ByUID map[types.UID]*k8s.Pod
	ByIP  map[netip.Addr]*k8s.Pod // of several pods at an IP, the last listed
}

// NewLocalPods indexes pods.
func NewLocalPods(pods []*k8s.Pod) *LocalPods {
	lp := &LocalPods{ByUID: make(map[types.UID]*k8s.Pod, len(pods)), ByIP: make(map[netip.Addr]*k8s.Pod, len(pods))}
	for _, p := range pods {
		lp.ByUID[p.UID] = p
		for _, ip := range p.IPs {
			lp.ByIP[ip] = p
		}
	}
	return lp
}
