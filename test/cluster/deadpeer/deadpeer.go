// Package deadpeer runs the dead-peer scenario on real Kubernetes
// (package headline's cluster: kube-apiserver, the EndpointSlice
// controller, kube-proxy per node, a kubelet stand-in per node, and in the
// draind variant `draind run` per node with its ServiceAccount's RBAC).
//
// A keep-alive client on node-c sends a request every 50 ms through a
// Service's ClusterIP, over one connection. The pod serving that connection
// is killed without any grace: its network goes first (its link down, its
// node black-holes its addresses: nothing it sends can reach anyone, and
// packets to it vanish, as when its node fails or its sandbox network is
// torn down before its sockets can say goodbye), then its processes are
// killed (SIGKILL, no preStop) and its pod object is force-deleted (grace
// 0). The figure is the time from the kill to the client's next successful
// request, with kube-proxy alone and with draind.
//
// Words are defined in the repository's docs/glossary.md.
package deadpeer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/scenario"
)

// Config configures the scenario.
type Config struct {
	// Runs per variant (5).
	Runs int
	// RequestTimeout is the client's timeout per request and per dial (5 s):
	// without draind, the client waits this long on a dead connection.
	RequestTimeout time.Duration
	// Pods behind the Service (3, spread over node-a and node-b).
	Pods int
}

func (c *Config) defaults() {
	if c.Runs == 0 {
		c.Runs = 5
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 5 * time.Second
	}
	if c.Pods == 0 {
		c.Pods = 3
	}
}

// Run is one kill.
type Run struct {
	Victim   string
	VictimIP netip.Addr
	Killed   time.Time
	// NextSuccess is the time from the kill to the client's next
	// successful request; Served names the pod that served it.
	NextSuccess time.Duration
	Served      string
	// FirstError is the time from the kill to the client's first failed
	// request: when the dead connection was given up (by the kernel with
	// draind, by the client's own timeout without).
	FirstError time.Duration
	// Errors are the client's failed requests and dials in between, by
	// class (etimedout: the kernel ended the socket; timeout: the client
	// gave up waiting).
	Errors []string
}

// Result is one variant's runs.
type Result struct {
	Variant string
	Runs    []Run
}

// Range returns the smallest and largest time to the next success.
func (r *Result) Range() (lo, hi time.Duration) {
	for i, run := range r.Runs {
		if i == 0 || run.NextSuccess < lo {
			lo = run.NextSuccess
		}
		if run.NextSuccess > hi {
			hi = run.NextSuccess
		}
	}
	return lo, hi
}

// Variants: kube-proxy alone, and with draind on every node.
var (
	Without = scenario.Variant{Name: "kube-proxy only"}
	Draind  = scenario.Variant{Name: "draind", Draind: true}
)

// RunVariant runs cfg.Runs kills in variant v on c (kc is its control
// plane).
func RunVariant(ctx context.Context, c *headline.Cluster, kc *kube.Cluster, cfg Config, v scenario.Variant) (res *Result, err error) {
	cfg.defaults()
	stop, err := c.Prepare(ctx, v)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, stop()) }()
	ns := "deadpeer-" + strings.ReplaceAll(strings.ReplaceAll(v.Name, " ", "-"), "_", "-")
	defer func() { err = errors.Join(err, c.Clear(context.WithoutCancel(ctx), ns)) }()
	res = &Result{Variant: v.Name}
	for i := 0; i < cfg.Runs; i++ {
		// A Service of its own per run: the previous run's departed pods
		// linger on theirs, and draind would steer (socket-level) a VIP
		// whose Service has a lingering endpoint; here the client's socket
		// must know only the VIP, as it does when nothing drains.
		app := fmt.Sprintf("web-%d", i)
		vip, err := c.CreateService(ctx, scenario.ServiceSpec{Namespace: ns, Name: app, Selector: map[string]string{"app": app},
			Port: 80, TargetPort: 8080})
		if err != nil {
			return res, err
		}
		run, err := oneKill(ctx, c, kc, cfg, ns, vip, app, i)
		if err != nil {
			return res, fmt.Errorf("run %d: %w", i+1, err)
		}
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// server is one pod of the Service.
type server struct {
	name string
	pod  *bed.Pod
	proc *bed.Proc
}

func oneKill(ctx context.Context, c *headline.Cluster, kc *kube.Cluster, cfg Config, ns string, vip netip.AddrPort, app string, run int) (Run, error) {
	nodes := c.ServerNodes()
	var servers []*server
	defer func() {
		// The next run starts from no pod: its Service's endpoints are its
		// own pods only.
		zero := int64(0)
		for _, s := range servers {
			s.proc.Kill()
			kc.Admin.CoreV1().Pods(ns).Delete(context.WithoutCancel(ctx), s.name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
	}()
	var eps []netip.AddrPort
	for i := 0; i < cfg.Pods; i++ {
		name := fmt.Sprintf("web-%d-%d", run, i)
		node := nodes[i%len(nodes)]
		bp, err := node.AddPod(ns + "-" + name)
		if err != nil {
			return Run{}, err
		}
		proc, err := bp.Start("serve", name, "tcp:[::]:8080")
		if err != nil {
			return Run{}, err
		}
		servers = append(servers, &server{name: name, pod: bp, proc: proc})
		if err := c.RunPod(ctx, scenario.PodSpec{Namespace: ns, Name: name, Node: node, Labels: map[string]string{"app": app},
			Port: 8080, IPs: []netip.Addr{bp.IP4, bp.IP6}}); err != nil {
			return Run{}, err
		}
		eps = append(eps, netip.AddrPortFrom(bp.IP4, 8080))
	}
	if err := c.WaitProgrammed(ctx, c.ClientNode(), vip, eps); err != nil {
		return Run{}, fmt.Errorf("waiting for kube-proxy on the client node: %w", err)
	}
	cp, err := c.ClientNode().AddPod(fmt.Sprintf("%s-client-%d", ns, run))
	if err != nil {
		return Run{}, err
	}
	client, err := cp.Start("client")
	if err != nil {
		return Run{}, err
	}
	defer client.Kill()
	if _, err := client.Call(bed.Request{Op: "keepalive_start", ID: "ka", Addr: vip.String(),
		Interval: 50 * time.Millisecond, Timeout: cfg.RequestTimeout}); err != nil {
		return Run{}, err
	}
	// The connection it keeps is on whichever pod kube-proxy picked: the
	// answers so far name it.
	tl, err := bed.WaitServed(client, "ka", 10*time.Second)
	if err != nil {
		return Run{}, fmt.Errorf("through %s: %w", vip, err)
	}
	if tl[len(tl)-1].Conn != 1 {
		return Run{}, fmt.Errorf("the client is not being served on one connection through %s: %v", vip, tl)
	}
	victimName := tl[len(tl)-1].Server
	idx := slices.IndexFunc(servers, func(s *server) bool { return s.name == victimName })
	if idx < 0 {
		return Run{}, fmt.Errorf("the client is served by %q, no pod of this run", victimName)
	}
	victim := servers[idx]
	killed, err := vanish(ctx, kc, ns, victim)
	if err != nil {
		return Run{}, err
	}
	// Observe long enough for the client without draind: its timeout, a
	// redial that may meet kube-proxy's stale rule, and a margin.
	time.Sleep(2*cfg.RequestTimeout + 2*time.Second)
	r, err := client.Call(bed.Request{Op: "keepalive_stop", ID: "ka"})
	if err != nil {
		return Run{}, err
	}
	out := Run{Victim: victim.name, VictimIP: victim.pod.IP4, Killed: killed}
	for _, s := range r.Timeline {
		if s.Err != "" && s.At > killed.UnixNano() {
			if len(out.Errors) == 0 {
				out.FirstError = time.Duration(s.At - killed.UnixNano())
			}
			out.Errors = append(out.Errors, s.Err)
		}
	}
	first, ok := bed.FirstSuccessAfter(r.Timeline, killed)
	if !ok {
		return out, fmt.Errorf("the client never succeeded again after %s was killed (errors %v)", victim.name, out.Errors)
	}
	out.NextSuccess = time.Duration(first.At - killed.UnixNano())
	out.Served = first.Server
	// The client's connection must have been on the victim.
	if len(out.Errors) == 0 && first.Server != victim.name {
		return out, fmt.Errorf("the client was not on %s when it was killed (served by %s without an error)", victim.name, first.Server)
	}
	return out, nil
}

// vanish kills pod s without any grace and returns the instant its network
// went: no answer from it can arrive after that.
func vanish(ctx context.Context, kc *kube.Cluster, ns string, s *server) (time.Time, error) {
	node := s.pod.Node
	if _, err := s.pod.NS.Run("ip", "link", "set", "eth0", "down"); err != nil {
		return time.Time{}, err
	}
	// From here nothing the pod sends leaves it. The routes below only
	// make sure nothing reaches it either; on a loaded machine running
	// them takes a while, which must not count.
	cut := time.Now()
	for _, r := range [][]string{
		{"ip", "route", "replace", "blackhole", s.pod.IP4.String() + "/32"},
		{"ip", "-6", "route", "replace", "blackhole", s.pod.IP6.String() + "/128"},
	} {
		if _, err := node.NS.Run(r[0], r[1:]...); err != nil {
			return time.Time{}, err
		}
	}
	s.proc.Kill() // SIGKILL
	zero := int64(0)
	if err := kc.Admin.CoreV1().Pods(ns).Delete(ctx, s.name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return cut, fmt.Errorf("force-deleting %s: %w", s.name, err)
	}
	return cut, nil
}

// WriteTable writes the figures, one row per variant.
func WriteTable(w io.Writer, cfg Config, results []*Result) {
	cfg.defaults()
	fmt.Fprintf(w, "dead peer: keep-alive client through a ClusterIP, its pod killed without grace (network gone, SIGKILL, force delete); client timeout %v\n", cfg.RequestTimeout)
	fmt.Fprintf(w, "| variant | runs | kill -> next success (min .. max) | each run | kill -> dead connection given up | client errors |\n")
	for _, r := range results {
		lo, hi := r.Range()
		var each, ended, errs []string
		for _, run := range r.Runs {
			each = append(each, run.NextSuccess.Round(time.Millisecond).String())
			ended = append(ended, run.FirstError.Round(time.Millisecond).String())
			errs = append(errs, strings.Join(run.Errors, "+"))
		}
		fmt.Fprintf(w, "| %s | %d | %v .. %v | %s | %s | %s |\n", r.Variant, len(r.Runs), lo.Round(time.Millisecond), hi.Round(time.Millisecond),
			strings.Join(each, ", "), strings.Join(ended, ", "), strings.Join(errs, ", "))
	}
}
