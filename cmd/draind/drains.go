package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/k8s"
)

// Reasons of drains seen only in EndpointSlices (no drain Lease): what makes
// every draind steer new connections away from the endpoint.
const (
	reasonTerminating = "terminating"
	reasonNotReady    = "not-ready"
)

// clusterDrain is one draining pod as `draind drains` shows it: from its
// drain Lease (published by whoever started the drain, progress written by
// the hosting node's draind) and from the EndpointSlices that list it as
// terminating or not ready.
type clusterDrain struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	UID       string   `json:"uid,omitempty"`
	Node      string   `json:"node,omitempty"`
	IPs       []string `json:"ips,omitempty"`
	Reason    string   `json:"reason"`
	// State is the hosting node's word on the Lease (draining, drained,
	// timed-out, ...); "waiting" before it wrote one; "expired" when the
	// Lease was not renewed in time; for an endpoint without a Lease,
	// "draining" (every draind steers away from it).
	State string    `json:"state"`
	Since time.Time `json:"since,omitzero"`
	// Progress is the hosting node's measurement, when it published one.
	Progress *drainProgress `json:"progress,omitempty"`
	// Endpoint is the pod's condition in the EndpointSlices ("terminating",
	// "not-ready", "ready"), empty when no slice lists it.
	Endpoint string    `json:"endpoint,omitempty"`
	Services []string  `json:"services,omitempty"`
	Lease    string    `json:"lease,omitempty"`
	Expires  time.Time `json:"lease_expires,omitzero"`
}

type drainProgress struct {
	SYNs        uint64  `json:"syns"`
	SYNsLast10s *uint64 `json:"syns_last_10s,omitempty"` // absent from older daemons
	Live        int     `json:"live_connections"`
	Steered     uint64  `json:"steered"`
}

type drainsOptions struct {
	drainOptions
	output   string
	watch    bool
	interval time.Duration
}

func newDrainsCmd() *cobra.Command {
	o := &drainsOptions{}
	cmd := &cobra.Command{
		Use:   "drains",
		Short: "List every drain in the cluster (drain Leases and terminating or not-ready endpoints)",
		Long: `List every pod being drained anywhere in the cluster, from the drain Leases in
draind's namespace and the EndpointSlices of every namespace: pod, node,
reason, state, age and progress (SYNs in the last 10 s and live connections,
as the pod's node measures them). Needs a kubeconfig that may list Leases in
draind's namespace and EndpointSlices cluster-wide, and get pods (for the age
of drains without a Lease); --watch lists again every --interval.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch o.output {
			case "", "wide", "json":
			default:
				return fmt.Errorf("unknown output format %q (want json or wide)", o.output)
			}
			if o.interval <= 0 {
				return fmt.Errorf("--interval must be positive, got %v", o.interval)
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			l := &drainLister{client: c, leaseNamespace: o.leaseNamespace}
			if !o.watch {
				ds, err := l.list(cmd.Context(), time.Now())
				if err != nil {
					return err
				}
				return printDrains(cmd.OutOrStdout(), ds, time.Now(), o.output)
			}
			return watchDrains(cmd.Context(), cmd.OutOrStdout(), l, o.interval, o.output)
		},
	}
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual kubeconfig rules)")
	cmd.Flags().StringVar(&o.leaseNamespace, "draind-namespace", "draind-system", "namespace of draind's drain Leases")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "output format: json or wide (default: text)")
	cmd.Flags().BoolVarP(&o.watch, "watch", "w", false, "keep listing: print the drains again whenever they change")
	cmd.Flags().DurationVar(&o.interval, "interval", 2*time.Second, "with --watch: how often to look")
	return cmd
}

// drainLister reads the drains from the API. It remembers what it learnt
// from pods (when a deletion or an unreadiness began), which does not change
// while the pod lives.
type drainLister struct {
	client         kubernetes.Interface
	leaseNamespace string

	mu    sync.Mutex
	since map[types.UID]time.Time
}

// list returns every drain, sorted by namespace and pod name.
func (l *drainLister) list(ctx context.Context, now time.Time) ([]clusterDrain, error) {
	leases, err := l.client.CoordinationV1().Leases(l.leaseNamespace).List(ctx, metav1.ListOptions{LabelSelector: k8s.LeaseSelector()})
	if err != nil {
		return nil, fmt.Errorf("listing drain Leases in %s: %w", l.leaseNamespace, err)
	}
	sls, err := l.client.DiscoveryV1().EndpointSlices(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing EndpointSlices: %w", err)
	}
	ds := mergeDrains(leases.Items, sls.Items, now)
	for i := range ds {
		d := &ds[i]
		if d.Since.IsZero() && d.UID != "" {
			d.Since = l.podSince(ctx, d)
		}
	}
	return ds, nil
}

// podSince finds when an endpoint without a Lease started draining: the
// pod's deletion, or the last change of its Ready condition. Unknown (zero)
// when the pod cannot be read.
func (l *drainLister) podSince(ctx context.Context, d *clusterDrain) time.Time {
	uid := types.UID(d.UID)
	l.mu.Lock()
	t, ok := l.since[uid]
	l.mu.Unlock()
	if ok {
		return t
	}
	p, err := l.client.CoreV1().Pods(d.Namespace).Get(ctx, d.Name, metav1.GetOptions{})
	if err != nil || p.UID != uid {
		return time.Time{} // gone, another pod of that name, or no right to read it
	}
	switch {
	case p.DeletionTimestamp != nil:
		// A graceful deletion sets the timestamp to the end of the grace
		// period: the deletion began that much earlier.
		t = p.DeletionTimestamp.Time
		if g := p.DeletionGracePeriodSeconds; g != nil {
			t = t.Add(-time.Duration(*g) * time.Second)
		}
	default:
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
				t = c.LastTransitionTime.Time
			}
		}
	}
	if !t.IsZero() && p.DeletionTimestamp != nil { // a deletion never moves
		l.mu.Lock()
		if l.since == nil {
			l.since = map[types.UID]time.Time{}
		}
		l.since[uid] = t
		l.mu.Unlock()
	}
	return t
}

// mergeDrains joins drain Leases and draining endpoints into one row per
// pod (by UID; by namespace/name for endpoints without a pod reference).
// Malformed Leases are skipped, as every draind skips them.
func mergeDrains(leases []coordinationv1.Lease, sls []discoveryv1.EndpointSlice, now time.Time) []clusterDrain {
	byKey := map[string]*clusterDrain{}
	for i := range leases {
		if d := leaseDrain(&leases[i], now); d != nil {
			byKey[drainKey(d.UID, d.Namespace, d.Name)] = d
		}
	}
	for i := range sls {
		addSliceDrains(byKey, &sls[i])
	}
	return sortedDrains(byKey)
}

// drainKey identifies a pod: by UID, or by name where a slice names no UID.
func drainKey(uid, ns, name string) string {
	if uid != "" {
		return "uid/" + uid
	}
	return "pod/" + ns + "/" + name
}

// leaseDrain is the drain a Lease publishes; nil if it is not a drain Lease.
func leaseDrain(lease *coordinationv1.Lease, now time.Time) *clusterDrain {
	l, err := k8s.ParseLease(lease)
	if err != nil {
		return nil
	}
	d := &clusterDrain{Namespace: l.PodNamespace, Name: l.PodName, UID: string(l.PodUID), Node: l.Holder,
		Reason: l.Reason, State: l.State, Since: l.Acquired, Lease: l.Name, Expires: l.Expires()}
	for _, ip := range l.IPs {
		d.IPs = append(d.IPs, ip.String())
	}
	if d.State == "" {
		d.State = "waiting"
	}
	if now.After(l.Expires()) {
		d.State = "expired"
	}
	if l.Progress != "" {
		if p, err := k8s.ParseProgress(l.Progress); err == nil {
			dp := &drainProgress{SYNs: p.SYNs, Live: p.Live, Steered: p.Steered}
			if p.HasLast10s {
				v := p.SYNsLast10s
				dp.SYNsLast10s = &v
			}
			d.Progress = dp
		}
	}
	return d
}

// endpointCondition names an endpoint's condition as the drains table does.
func endpointCondition(c discoveryv1.EndpointConditions) string {
	switch {
	case c.Terminating != nil && *c.Terminating:
		return reasonTerminating
	case c.Ready != nil && !*c.Ready:
		return reasonNotReady
	}
	return "ready"
}

// addSliceDrains adds a slice's pods that are not ready to byKey, and its
// Service, node and addresses to the drains byKey already has.
func addSliceDrains(byKey map[string]*clusterDrain, sl *discoveryv1.EndpointSlice) {
	svc := sl.Namespace + "/" + sl.Labels[discoveryv1.LabelServiceName]
	for _, ep := range sl.Endpoints {
		cond := endpointCondition(ep.Conditions)
		var uid, ns, name string
		if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
			uid, ns, name = string(ep.TargetRef.UID), ep.TargetRef.Namespace, ep.TargetRef.Name
			if ns == "" {
				ns = sl.Namespace
			}
		}
		if name == "" {
			continue // not a pod: nothing draind drains
		}
		k := drainKey(uid, ns, name)
		d, ok := byKey[k]
		if !ok {
			if cond == "ready" {
				continue
			}
			d = &clusterDrain{Namespace: ns, Name: name, UID: uid, Reason: cond, State: daemon.StateDraining}
			byKey[k] = d
		}
		if d.Endpoint == "" || d.Endpoint == "ready" {
			d.Endpoint = cond
		}
		if d.Node == "" && ep.NodeName != nil {
			d.Node = *ep.NodeName
		}
		if d.Lease == "" {
			for _, a := range ep.Addresses {
				if !slices.Contains(d.IPs, a) {
					d.IPs = append(d.IPs, a)
				}
			}
		}
		if !slices.Contains(d.Services, svc) {
			d.Services = append(d.Services, svc)
		}
	}
}

// sortedDrains lists byKey by namespace, name and UID, each drain's
// Services and IPs sorted.
func sortedDrains(byKey map[string]*clusterDrain) []clusterDrain {
	out := make([]clusterDrain, 0, len(byKey))
	for _, d := range byKey {
		slices.Sort(d.Services)
		slices.SortFunc(d.IPs, func(a, b string) int {
			pa, ea := netip.ParseAddr(a)
			pb, eb := netip.ParseAddr(b)
			if ea != nil || eb != nil {
				return strings.Compare(a, b)
			}
			return pa.Compare(pb)
		})
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b clusterDrain) int {
		if c := strings.Compare(a.Namespace, b.Namespace); c != 0 {
			return c
		}
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.UID, b.UID)
	})
	return out
}

func printDrains(w io.Writer, ds []clusterDrain, now time.Time, output string) error {
	switch output {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Time   time.Time      `json:"time"`
			Drains []clusterDrain `json:"drains"`
		}{now.UTC(), ds})
	case "", "wide":
	default:
		return fmt.Errorf("unknown output format %q (want json or wide)", output)
	}
	if len(ds) == 0 {
		_, err := fmt.Fprintln(w, "No drains.")
		return err
	}
	wide := output == "wide"
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	hdr := "POD\tNODE\tREASON\tSTATE\tAGE\tSYNS(10s)\tLIVE"
	if wide {
		hdr += "\tIPS\tENDPOINT\tSERVICES\tSYNS\tSTEERED\tLEASE EXPIRES"
	}
	fmt.Fprintln(tw, hdr)
	for _, d := range ds {
		syns10, live, syns, steered := "-", "-", "-", "-"
		if p := d.Progress; p != nil {
			live, syns, steered = fmt.Sprint(p.Live), fmt.Sprint(p.SYNs), fmt.Sprint(p.Steered)
			if p.SYNsLast10s != nil {
				syns10 = fmt.Sprint(*p.SYNsLast10s)
			}
		}
		line := fmt.Sprintf("%s/%s\t%s\t%s\t%s\t%s\t%s\t%s", d.Namespace, d.Name, orDash(d.Node), d.Reason, d.State,
			bpf.Age(now, d.Since), syns10, live)
		if wide {
			expires := "-"
			switch {
			case d.Expires.IsZero():
			case d.Expires.After(now):
				expires = bpf.Age(now, d.Expires)
			default:
				expires = bpf.Age(now, d.Expires) + " ago"
			}
			line += fmt.Sprintf("\t%s\t%s\t%s\t%s\t%s\t%s", orDash(strings.Join(d.IPs, ",")), orDash(d.Endpoint),
				orDash(strings.Join(d.Services, ",")), syns, steered, expires)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// watchDrains prints the drains, then again (after a time line) whenever
// they change, until ctx ends. With -o json it writes one JSON document per
// change.
func watchDrains(ctx context.Context, w io.Writer, l *drainLister, every time.Duration, output string) error {
	t := time.NewTicker(every)
	defer t.Stop()
	var last string
	first := true
	for {
		now := time.Now()
		ds, err := l.list(ctx, now)
		switch {
		case ctx.Err() != nil:
			return nil
		case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
			return err
		case err != nil:
			fmt.Fprintf(w, "%s  %v (retrying)\n", now.Format(time.TimeOnly), err)
		default:
			// Compare without ages, which change every time.
			b, _ := json.Marshal(ds)
			if cur := string(b); first || cur != last {
				if !first && output != "json" {
					fmt.Fprintf(w, "\n--- %s\n", now.Format(time.TimeOnly))
				}
				if err := printDrains(w, ds, now, output); err != nil {
					return err
				}
				last, first = cur, false
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
