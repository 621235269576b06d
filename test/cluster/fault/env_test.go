package fault

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/draindbin"
	"github.com/draind/draind/test/cluster/e2e"
	"github.com/draind/draind/test/cluster/headline"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// Knobs, read from the environment so that a longer soak or a shorter CI
// run needs no code change.
const (
	// EnvRestarts is the number of kill -9 + restart rounds of
	// TestFaultRestartLoop (default 10).
	EnvRestarts = "DRAIND_FAULT_RESTARTS"
	// EnvOutage is how long TestFaultAPIOutage keeps kube-apiserver down
	// (default 25s; at least twice the drain Lease duration of 10s).
	EnvOutage = "DRAIND_FAULT_OUTAGE"
	// EnvSeed seeds the random instants of the restart loop (default: the
	// clock; the test prints the seed it used).
	EnvSeed = "DRAIND_FAULT_SEED"
	// EnvTolerance is added to the one-second bounds (default
	// defaultTolerance, see there).
	EnvTolerance = "DRAIND_FAULT_TOLERANCE"
)

// defaultTolerance is what the measurement itself may add to a figure held
// to the one-second bound: the instant the API server is back is
// known to within one /readyz poll (readyPoll), a pinned-map change to
// within one poll of the maps (mapPoll), a steered connection to within one
// probe interval (probeEvery) plus the probe's own round trip — 40 ms in
// all — and on a shared two-core machine (go test runs the packages of the
// module in parallel, each with its own control plane) a poller can be
// descheduled for tens of milliseconds more. 150 ms covers that; a real
// regression (a resync period, a backoff, a full pass) is seconds.
const defaultTolerance = 150 * time.Millisecond

// Poll intervals of the measurements.
const (
	readyPoll  = 10 * time.Millisecond // kube-apiserver /readyz after a restart
	mapPoll    = 10 * time.Millisecond // pinned maps
	probeEvery = 20 * time.Millisecond // one new connection per client
)

// Ports of every bed Service: ClusterIP port → pods' server port.
const (
	svcPort    = 80
	serverPort = 8080
)

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a non-negative integer", name, s)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		t.Fatalf("%s=%q: want a duration such as 25s", name, s)
	}
	return d
}

// tolerance is the slack added to the one-second bounds.
func tolerance(t *testing.T) time.Duration { return envDuration(t, EnvTolerance, defaultTolerance) }

// --- the shared control plane ------------------------------------------------

// sharedEnv is one control plane for every test of the binary (starting one
// takes seconds on two cores), with draind's RBAC applied and draind built.
// Each test has its own namespace, nodes (bed namespaces with kube-proxy),
// daemons and Leases, and removes them.
type sharedEnv struct {
	kc     *kube.Cluster
	draind string // binary
	dir    string // draind binary, per-test logs
	keep   bool
}

var shared struct {
	sync.Mutex
	env *sharedEnv
	err error
}

// controlPlane returns the shared control plane, starting it on first use.
// It skips (with the reason) unless privileged tests may run.
func controlPlane(t *testing.T) *sharedEnv {
	t.Helper()
	bed.RequirePrivileged(t)
	shared.Lock()
	defer shared.Unlock()
	if shared.env != nil {
		if err := shared.env.kc.Healthy(); err != nil {
			t.Fatalf("the shared control plane is broken (by an earlier test?): %v", err)
		}
		return shared.env
	}
	if shared.err != nil {
		t.Fatalf("the shared control plane failed to start in an earlier test: %v", shared.err)
	}
	bins := kube.Binaries(t) // builds them (PRIVILEGED_TESTS=1) or skips
	start := time.Now()
	env, err := startShared(bins)
	if err != nil {
		shared.err = err
		t.Fatalf("starting the shared control plane: %v", err)
	}
	t.Logf("shared control plane (kube-apiserver, EndpointSlice controller %s) ready and draind built in %v",
		bins.Version, time.Since(start).Round(time.Millisecond))
	shared.env = env
	return env
}

func startShared(bins *kubebin.Set) (_ *sharedEnv, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	env := &sharedEnv{}
	if d := os.Getenv(kube.EnvKeepDir); d != "" {
		env.dir, err = os.MkdirTemp(d, "fault-")
		env.keep = true
	} else {
		env.dir, err = os.MkdirTemp("", "draind-fault-")
	}
	if err != nil {
		return nil, fmt.Errorf("creating the tests' directory: %w", err)
	}
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	cfg := kube.Config{Binaries: bins, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	if env.keep {
		cfg.Dir = filepath.Join(env.dir, "cluster")
		if err := os.Mkdir(cfg.Dir, 0o755); err != nil {
			return nil, err
		}
	}
	if env.kc, err = kube.Start(ctx, cfg); err != nil {
		return nil, err
	}
	if err := headline.ApplyRBAC(ctx, env.kc.Admin); err != nil {
		return nil, err
	}
	if env.draind, err = draindbin.Build(ctx, env.dir); err != nil {
		return nil, err
	}
	return env, nil
}

func (e *sharedEnv) close() error {
	var errs []error
	if e.kc != nil {
		errs = append(errs, e.kc.Stop())
	}
	if !e.keep && e.dir != "" {
		errs = append(errs, os.RemoveAll(e.dir))
	}
	return errors.Join(errs...)
}

// closeShared stops the shared control plane (TestMain, after the tests).
func closeShared() error {
	shared.Lock()
	defer shared.Unlock()
	if shared.env == nil {
		return nil
	}
	err := shared.env.close()
	shared.env = nil
	return err
}

// --- one test's cluster ----------------------------------------------------------

// fixture is one test's part of the cluster: a namespace, bed nodes joined
// to the control plane (kube-proxy and a kubelet stand-in on each), draind
// per node, and the clients. Cleanup removes all of it, Leases included,
// so the next test (whose bed hands out the same addresses) starts clean.
type fixture struct {
	t       *testing.T
	env     *sharedEnv
	ctx     context.Context
	ns      string
	dir     string
	bed     *bed.Bed
	nodes   map[string]*e2e.Node
	daemons map[string]*headline.Draind
	logs    []string // draind logs, tails printed on failure
	// nodeBound: each draind's token is bound to a Pod on its node, so
	// the Lease policy applies to it (useLeasePolicy).
	nodeBound bool
}

// newFixture creates the namespace and the nodes, named prefix-<name>.
func newFixture(t *testing.T, prefix string, names ...string) *fixture {
	t.Helper()
	env := controlPlane(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	f := &fixture{t: t, env: env, ctx: ctx, nodes: map[string]*e2e.Node{}, daemons: map[string]*headline.Draind{}}
	t.Cleanup(cancel)
	b, err := bed.New()
	if err != nil {
		t.Fatalf("creating the bed: %v", err)
	}
	f.bed = b
	f.ns = prefix + "-" + b.ID
	f.dir = filepath.Join(env.dir, prefix+"-"+b.ID)
	if err := os.Mkdir(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	admin := env.kc.Admin

	// Cleanup runs last-registered first: daemons (registered as they
	// start), then API objects, kube-proxies, the bed, the Node objects.
	var nodeNames []string
	t.Cleanup(func() {
		for _, n := range nodeNames {
			if err := admin.CoreV1().Nodes().Delete(context.Background(), n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting node %s: %v", n, err)
			}
		}
	})
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("closing the bed: %v", err)
		}
	})
	t.Cleanup(func() {
		for _, n := range f.nodes {
			if err := n.Kube.Stop(); err != nil {
				t.Errorf("stopping kube-proxy on %s: %v", n.Kube.Name, err)
			}
		}
	})
	t.Cleanup(func() { f.clearAPI() })
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, path := range f.logs {
			t.Logf("--- last lines of %s:\n%s", path, tail(path, 40))
		}
		if env.kc.Healthy() == nil {
			return // the components' logs say nothing about draind
		}
		tails := env.kc.LogTails(20)
		names := make([]string, 0, len(tails))
		for n := range tails {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			t.Logf("--- last lines of %s:\n%s", n, tails[n])
		}
	})

	// Every bed hands out the same pod addresses: an earlier test's slice
	// or Lease still naming one would be a claim on (or a drain of) it.
	sweepOrphanSlices(ctx, t, admin)
	if sl, err := admin.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing endpointslices: %v", err)
	} else {
		for _, s := range sl.Items {
			for _, e := range s.Endpoints {
				if len(e.Addresses) > 0 {
					t.Fatalf("endpointslice %s/%s of an earlier test still lists %v: its cleanup failed", s.Namespace, s.Name, e.Addresses)
				}
			}
		}
	}
	if ls, err := admin.CoordinationV1().Leases(headline.DraindNamespace).List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("listing leases: %v", err)
	} else if len(ls.Items) > 0 {
		t.Fatalf("lease %s of an earlier test is still there: its cleanup failed", ls.Items[0].Name)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", f.ns, err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := env.kc.WaitServiceAccount(wctx, f.ns, "default"); err != nil {
		t.Fatalf("waiting for namespace %s's default serviceaccount: %v", f.ns, err)
	}
	for _, name := range names {
		full := prefix + "-" + name
		n, err := e2e.AddNode(ctx, env.kc, b, full)
		if err != nil {
			t.Fatalf("adding node %s: %v", full, err)
		}
		nodeNames = append(nodeNames, full)
		f.nodes[name] = n
	}
	return f
}

// clearAPI deletes the test's Services, their EndpointSlices, its pods
// (grace 0: no kubelet hook) and every drain Lease. The bed runs no garbage
// collector: a deleted Service's slices stay unless deleted here, and a
// stale slice listing an address as a ready endpoint of some pod is, to
// every draind of a later test (whose bed hands out the same addresses),
// that pod's claim on the IP.
func (f *fixture) clearAPI() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := f.env.kc.Admin
	if svcs, err := admin.CoreV1().Services(f.ns).List(ctx, metav1.ListOptions{}); err != nil {
		f.t.Errorf("listing the services of %s: %v", f.ns, err)
	} else {
		for _, s := range svcs.Items {
			if err := admin.CoreV1().Services(f.ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				f.t.Errorf("deleting service %s/%s: %v", f.ns, s.Name, err)
			}
		}
	}
	zero := int64(0)
	if err := admin.CoreV1().Pods(f.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{}); err != nil {
		f.t.Errorf("deleting the pods of %s: %v", f.ns, err)
	}
	// The EndpointSlice controller may still be writing a slice of a
	// Service it has not yet seen deleted: delete until none is left.
	slices := admin.DiscoveryV1().EndpointSlices(f.ns)
	for {
		if err := slices.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			f.t.Errorf("deleting the endpointslices of %s: %v", f.ns, err)
			break
		}
		time.Sleep(200 * time.Millisecond)
		l, err := slices.List(ctx, metav1.ListOptions{})
		if err != nil {
			f.t.Errorf("listing the endpointslices of %s: %v", f.ns, err)
			break
		}
		if len(l.Items) == 0 {
			break
		}
	}
	if err := admin.CoordinationV1().Leases(headline.DraindNamespace).DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{LabelSelector: k8s.LabelDrain}); err != nil { // drains and claims
		f.t.Errorf("deleting drain leases: %v", err)
	}
}

// startDraind starts draind on node name with extra flags, ready.
func (f *fixture) startDraind(name string, args ...string) *headline.Draind {
	f.t.Helper()
	n := f.nodes[name]
	kubeconfig := filepath.Join(f.dir, "draind-"+n.Bed.Name+".kubeconfig")
	write := headline.WriteDraindKubeconfig
	if f.nodeBound {
		write = f.writeNodeBoundKubeconfig // reuseacross_test.go
	}
	if err := write(f.ctx, f.env.kc, n.Kube, kubeconfig); err != nil {
		f.t.Fatal(err)
	}
	d, err := headline.StartDraind(f.ctx, headline.DraindOptions{
		Binary: f.env.draind, Node: n.Bed, Kubeconfig: kubeconfig, Dir: f.dir, Args: args,
	})
	if err != nil {
		f.t.Fatalf("starting draind on %s: %v", n.Bed.Name, err)
	}
	f.logs = append(f.logs, d.LogPath())
	// Against a real kube-apiserver draind decodes the EndpointSlice watch
	// itself (k8s/slicecodec.go); it says so once synced.
	if c, err := countLog(d.LogPath(), "endpointslice_decoding=slim"); err != nil || c == 0 {
		f.t.Errorf("draind on %s does not decode the EndpointSlice watch itself (%v); last lines of its log:\n%s", n.Bed.Name, err, tail(d.LogPath(), 20))
	}
	f.t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			f.t.Errorf("%v", err)
		}
	})
	f.daemons[name] = d
	return d
}

// service creates an IPv4 ClusterIP Service (port 80 → 8080) selecting
// app=name and returns its ClusterIP:port.
func (f *fixture) service(name string) netip.AddrPort {
	f.t.Helper()
	single := corev1.IPFamilyPolicySingleStack
	svc, err := f.env.kc.Admin.CoreV1().Services(f.ns).Create(f.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name}, IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(serverPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating service %s/%s: %v", f.ns, name, err)
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		f.t.Fatalf("service %s/%s: clusterIP %q: %v", f.ns, name, svc.Spec.ClusterIP, err)
	}
	return netip.AddrPortFrom(vip, svcPort)
}

// headlessService creates a headless IPv4 Service (port 8080) selecting
// app=name.
func (f *fixture) headlessService(name string) {
	f.t.Helper()
	single := corev1.IPFamilyPolicySingleStack
	_, err := f.env.kc.Admin.CoreV1().Services(f.ns).Create(f.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app": name},
			IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: serverPort, TargetPort: intstr.FromInt32(serverPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatalf("creating headless service %s/%s: %v", f.ns, name, err)
	}
}

// pod starts a pod with app=app on node (its server greets with name).
func (f *fixture) pod(node, name, app string) *e2e.Pod {
	f.t.Helper()
	p, err := f.nodes[node].StartPod(f.ctx, f.ns, name, map[string]string{"app": app}, serverPort)
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// client starts a client helper in a bed pod of node (no Pod object).
func (f *fixture) client(node string) *e2e.Client {
	f.t.Helper()
	c, err := f.nodes[node].StartClient("client-" + node)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// watchReady watches the Service's slices and waits until they list
// exactly the pods (IPv4), all ready.
func (f *fixture) watchReady(svc string, pods ...*e2e.Pod) *kube.EndpointsWatch {
	f.t.Helper()
	w, err := kube.WatchEndpoints(f.ctx, f.env.kc.Admin, f.ns, svc)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	var addrs []netip.Addr
	for _, p := range pods {
		addrs = append(addrs, p.Bed.IP4)
	}
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	if _, err := w.WaitReady(ctx, addrs...); err != nil {
		// The EndpointSlice controller writes them: say what it logged.
		f.t.Fatalf("waiting for %d ready endpoints of %s: %v\n--- last lines of kube-controller-manager:\n%s",
			len(pods), svc, err, f.env.kc.LogTails(30)[kubebin.ControllerManager])
	}
	return w
}

// waitProgrammed waits until kube-proxy on every node balances vip over
// exactly the pods.
func (f *fixture) waitProgrammed(vip netip.AddrPort, pods ...*e2e.Pod) {
	f.t.Helper()
	var want []netip.AddrPort
	for _, p := range pods {
		want = append(want, p.Addr(corev1.IPv4Protocol))
	}
	slices.SortFunc(want, netip.AddrPort.Compare)
	sp := kube.ServicePort{IP: vip.Addr(), Port: vip.Port(), Protocol: corev1.ProtocolTCP}
	for _, n := range f.nodes {
		ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
		_, err := n.Kube.WaitRules(ctx, corev1.IPv4Protocol, func(r *kube.Rules) bool {
			got := slices.Clone(r.Endpoints(sp))
			slices.SortFunc(got, netip.AddrPort.Compare)
			return slices.Equal(got, want)
		})
		cancel()
		if err != nil {
			f.t.Fatalf("waiting for kube-proxy on %s to balance %s over %v: %v", n.Kube.Name, vip, want, err)
		}
	}
}

// reaches dials addr count times from c and fails the test unless every
// connection succeeded and each of want answered at least once; it returns
// the answers by pod.
func (f *fixture) reaches(c *e2e.Client, addr netip.AddrPort, count int, want ...string) map[string]int {
	f.t.Helper()
	resp, err := c.Dial(addr, count)
	if err != nil {
		f.t.Fatal(err)
	}
	if len(resp.Fails) > 0 || resp.OK != count {
		f.t.Fatalf("client %s → %s: %d of %d ok, failures %v", c.Pod.Name, addr, resp.OK, count, resp.Fails)
	}
	for _, w := range want {
		if resp.By[w] == 0 {
			f.t.Fatalf("client %s → %s: %s never answered in %d connections (answers %v)", c.Pod.Name, addr, w, count, resp.By)
		}
	}
	return resp.By
}

// --- the pods' offline call --------------------------------------------------

// offline calls draind's /v1/offline from inside the pod's network
// namespace (so its source address is the pod's IP, as a preStop's curl to
// $HOST_IP would be) and returns the status code and body.
func offline(ctx context.Context, p *e2e.Pod, d *headline.Draind, query string) (int, string, error) {
	hc := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := p.Bed.NS.Do(func() (err error) {
				c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}}
	url := "http://" + d.OfflineAddr().String() + "/v1/offline"
	if query != "" {
		url += "?" + query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", fmt.Errorf("offline call of pod %s: %w", p.Name, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// --- the pinned maps -------------------------------------------------------------

// pinned reads a daemon's pinned maps, as `draind bpf dump` does (works
// while the daemon is down).
func pinned(d *headline.Draind) (*bpf.Dump, error) {
	p, err := bpf.OpenPinned(d.PinDir())
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return p.Dump()
}

// liveDrains are the unexpired drain entries for ip (any port, protocol):
// the BPF programs ignore expired entries.
func liveDrains(dm *bpf.Dump, ip netip.Addr, now time.Time) []bpf.Drain {
	var out []bpf.Drain
	for _, d := range dm.Drains {
		if d.Key.Addr == ip && d.Expires.After(now) {
			out = append(out, d)
		}
	}
	return out
}

// liveFrontend reports whether vip has an unexpired, steering frontend.
func liveFrontend(dm *bpf.Dump, vip netip.AddrPort, now time.Time) bool {
	for _, fe := range dm.Frontends {
		if fe.Key.Addr == vip.Addr() && fe.Key.Port == vip.Port() && fe.Key.Proto == bpf.TCP && !fe.NoSteer && fe.Expires.After(now) {
			return true
		}
	}
	return false
}

// steering reports whether d's maps steer connections to vip away from
// ip: a live frontend for vip and a live drain entry for ip.
func steering(d *headline.Draind, vip netip.AddrPort, ip netip.Addr) (bool, error) {
	dm, err := pinned(d)
	if err != nil {
		return false, err
	}
	now := time.Now()
	return liveFrontend(dm, vip, now) && len(liveDrains(dm, ip, now)) > 0, nil
}

// waitSteering waits until every daemon steers vip away from ip.
func (f *fixture) waitSteering(vip netip.AddrPort, ip netip.Addr, within time.Duration) {
	f.t.Helper()
	deadline := time.Now().Add(within)
	for name, d := range f.daemons {
		for {
			ok, err := steering(d, vip, ip)
			if ok {
				break
			}
			if time.Now().After(deadline) {
				f.t.Fatalf("draind on %s does not steer %s away from %s after %v (last error %v)", name, vip, ip, within, err)
			}
			time.Sleep(mapPoll)
		}
	}
}

// --- traffic -------------------------------------------------------------------------

// probe is one new connection: when it was opened, who answered it (the
// pod's name) or how it failed.
type probe struct {
	at     time.Time
	server string
	fail   string
}

// prober opens one new connection to addr every probeEvery from a client
// pod (each one connect, read the greeting, close), recording every one.
type prober struct {
	name string
	c    *e2e.Client
	addr netip.AddrPort
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	probes []probe
	err    error
}

func startProber(name string, c *e2e.Client, addr netip.AddrPort) *prober {
	p := &prober{name: name, c: c, addr: addr, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p
}

func (p *prober) run() {
	defer close(p.done)
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		at := time.Now()
		resp, err := p.c.Proc.Call(bed.Request{Op: "dial", Addr: p.addr.String(), N: 1, Timeout: time.Second})
		if err != nil {
			p.mu.Lock()
			p.err = err
			p.mu.Unlock()
			return
		}
		pr := probe{at: at}
		for name := range resp.By {
			pr.server = name
		}
		for class := range resp.Fails {
			pr.fail = class
		}
		p.mu.Lock()
		p.probes = append(p.probes, pr)
		p.mu.Unlock()
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

// Stop ends the probing and returns an error if the client broke.
func (p *prober) Stop() error {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return fmt.Errorf("prober %s → %s: %w", p.name, p.addr, p.err)
	}
	return nil
}

// between returns the probes opened in [from, to).
func (p *prober) between(from, to time.Time) []probe {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []probe
	for _, pr := range p.probes {
		if !pr.at.Before(from) && pr.at.Before(to) {
			out = append(out, pr)
		}
	}
	return out
}

// tally counts probes by answering pod ("!class" for failures).
func tally(ps []probe) map[string]int {
	out := map[string]int{}
	for _, p := range ps {
		if p.fail != "" {
			out["!"+p.fail]++
		} else {
			out[p.server]++
		}
	}
	return out
}

// fmtTally renders a tally sorted by key.
func fmtTally(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, m[k])
	}
	return b.String()
}

// --- logs ------------------------------------------------------------------------------

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// countLog counts the lines of a log file containing s.
func countLog(path, s string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strings.Count(string(b), s), nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// sweepOrphanSlices deletes slices whose Service is gone until none comes
// back for 2 s (at most 30 s). An earlier test's cleanup deletes its slices,
// but the EndpointSlice controller may write one again for a Service it has
// not yet seen deleted (its watch reconnects with a backoff after an API
// server restart). Slices of live Services are left to the check that
// follows.
func sweepOrphanSlices(ctx context.Context, t *testing.T, admin kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	quietSince := time.Now()
	for time.Since(quietSince) < 2*time.Second && time.Now().Before(deadline) {
		sl, err := admin.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing endpointslices: %v", err)
		}
		for _, s := range sl.Items {
			svc := s.Labels[discoveryv1.LabelServiceName]
			if svc == "" {
				continue
			}
			if _, err := admin.CoreV1().Services(s.Namespace).Get(ctx, svc, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				continue
			}
			if err := admin.DiscoveryV1().EndpointSlices(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("deleting orphaned endpointslice %s/%s: %v", s.Namespace, s.Name, err)
			}
			t.Logf("deleted endpointslice %s/%s: written again after its Service was deleted", s.Namespace, s.Name)
			quietSince = time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
}
