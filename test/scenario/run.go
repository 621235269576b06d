package scenario

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
)

// Run runs one variant on cp and returns what it measured:
//
//  1. a Service "web" with Config.Replicas pods spread over the server
//     nodes;
//  2. on the client node, once its data plane balances over every pod: a
//     ClusterIP client and a stale-registry client (the first pod's IP,
//     learned before the rollout), each opening a new connection every
//     Config.Interval, and a keep-alive client;
//  3. after Config.Warmup, a rolling replacement with maxSurge 1 and
//     maxUnavailable 0 that counts terminating pods (a Deployment with
//     podReplacementPolicy TerminationComplete, or a StatefulSet): start a
//     new pod on the old one's node, wait until it is Ready, delete the old
//     one gracefully, wait until it is gone, next;
//  4. Config.Tail more of the same traffic, then the counts.
func Run(ctx context.Context, cp ControlPlane, cfg Config, v Variant) (_ *Result, err error) {
	cfg.defaults()
	if len(cp.ServerNodes()) == 0 || cp.ClientNode() == nil {
		return nil, errors.New("running the scenario: the control plane has no server or client node")
	}
	r := &runner{cp: cp, cfg: cfg, v: v, ns: v.Namespace(), log: cfg.Log.With("variant", v.Label())}
	r.log.Info("preparing variant", "control_plane", cp.Describe(), "draind", v.Draind, "prestop", string(v.PreStop), "load", v.Load)
	undo, err := cp.Prepare(ctx, v)
	if err != nil {
		return nil, fmt.Errorf("preparing variant %s: %w", v.Label(), err)
	}
	defer func() {
		cerr := r.cleanup()
		uerr := undo()
		if uerr != nil {
			uerr = fmt.Errorf("undoing variant %s: %w", v.Label(), uerr)
		}
		err = errors.Join(err, cerr, uerr)
	}()
	return r.run(ctx)
}

// Client names, as the table prints them.
const (
	ClientClusterIP = "ClusterIP"
	ClientStale     = "stale registry"
	ClientKeepAlive = "keep-alive"
)

type runner struct {
	cp  ControlPlane
	cfg Config
	v   Variant
	ns  string
	log *slog.Logger

	mu      sync.Mutex
	pods    []*serverPod
	clients []*bed.Pod
	procs   []*bed.Proc
}

var podLabels = map[string]string{"app": "web"}

func (r *runner) run(ctx context.Context) (*Result, error) {
	cfg := r.cfg
	vip, err := r.cp.CreateService(ctx, ServiceSpec{Namespace: r.ns, Name: "web", Selector: podLabels, Port: cfg.Port, TargetPort: cfg.TargetPort})
	if err != nil {
		return nil, err
	}
	servers := r.cp.ServerNodes()
	var old []*serverPod
	for i := range cfg.Replicas {
		p, err := r.startPod(ctx, i, servers[i%len(servers)])
		if err != nil {
			return nil, err
		}
		old = append(old, p)
	}
	var eps []netip.AddrPort
	for _, p := range old {
		eps = append(eps, p.addr)
	}
	client := r.cp.ClientNode()
	if err := r.cp.WaitProgrammed(ctx, client, vip, eps); err != nil {
		return nil, fmt.Errorf("waiting for the client node's data plane: %w", err)
	}

	cip, err := r.startLoop(ClientClusterIP, "cip", vip)
	if err != nil {
		return nil, err
	}
	stale, err := r.startLoop(ClientStale, "stale", old[0].addr)
	if err != nil {
		return nil, err
	}
	ka, err := r.startKeepAlive(vip)
	if err != nil {
		return nil, err
	}
	r.log.Info("clients running", "clusterip", vip, "stale_target", old[0].addr)
	kaStopped := false
	defer func() {
		if !kaStopped {
			ka.stop()
		}
	}()
	if err := sleepCtx(ctx, cfg.Warmup); err != nil {
		return nil, err
	}

	res := &Result{Variant: r.v, ControlPlane: r.cp.Describe(), Config: cfg, RolloutStart: time.Now()}
	for i, o := range old {
		n, err := r.startPod(ctx, cfg.Replicas+i, o.node)
		if err != nil {
			return nil, err
		}
		o.deleted = time.Now()
		if err := r.cp.DeletePod(ctx, r.ns, o.name); err != nil {
			return nil, err
		}
		if err := o.waitGone(ctx, cfg.SleepPreStop+cfg.OfflineWait+cfg.Teardown+time.Minute); err != nil {
			return nil, err
		}
		r.log.Info("pod replaced", "old", o.name, "new", n.name, "node", o.node.Name,
			"prestop", o.preStopOutcome, "delete_to_gone", o.gone.Sub(o.deleted).Round(time.Millisecond))
	}
	res.RolloutEnd = time.Now()
	r.log.Info("rollout done", "took", res.Rollout().Round(time.Millisecond), "tail", cfg.Tail)
	if err := sleepCtx(ctx, cfg.Tail); err != nil {
		return nil, err
	}

	for _, l := range []*loopClient{cip, stale} {
		c, err := l.stop()
		if err != nil {
			return nil, err
		}
		res.Clients = append(res.Clients, c)
	}
	kaStopped = true
	res.Clients = append(res.Clients, ka.stop())
	for _, o := range old {
		res.Pods = append(res.Pods, PodResult{
			Name: o.name, Node: o.node.Name, IP: o.addr.Addr(),
			Deleted: o.deleted, PreStopTook: o.preStopTook, PreStop: o.preStopOutcome,
			Stopped: o.stopped, Gone: o.gone, SYNsAfterStop: o.synsAfterStop,
		})
	}
	return res, nil
}

// cleanup removes every client and pod the run created and what the
// variant left in the API.
func (r *runner) cleanup() error {
	r.mu.Lock()
	procs, clients, pods := r.procs, r.clients, r.pods
	r.procs, r.clients, r.pods = nil, nil, nil
	r.mu.Unlock()
	var errs []error
	for _, p := range procs {
		p.Kill()
	}
	for _, c := range clients {
		errs = append(errs, c.Delete())
	}
	for _, p := range pods {
		errs = append(errs, p.remove())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.cp.Clear(ctx, r.ns); err != nil {
		errs = append(errs, fmt.Errorf("clearing namespace %s: %w", r.ns, err))
	}
	return errors.Join(errs...)
}

// --- server pods ----------------------------------------------------------------

// serverPod is one of the Service's pods and what happened to it.
type serverPod struct {
	name string
	node *bed.Node
	bed  *bed.Pod
	syns *bed.SYNCounter // SYNs reaching the pod's server port
	srv  *bed.Proc
	exec *bed.Proc // runs the offline preStop from inside the pod
	addr netip.AddrPort

	// Written by the hooks (the kubelet's goroutine), read after goneCh.
	deleted        time.Time
	preStopTook    time.Duration
	preStopOutcome string
	stopped        time.Time
	synsAfterStop  int
	gone           time.Time
	goneErr        error
	goneCh         chan struct{}
	goneOnce       sync.Once
	removeOnce     sync.Once
	removeErr      error
}

func (p *serverPod) setGone(err error) {
	p.goneOnce.Do(func() {
		p.gone, p.goneErr = time.Now(), err
		close(p.goneCh)
	})
}

func (p *serverPod) waitGone(ctx context.Context, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.goneCh:
		if p.goneErr != nil {
			return fmt.Errorf("terminating pod %s: %w", p.name, p.goneErr)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("pod %s not gone %v after its deletion", p.name, timeout)
	case <-ctx.Done():
		return fmt.Errorf("waiting for pod %s to go: %w", p.name, ctx.Err())
	}
}

// remove kills the pod's processes and removes its namespace and cgroup
// (the sandbox), once.
func (p *serverPod) remove() error {
	p.removeOnce.Do(func() {
		for _, proc := range []*bed.Proc{p.srv, p.exec} {
			if proc != nil {
				proc.Kill()
			}
		}
		p.removeErr = p.bed.Delete()
	})
	return p.removeErr
}

func (r *runner) startPod(ctx context.Context, idx int, node *bed.Node) (*serverPod, error) {
	name := fmt.Sprintf("web-%d", idx)
	bp, err := node.AddPod(r.ns + "-" + name)
	if err != nil {
		return nil, fmt.Errorf("creating pod %s: %w", name, err)
	}
	p := &serverPod{name: name, node: node, bed: bp, addr: netip.AddrPortFrom(bp.IP4, r.cfg.TargetPort), goneCh: make(chan struct{})}
	r.mu.Lock()
	r.pods = append(r.pods, p)
	r.mu.Unlock()
	if p.syns, err = bed.NewSYNCounter(bp.NS, "scenario_syns", r.cfg.TargetPort); err != nil {
		return nil, fmt.Errorf("counting the SYNs of pod %s: %w", name, err)
	}
	if p.srv, err = bp.Start("serve", name, fmt.Sprintf("tcp:[::]:%d", r.cfg.TargetPort)); err != nil {
		return nil, fmt.Errorf("starting the server of pod %s: %w", name, err)
	}
	hooks := PodHooks{Stop: r.stopHook(p), Gone: p.setGone}
	var lifecycle *corev1.LifecycleHandler
	var annotations map[string]string
	switch r.v.PreStop {
	case PreStopSleep:
		hooks.PreStop = r.sleepHook(p)
		lifecycle = &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: int64(r.cfg.SleepPreStop / time.Second)}}
	case PreStopOffline:
		if p.exec, err = bp.Start("client"); err != nil {
			return nil, fmt.Errorf("starting the preStop runner of pod %s: %w", name, err)
		}
		hooks.PreStop = r.offlineHook(p)
		lifecycle = &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c",
			fmt.Sprintf("curl -sf -X POST http://$HOST_IP:%d/v1/offline?wait=%s", r.cfg.OfflinePort, r.cfg.OfflineWait)}}}
		annotations = map[string]string{k8s.AnnotationSteerOnDelete: "true"}
	}
	err = r.cp.RunPod(ctx, PodSpec{Namespace: r.ns, Name: name, Node: node, Labels: podLabels, Port: r.cfg.TargetPort,
		IPs: []netip.Addr{bp.IP4, bp.IP6}, PreStop: lifecycle, Hooks: hooks, Annotations: annotations})
	if err != nil {
		return nil, fmt.Errorf("running pod %s: %w", name, err)
	}
	return p, nil
}

func (r *runner) sleepHook(p *serverPod) func(context.Context) error {
	return func(ctx context.Context) error {
		start := time.Now()
		err := sleepCtx(ctx, r.cfg.SleepPreStop)
		p.preStopTook = time.Since(start)
		p.preStopOutcome = "slept"
		return err
	}
}

// offlineAnswer is the part of draind's /v1/offline answer the scenario
// reads.
type offlineAnswer struct {
	State   string `json:"state"`
	Drained bool   `json:"drained"`
	Error   string `json:"error"`
}

// offlineHook calls draind's offline API from inside the pod (its source
// IP is what identifies it) and returns when draind answers.
func (r *runner) offlineHook(p *serverPod) func(context.Context) error {
	url := fmt.Sprintf("http://%s/v1/offline?wait=%s", netip.AddrPortFrom(p.node.IP4, r.cfg.OfflinePort), r.cfg.OfflineWait)
	return func(ctx context.Context) error {
		start := time.Now()
		type result struct {
			resp bed.Response
			err  error
		}
		ch := make(chan result, 1)
		go func() {
			resp, err := p.exec.Call(bed.Request{Op: "http", Line: "POST", Addr: url, Timeout: r.cfg.OfflineWait + 10*time.Second})
			ch <- result{resp, err}
		}()
		var res result
		select {
		case res = <-ch:
		case <-ctx.Done():
			p.exec.Kill()
			<-ch
			return ctx.Err()
		}
		p.preStopTook = time.Since(start)
		if res.err != nil {
			p.preStopOutcome = "failed"
			return fmt.Errorf("calling %s from pod %s: %w", url, p.name, res.err)
		}
		var a offlineAnswer
		if err := json.Unmarshal([]byte(res.resp.Body), &a); err != nil {
			p.preStopOutcome = "failed"
			return fmt.Errorf("offline call of pod %s answered %d %q: %w", p.name, res.resp.Code, res.resp.Body, err)
		}
		p.preStopOutcome = a.State
		if res.resp.Code != 200 || !a.Drained {
			return fmt.Errorf("offline call of pod %s answered %d: state %q %s", p.name, res.resp.Code, a.State, a.Error)
		}
		return nil
	}
}

// stopHook is the pod's end: its server stops (SIGTERM: stop accepting,
// close the connections it holds), and Config.Teardown later the sandbox
// goes. SYNs reaching the pod in between are counted.
func (r *runner) stopHook(p *serverPod) func(context.Context) error {
	return func(ctx context.Context) error {
		c0, err := p.syns.Count()
		if err != nil {
			return err
		}
		st0, err := p.srv.Call(bed.Request{Op: "stats"})
		if err != nil {
			return fmt.Errorf("reading server stats of pod %s: %w", p.name, err)
		}
		for _, op := range []string{"stop", "close_all"} {
			if _, err := p.srv.Call(bed.Request{Op: op}); err != nil {
				return fmt.Errorf("stopping the server of pod %s: %w", p.name, err)
			}
		}
		p.stopped = time.Now()
		st1, err := p.srv.Call(bed.Request{Op: "stats"})
		if err != nil {
			return fmt.Errorf("reading server stats of pod %s: %w", p.name, err)
		}
		serr := sleepCtx(ctx, r.cfg.Teardown)
		c1, err := p.syns.Count()
		if err != nil {
			return err
		}
		// SYNs between the first count and the stop were accepted.
		p.synsAfterStop = int(c1-c0) - (st1.Accepted - st0.Accepted)
		return errors.Join(serr, p.remove())
	}
}

// --- clients ----------------------------------------------------------------------

// addClient creates a client pod on the client node running a client helper.
func (r *runner) addClient(name string) (*bed.Proc, error) {
	bp, err := r.cp.ClientNode().AddPod(r.ns + "-" + name)
	if err != nil {
		return nil, fmt.Errorf("creating client pod %s: %w", name, err)
	}
	r.mu.Lock()
	r.clients = append(r.clients, bp)
	r.mu.Unlock()
	proc, err := bp.Start("client")
	if err != nil {
		return nil, fmt.Errorf("starting client %s: %w", name, err)
	}
	r.mu.Lock()
	r.procs = append(r.procs, proc)
	r.mu.Unlock()
	return proc, nil
}

// loopClient opens a new connection every interval (in its own process,
// so the pace does not depend on this one) and tallies the outcomes.
type loopClient struct {
	name   string
	target netip.AddrPort
	proc   *bed.Proc
}

func (r *runner) startLoop(name, pod string, target netip.AddrPort) (*loopClient, error) {
	proc, err := r.addClient(pod)
	if err != nil {
		return nil, err
	}
	if _, err := proc.Call(bed.Request{Op: "loop_start", ID: "loop", Addr: target.String(), Interval: r.cfg.Interval, Timeout: r.cfg.DialTimeout}); err != nil {
		return nil, fmt.Errorf("starting client %s: %w", name, err)
	}
	return &loopClient{name: name, target: target, proc: proc}, nil
}

func (l *loopClient) stop() (ClientResult, error) {
	resp, err := l.proc.Call(bed.Request{Op: "loop_stop", ID: "loop"})
	if err != nil {
		return ClientResult{}, fmt.Errorf("stopping client %s: %w", l.name, err)
	}
	c := ClientResult{Name: l.name, Target: l.target.String(), OK: resp.OK, Fails: map[string]int{}, Last: map[string]time.Time{}}
	for k, v := range resp.Fails {
		c.Fails[k] = v
	}
	for k, v := range resp.Last {
		c.Last[k] = time.Unix(0, v)
	}
	return c, nil
}

// keepAlive sends a request every KeepAliveEvery on one connection through
// the ClusterIP, replacing it after KeepAliveMaxAge (after a response: a
// clean close). A request that fails, or a reconnect that fails, counts
// as a failure; the client then reconnects.
type keepAlive struct {
	proc                  *bed.Proc
	target                netip.AddrPort
	every, maxAge, dialTO time.Duration
	stopCh                chan struct{}
	done                  chan ClientResult
	once                  sync.Once
	res                   ClientResult
}

func (r *runner) startKeepAlive(target netip.AddrPort) (*keepAlive, error) {
	proc, err := r.addClient("ka")
	if err != nil {
		return nil, err
	}
	k := &keepAlive{proc: proc, target: target, every: r.cfg.KeepAliveEvery, maxAge: r.cfg.KeepAliveMaxAge, dialTO: r.cfg.DialTimeout,
		stopCh: make(chan struct{}), done: make(chan ClientResult, 1)}
	go k.run()
	return k, nil
}

func callClass(resp bed.Response, err error) string {
	if resp.Err != "" {
		return resp.Err
	}
	return "helper: " + err.Error()
}

func (k *keepAlive) run() {
	res := ClientResult{Name: ClientKeepAlive, Target: k.target.String(), Fails: map[string]int{}, Last: map[string]time.Time{}}
	var open bool
	var opened time.Time
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		if !open {
			resp, err := k.proc.Call(bed.Request{Op: "open", ID: "ka", Addr: k.target.String(), Timeout: k.dialTO})
			if err != nil {
				res.Fails[callClass(resp, err)]++
			} else {
				open, opened = true, time.Now()
				res.Last[resp.Server] = opened
			}
		}
		if open {
			resp, err := k.proc.Call(bed.Request{Op: "req", ID: "ka", Timeout: k.dialTO})
			switch {
			case err != nil:
				res.Fails[callClass(resp, err)]++
				k.proc.Call(bed.Request{Op: "close", ID: "ka"})
				open = false
			default:
				res.OK++
				if k.maxAge > 0 && time.Since(opened) >= k.maxAge {
					k.proc.Call(bed.Request{Op: "close", ID: "ka"})
					open = false
				}
			}
		}
		select {
		case <-k.stopCh:
			if open {
				k.proc.Call(bed.Request{Op: "close", ID: "ka"})
			}
			k.done <- res
			return
		case <-t.C:
		}
	}
}

// stop ends the client and returns its tally (once; later calls return
// the same).
func (k *keepAlive) stop() ClientResult {
	k.once.Do(func() {
		close(k.stopCh)
		k.res = <-k.done
	})
	return k.res
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
