package k8s

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
)

// The drain Lease protocol.
//
// A drain Lease (coordination.k8s.io/v1, in draind's namespace) says "pod P
// is going offline" to every draind in the cluster, before the pod is even
// deleted. Its name derives from the pod UID, so a pod has at most one, and a
// new pod that reuses the IP never inherits it. The holder is the node that
// hosts the pod: that node's draind renews it while the drain lasts and
// publishes progress on it; anyone (the pod's offline call, `draind drain`)
// may create it. When renewal stops, the Lease expires and the drain ends
// everywhere: the protocol fails open.
const (
	// LabelDrain selects drain Leases (value "true") and claim Leases
	// (value LabelClaimValue).
	LabelDrain = "draind.io/drain"
	// LabelClaimValue marks a claim Lease: "pod P on the holder now has
	// these IPs", published by the node hosting P while a drain Lease of
	// another pod (of another node) still names one of them. Every node
	// that believes it stops steering the IPs for the older pod, and the
	// older pod's own node ends its drain and deletes its Lease: only a
	// Lease's holder ever deletes it.
	LabelClaimValue = "claim"
	// LabelPodNamespace and LabelPodName help `kubectl get lease -l`; they
	// are omitted when the value is not a valid label value (names longer
	// than 63 characters), the annotations are authoritative.
	LabelPodNamespace = "draind.io/pod-namespace"
	LabelPodName      = "draind.io/pod-name"

	AnnPodNamespace = "draind.io/pod-namespace"
	AnnPodName      = "draind.io/pod-name"
	AnnPodUID       = "draind.io/pod-uid"
	AnnPodIPs       = "draind.io/pod-ips" // comma-separated
	AnnReason       = "draind.io/reason"
	// AnnState and AnnProgress are written by the hosting node.
	AnnState    = "draind.io/state"
	AnnProgress = "draind.io/progress"
	// AnnSteerPodIP set to "true" extends the drain to connections made
	// straight to the pod's IP while it still exists: its workload opted
	// in (AnnotationSteerOnDelete) or the pod asked to go offline.
	AnnSteerPodIP = "draind.io/steer-pod-ip"
)

// Reasons a drain starts.
const (
	ReasonOffline     = "offline"      // the pod called /v1/offline
	ReasonOperator    = "operator"     // draind drain
	ReasonPodDeleting = "pod-deleting" // the pod was deleted (graceful)
)

// DrainLease is a parsed drain Lease.
type DrainLease struct {
	metav1.ObjectMeta
	Receipt
	PodNamespace string
	PodName      string
	PodUID       types.UID
	IPs          []netip.Addr
	Holder       string // the node hosting the pod
	Reason       string
	Acquired     time.Time
	Renewed      time.Time
	Duration     time.Duration
	State        string // progress published by the holder
	Progress     string
	// SteerPodIP: connections made straight to the pod's IP are steered
	// while it exists (see SteersPodIP).
	SteerPodIP bool
	// Claim: a claim Lease (LabelClaimValue), not a drain: the holder
	// says it hosts the pod at IPs now.
	Claim bool
}

// SteersPodIP reports whether a drain with this reason and steering
// annotation applies to connections made straight to a pod's IP while the
// pod exists. A pod that asked to go offline (its /v1/offline call, an
// operator's drain) or whose workload opted in does; a pod that is only
// being deleted stays reachable at its IP, as the Kubernetes network model
// promises, until it is gone.
func SteersPodIP(reason string, optedIn bool) bool {
	return optedIn || reason == ReasonOffline || reason == ReasonOperator
}

// Expires is when the drain ends unless renewed.
func (l *DrainLease) Expires() time.Time { return l.Renewed.Add(l.Duration) }

// LeaseName is the Lease name for a pod.
func LeaseName(uid types.UID) string { return "drain-" + string(uid) }

// ClaimName is the claim Lease name for a pod.
func ClaimName(uid types.UID) string { return ClaimPrefix + string(uid) }

// ClaimPrefix starts every claim Lease's name.
const ClaimPrefix = "claim-"

// ParseLease validates and converts a drain Lease. A malformed Lease is an
// error (the caller logs and counts it, and ignores the Lease).
func ParseLease(l *coordinationv1.Lease) (*DrainLease, error) {
	a := l.Annotations
	out := &DrainLease{
		ObjectMeta:   slimMeta(&l.ObjectMeta),
		PodNamespace: a[AnnPodNamespace],
		PodName:      a[AnnPodName],
		PodUID:       types.UID(a[AnnPodUID]),
		Reason:       a[AnnReason],
		State:        a[AnnState],
		Progress:     a[AnnProgress],
		Claim:        l.Labels[LabelDrain] == LabelClaimValue,
	}
	out.SteerPodIP = SteersPodIP(out.Reason, a[AnnSteerPodIP] == "true")
	if out.PodUID == "" || out.PodName == "" || out.PodNamespace == "" {
		return nil, fmt.Errorf("lease %s/%s: missing pod identity annotations", l.Namespace, l.Name)
	}
	want := LeaseName(out.PodUID)
	if out.Claim {
		want = ClaimName(out.PodUID)
	}
	if l.Name != want {
		return nil, fmt.Errorf("lease %s/%s: name does not match pod uid %s", l.Namespace, l.Name, out.PodUID)
	}
	for _, s := range strings.Split(a[AnnPodIPs], ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("lease %s/%s: bad pod IP %q: %w", l.Namespace, l.Name, s, err)
		}
		out.IPs = append(out.IPs, ip)
	}
	if len(out.IPs) == 0 {
		return nil, fmt.Errorf("lease %s/%s: no pod IPs", l.Namespace, l.Name)
	}
	if l.Spec.HolderIdentity != nil {
		out.Holder = *l.Spec.HolderIdentity
	}
	if l.Spec.LeaseDurationSeconds == nil || *l.Spec.LeaseDurationSeconds <= 0 {
		return nil, fmt.Errorf("lease %s/%s: no duration", l.Namespace, l.Name)
	}
	out.Duration = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	switch {
	case l.Spec.RenewTime != nil:
		out.Renewed = l.Spec.RenewTime.Time
	case l.Spec.AcquireTime != nil:
		out.Renewed = l.Spec.AcquireTime.Time
	default:
		return nil, fmt.Errorf("lease %s/%s: no renew or acquire time", l.Namespace, l.Name)
	}
	if l.Spec.AcquireTime != nil {
		out.Acquired = l.Spec.AcquireTime.Time
	} else {
		out.Acquired = out.Renewed
	}
	return out, nil
}

// Leases publishes, renews and deletes drain Leases.
type Leases struct {
	Client    kubernetes.Interface
	Namespace string
}

// DrainRequest describes a drain to publish.
type DrainRequest struct {
	PodNamespace, PodName string
	PodUID                types.UID
	IPs                   []netip.Addr
	Node                  string // hosting node: the holder
	Reason                string
	Duration              time.Duration
	// State, if set, is published with the Lease (AnnState) from its
	// creation: a pod that is already gone when its drain starts.
	State string
	// SteerPodIP publishes AnnSteerPodIP (on creation and when joining).
	SteerPodIP bool
	// Claim publishes a claim Lease (ClaimName, LabelClaimValue) instead
	// of a drain Lease.
	Claim bool
}

// Lease returns the Lease object Publish creates for r in namespace ns.
func (r *DrainRequest) Lease(ns string, now time.Time) *coordinationv1.Lease {
	ips := make([]string, len(r.IPs))
	for i, ip := range r.IPs {
		ips[i] = ip.String()
	}
	labels, name := map[string]string{LabelDrain: "true"}, LeaseName(r.PodUID)
	if r.Claim {
		labels[LabelDrain], name = LabelClaimValue, ClaimName(r.PodUID)
	}
	for k, v := range map[string]string{LabelPodNamespace: r.PodNamespace, LabelPodName: r.PodName} {
		if len(validation.IsValidLabelValue(v)) == 0 {
			labels[k] = v
		}
	}
	secs := int32(r.Duration / time.Second)
	if secs < 1 {
		secs = 1
	}
	holder := r.Node
	mt := metav1.NewMicroTime(now)
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, Labels: labels,
			Annotations: map[string]string{
				AnnPodNamespace: r.PodNamespace, AnnPodName: r.PodName, AnnPodUID: string(r.PodUID),
				AnnPodIPs: strings.Join(ips, ","), AnnReason: r.Reason,
			},
		},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &holder, LeaseDurationSeconds: &secs, AcquireTime: &mt, RenewTime: &mt,
		},
	}
	if r.State != "" {
		l.Annotations[AnnState] = r.State
	}
	if r.SteerPodIP {
		l.Annotations[AnnSteerPodIP] = "true"
	}
	return l
}

// Publish creates the pod's drain Lease, or renews it if it exists (joining
// a drain in progress: the original reason and acquire time are kept).
// created reports whether this call started the drain.
//
// A Lease of that name that describes another drain (another holder, pod
// or IPs: stale, or written by someone other than the pod's node), or
// that no node watches (its label changed), is no drain any node honours,
// and it must not stop the pod's own: it is replaced by r's, which counts
// as created.
func (c *Leases) Publish(ctx context.Context, r DrainRequest, now time.Time) (lease *DrainLease, created bool, err error) {
	if r.PodUID == "" || len(r.IPs) == 0 {
		return nil, false, errors.New("publishing drain lease: pod uid and IPs are required")
	}
	want := r.Lease(c.Namespace, now)
	api := c.Client.CoordinationV1().Leases(c.Namespace)
	got, err := api.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		l, perr := ParseLease(got)
		return l, true, perr
	}
	if !apierrors.IsAlreadyExists(err) {
		return nil, false, fmt.Errorf("creating drain lease for %s/%s: %w", r.PodNamespace, r.PodName, err)
	}
	for attempt := 0; ; attempt++ {
		cur, err := api.Get(ctx, want.Name, metav1.GetOptions{})
		if err != nil {
			return nil, false, fmt.Errorf("reading drain lease %s to join it: %w", want.Name, err)
		}
		var upd *coordinationv1.Lease
		cl, perr := ParseLease(cur)
		joining := perr == nil && r.Describes(cl) && cur.Labels[LabelDrain] == want.Labels[LabelDrain]
		if joining {
			var ann map[string]string
			if r.SteerPodIP {
				ann = map[string]string{AnnSteerPodIP: "true"}
			}
			upd, err = c.renew(ctx, cur, r.Duration, now, ann)
		} else {
			want.ResourceVersion = cur.ResourceVersion
			upd, err = api.Update(ctx, want, metav1.UpdateOptions{})
		}
		switch {
		case apierrors.IsConflict(err) && attempt < 5:
			continue // changed meanwhile: read it again and decide again
		case err != nil && joining:
			return nil, false, fmt.Errorf("joining drain lease %s: %w", want.Name, err)
		case err != nil:
			return nil, false, fmt.Errorf("replacing drain lease %s, which describes another drain: %w", want.Name, err)
		}
		l, perr := ParseLease(upd)
		return l, !joining, perr
	}
}

// Describes reports whether l is the Lease of r's drain: the same pod,
// holder and set of IPs (in any order), so that publishing r joins it.
func (r DrainRequest) Describes(l *DrainLease) bool {
	if l.PodUID != r.PodUID || l.PodNamespace != r.PodNamespace || l.PodName != r.PodName ||
		l.Holder != r.Node || l.Claim != r.Claim {
		return false
	}
	missingFrom := func(ips []netip.Addr) func(netip.Addr) bool {
		return func(ip netip.Addr) bool { return !slices.Contains(ips, ip) }
	}
	return !slices.ContainsFunc(r.IPs, missingFrom(l.IPs)) && !slices.ContainsFunc(l.IPs, missingFrom(r.IPs))
}

// Renew moves a Lease's renew time to now and may update its annotations
// (progress). It retries on conflicts.
func (c *Leases) Renew(ctx context.Context, name string, duration time.Duration, now time.Time, ann map[string]string) (*DrainLease, error) {
	api := c.Client.CoordinationV1().Leases(c.Namespace)
	for attempt := 0; ; attempt++ {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("renewing drain lease %s: %w", name, err)
		}
		upd, err := c.renew(ctx, cur, duration, now, ann)
		if apierrors.IsConflict(err) && attempt < 5 {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("renewing drain lease %s: %w", name, err)
		}
		return ParseLease(upd)
	}
}

// renew writes cur, just read, back with its renew time at now, its
// duration (if not 0) and the annotations ann; the Update's error (a
// conflict when cur is stale) is returned as it is.
func (c *Leases) renew(ctx context.Context, cur *coordinationv1.Lease, duration time.Duration, now time.Time, ann map[string]string) (*coordinationv1.Lease, error) {
	mt := metav1.NewMicroTime(now)
	cur.Spec.RenewTime = &mt
	if duration > 0 {
		secs := int32(duration / time.Second)
		cur.Spec.LeaseDurationSeconds = &secs
	}
	if len(ann) > 0 && cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	for k, v := range ann {
		cur.Annotations[k] = v
	}
	return c.Client.CoordinationV1().Leases(c.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
}

// Delete removes a drain Lease; absent is fine.
func (c *Leases) Delete(ctx context.Context, name string) error {
	err := c.Client.CoordinationV1().Leases(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting drain lease %s: %w", name, err)
	}
	return nil
}

// LeaseSelector selects drain Leases.
func LeaseSelector() string { return LabelDrain + "=true" }

// WatchSelector selects drain and claim Leases: what every node watches.
func WatchSelector() string { return LabelDrain + " in (true," + LabelClaimValue + ")" }

// Progress is what the hosting node publishes about a drain in the
// AnnProgress annotation: SYNs that reached the pod since the drain began
// (and in the last 10 s), its live connections, and connections steered
// away from it.
type Progress struct {
	SYNs        uint64
	SYNsLast10s uint64
	// HasLast10s is false for annotations written before syns_10s existed.
	HasLast10s bool
	Live       int
	Steered    uint64
}

// String renders the annotation: "syns=N live=N steered=N syns_10s=N". The
// first three keys are FormatProgress' format, in its order; syns_10s comes
// last so that readers of the older format keep working.
func (p Progress) String() string {
	s := FormatProgress(p.SYNs, p.Live, p.Steered)
	if p.HasLast10s {
		s += " syns_10s=" + strconv.FormatUint(p.SYNsLast10s, 10)
	}
	return s
}

// FormatProgress renders the progress annotation without the 10 s window
// (the format before syns_10s; Progress.String adds it).
func FormatProgress(syns uint64, live int, steered uint64) string {
	return "syns=" + strconv.FormatUint(syns, 10) + " live=" + strconv.Itoa(live) + " steered=" + strconv.FormatUint(steered, 10)
}

// ParseProgress reads an AnnProgress annotation of either format. Unknown
// keys are ignored (newer writers); a malformed value is an error.
func ParseProgress(s string) (Progress, error) {
	var p Progress
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return Progress{}, fmt.Errorf("progress %q: %q is not key=value", s, f)
		}
		var err error
		switch k {
		case "syns":
			p.SYNs, err = strconv.ParseUint(v, 10, 64)
		case "syns_10s":
			p.SYNsLast10s, err = strconv.ParseUint(v, 10, 64)
			p.HasLast10s = err == nil
		case "live":
			p.Live, err = strconv.Atoi(v)
		case "steered":
			p.Steered, err = strconv.ParseUint(v, 10, 64)
		}
		if err != nil {
			return Progress{}, fmt.Errorf("progress %q: %s: %w", s, k, err)
		}
	}
	return p, nil
}
