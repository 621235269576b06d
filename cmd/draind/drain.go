package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/daemon"
	"github.com/draind/draind/k8s"
)

type drainOptions struct {
	kubeconfig, namespace, leaseNamespace string
	duration, wait                        time.Duration
}

func (o *drainOptions) flags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the usual kubeconfig rules)")
	cmd.Flags().StringVarP(&o.namespace, "namespace", "n", "default", "namespace of the pod")
	cmd.Flags().StringVar(&o.leaseNamespace, "draind-namespace", "draind-system", "namespace of draind's drain Leases")
}

func (o *drainOptions) client() (kubernetes.Interface, error) {
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading the API client configuration: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

// validate refuses a drain Lease that would expire at once (a duration
// of 0 or less) and a negative wait, before anything is read or written.
func (o *drainOptions) validate() error {
	if o.duration <= 0 {
		return fmt.Errorf("--lease-duration=%s: must be more than 0 (the default is %s)", o.duration, daemon.DefaultConfig().LeaseDuration)
	}
	if o.wait < 0 {
		return fmt.Errorf("--wait=%s: must not be negative (0: do not wait)", o.wait)
	}
	return nil
}

// podArg accepts "pod" (with -n) or "namespace/pod".
func (o *drainOptions) podArg(arg string) (string, string) {
	if ns, name, ok := strings.Cut(arg, "/"); ok {
		return ns, name
	}
	return o.namespace, arg
}

func newDrainCmd() *cobra.Command {
	o := &drainOptions{}
	cmd := &cobra.Command{
		Use:   "drain [namespace/]POD",
		Short: "Drain one pod cluster-wide through its drain Lease (an operator's offline call)",
		Long: `Publish the pod's drain Lease: every draind steers new connections away from
it; the draind on the pod's node renews the Lease and reports progress on it.
With --wait, print progress until the pod is drained or the wait ends.
The drain lasts until 'draind undrain', the pod's deletion, or the Lease
expiring when nobody renews it.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			c, err := o.client()
			if err != nil {
				return err
			}
			ns, name := o.podArg(args[0])
			return drain(cmd.Context(), cmd.OutOrStdout(), c, o, ns, name)
		},
	}
	o.flags(cmd)
	cmd.Flags().DurationVar(&o.duration, "lease-duration", daemon.DefaultConfig().LeaseDuration, "drain Lease duration (the pod's draind renews it)")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "wait this long for the pod to be drained, printing progress")
	return cmd
}

func newUndrainCmd() *cobra.Command {
	o := &drainOptions{}
	cmd := &cobra.Command{
		Use:   "undrain [namespace/]POD",
		Short: "End a drain started by draind drain or the pod's offline call",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			ns, name := o.podArg(args[0])
			p, err := c.CoreV1().Pods(ns).Get(cmd.Context(), name, metav1.GetOptions{})
			if err != nil {
				return fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
			}
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s/%s is being deleted: its drain cannot be undone", ns, name)
			}
			l := &k8s.Leases{Client: c, Namespace: o.leaseNamespace}
			if err := l.Delete(cmd.Context(), k8s.LeaseName(p.UID)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pod %s/%s: drain ended\n", ns, name)
			return nil
		},
	}
	o.flags(cmd)
	return cmd
}

func drain(ctx context.Context, w io.Writer, c kubernetes.Interface, o *drainOptions, ns, name string) error {
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	var ips []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			ips = append(ips, a)
		}
	}
	if len(ips) == 0 {
		return fmt.Errorf("pod %s/%s has no IP yet: nothing to drain", ns, name)
	}
	if p.Spec.HostNetwork {
		return fmt.Errorf("pod %s/%s uses the host network: draind cannot drain it", ns, name)
	}
	l := &k8s.Leases{Client: c, Namespace: o.leaseNamespace}
	lease, created, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: ns, PodName: name, PodUID: p.UID, IPs: ips,
		Node: p.Spec.NodeName, Reason: k8s.ReasonOperator, Duration: o.duration}, time.Now())
	if err != nil {
		return err
	}
	verb := "joined the drain of"
	if created {
		verb = "draining"
	}
	fmt.Fprintf(w, "%s pod %s/%s (%s) on node %s\n", verb, ns, name, joinIPs(ips), p.Spec.NodeName)
	if o.wait <= 0 {
		return nil
	}
	start := time.Now()
	deadline := start.Add(o.wait)
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	last := ""
	for {
		cur, err := c.CoordinationV1().Leases(o.leaseNamespace).Get(ctx, lease.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			fmt.Fprintln(w)
			return errors.New("the drain ended (undrained, or the Lease expired: is draind running on the pod's node?)")
		case err != nil:
			fmt.Fprintf(w, "\rreading the drain Lease: %v", err)
		default:
			state := cur.Annotations[k8s.AnnState]
			if state == "" {
				state = "waiting for the node's draind"
			}
			line := fmt.Sprintf("\r%6.1fs  %s  %s", time.Since(start).Seconds(), state, cur.Annotations[k8s.AnnProgress])
			if len(line) < len(last) {
				line += strings.Repeat(" ", len(last)-len(line))
			}
			fmt.Fprint(w, line)
			last = line
			if state == daemon.StateDrained {
				fmt.Fprintln(w)
				return nil
			}
		}
		if time.Now().After(deadline) {
			fmt.Fprintln(w)
			return fmt.Errorf("pod %s/%s not drained after %s", ns, name, o.wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func joinIPs(ips []netip.Addr) string {
	s := make([]string, len(ips))
	for i, ip := range ips {
		s[i] = ip.String()
	}
	return strings.Join(s, ",")
}
