package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/nodeapi"
)

// DefaultStatusSocket is where the daemon serves status.
const DefaultStatusSocket = "/run/draind/draind.sock"

type runOptions struct {
	node, namespace, kubeconfig string
	pinDir, cgroupPath          string
	offlineAddr, metricsAddr    string
	statusSocket                string
	cfg                         daemon.Config // the daemon's settings, bound to their flags
	registryOnlyPolicy          string
	conntrack                   bool
	socketHooks                 bool
	conntrackZone               uint16
	logFormat, logLevel         string
	procs                       int

	flags *pflag.FlagSet // for status: every flag's value
}

// configInForce lists every flag of fs with the value in force, sorted by
// name: the daemon's settings as the daemon holds them (in), --procs as
// the Ps the runtime runs on (procs), the others as given, from the
// environment, or their default.
func configInForce(fs *pflag.FlagSet, in daemon.Config, procs int) []daemon.ConfigEntry {
	daemonSet := map[string]string{}
	for _, e := range in.Entries() {
		daemonSet[e.Name] = e.Value
	}
	var out []daemon.ConfigEntry
	fs.VisitAll(func(f *pflag.Flag) {
		v := f.Value.String()
		switch {
		case f.Name == "help":
			return
		case f.Name == "procs":
			v = strconv.Itoa(procs)
		case daemonSet[f.Name] != "":
			v = daemonSet[f.Name]
		}
		out = append(out, daemon.ConfigEntry{Name: f.Name, Value: v})
	})
	return out
}

func newRunCmd() *cobra.Command { return runCmd(&runOptions{}) }

// runCmd is `draind run` with its flags bound to o.
func runCmd(o *runOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run the node daemon (the DaemonSet's command)",
		Long: `Run the node daemon: watch EndpointSlices, Services, drain Leases and this
node's pods; steer new connections away from draining pods with the
connect4/connect6 hooks; count what still reaches the pods of this node; answer
their /v1/offline calls; expire stale conntrack flows; serve metrics and status.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.procs = procsWanted(cmd.Flags(), o.procs)
			o.flags = cmd.Flags()
			return runDaemon(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.node, "node-name", "", "name of this node (required; the downward API's spec.nodeName)")
	f.StringVar(&o.namespace, "namespace", "draind-system", "namespace of the drain Leases (draind's own)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&o.pinDir, "bpffs-dir", bpf.DefaultPinDir, "bpffs directory for pinned maps and links")
	f.StringVar(&o.cgroupPath, "cgroup-path", "", "cgroup v2 directory to hook: the pods' cgroup (default: kubepods.slice or kubepods under the cgroup2 mount)")
	f.StringVar(&o.offlineAddr, "offline-addr", fmt.Sprintf(":%d", nodeapi.DefaultPort), "listen address of the node-local offline API (/v1/offline, /v1/online, /healthz, /readyz)")
	f.StringVar(&o.metricsAddr, "metrics-addr", ":9461", "listen address of /metrics (empty: off)")
	f.StringVar(&o.statusSocket, "status-socket", DefaultStatusSocket, "unix socket for draind status (root-only)")
	o.cfg = daemon.DefaultConfig()
	for _, s := range o.cfg.Settings() {
		switch {
		case s.Dur != nil:
			f.DurationVar(s.Dur, s.Flag, *s.Dur, s.Usage)
		case s.Int != nil:
			f.IntVar(s.Int, s.Flag, *s.Int, s.Usage)
		default:
			f.Float32Var(s.Float, s.Flag, *s.Float, s.Usage)
		}
	}
	f.StringVar(&o.registryOnlyPolicy, "registry-only-policy", "refuse", "pod-IP policy for drained pods no EndpointSlice lists: refuse or off")
	f.BoolVar(&o.conntrack, "conntrack", true, "expire stale conntrack flows and count live connections")
	f.BoolVar(&o.socketHooks, "socket-hooks", true, "count live connections from the pods' sockets and end client sockets to gone pods (sock_ops and cgroup_skb egress; used where the kernel has them)")
	f.Uint16Var(&o.conntrackZone, "conntrack-zone", 0, "conntrack zone of the pods' flows: expiry and counting act only there")
	f.IntVar(&o.procs, "procs", daemon.DefaultProcs, "CPUs the Go runtime runs draind on (GOMAXPROCS; 0: the runtime's default, the node's CPUs or the container's CPU limit, or GOMAXPROCS if set): one serial pipeline carries every update, and more only move it between threads")
	f.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	withEnv(cmd)
	return cmd
}

// procsWanted is --procs, unless neither it nor its environment variable
// was given and GOMAXPROCS was (a count the runtime takes): the runtime's
// own variable is kept (0).
func procsWanted(fs *pflag.FlagSet, n int) int {
	if v, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); !fs.Changed("procs") && err == nil && v > 0 {
		return 0
	}
	return n
}

// setProcs sets GOMAXPROCS to n (0: leaves the runtime's choice).
func setProcs(n int) error {
	if n < 0 {
		return fmt.Errorf("--procs: want 0 (the runtime's default) or more, got %d", n)
	}
	if n > 0 {
		runtime.GOMAXPROCS(n)
	}
	return nil
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		// Outside a cluster, fall back to the usual kubeconfig rules.
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, nil).ClientConfig()
	}
	return cfg, nil
}

// runDaemon checks the node, binds every listener, loads and attaches the
// datapath, then runs the daemon and its servers until ctx ends. Listeners
// are bound before anything runs, and the maps are closed only after
// everything that uses them has stopped.
func runDaemon(ctx context.Context, o *runOptions) error {
	started := time.Now()
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	// client-go logs through klog: send it to the same structured log.
	klog.SetSlogLogger(log.With("component", "client-go"))
	if o.node == "" {
		return errors.New("--node-name is required (set it from the downward API: spec.nodeName)")
	}
	if err := o.cfg.Validate(); err != nil {
		return err
	}
	if err := setProcs(o.procs); err != nil {
		return err
	}
	regPolicy, err := bpf.ParsePolicy(o.registryOnlyPolicy)
	if err != nil || regPolicy == bpf.PolicyRewrite {
		return fmt.Errorf("--registry-only-policy: want refuse or off, got %q", o.registryOnlyPolicy)
	}
	features, err := bpf.Probe()
	if err != nil {
		return fmt.Errorf("checking the kernel: %w", err)
	}
	cgroup := o.cgroupPath
	if cgroup == "" {
		if cgroup, err = bpf.FindPodsCgroup(features.Cgroup2); err != nil {
			return err
		}
	}
	client, restCfg, err := apiClient(o)
	if err != nil {
		return err
	}
	ls, err := bindListeners(o)
	if err != nil {
		return err
	}
	defer ls.close()
	dp, err := bpf.Load(bpf.Options{PinDir: o.pinDir, Sockets: socketHooks(o, features, log)})
	if err != nil {
		return err
	}
	// Close keeps the pins: steering goes on while draind restarts.
	defer dp.Close()
	if n, err := dp.Prune(); err != nil {
		log.Warn("pruning pinned maps", "err", err)
	} else if n > 0 {
		log.Info("pruned orphaned map entries", "entries", n)
	}
	ct, ctStatus := openConntrack(o, log)
	flows, closeConntrack := flowLister(o, ct, log)
	defer closeConntrack()
	cfg := o.cfg
	cfg.Node, cfg.Namespace, cfg.Version = o.node, o.namespace, version
	cfg.RegistryOnlyPolicy, cfg.Logger, cfg.FlowLister, cfg.REST = regPolicy, log, flows, restCfg
	d, err := daemon.New(cfg, client, dp, ct)
	if err != nil {
		return err
	}
	d.Metrics.RegisterKernelFeatures(features.KernelFeatures)
	if err := dp.Attach(cgroup); err != nil {
		return err
	}
	d.SetAttached(true)
	log.Info("programs attached", "cgroup", cgroup, "kernel", features.Kernel, "pin_dir", o.pinDir)
	err = serve(ctx, o, d, ls, daemon.StatusSource{Features: features, Attached: dp.Attached, Cgroup: cgroup,
		PinDir: o.pinDir, Conntrack: ctStatus, Config: configInForce(o.flags, d.Config(), runtime.GOMAXPROCS(0)), Started: started})
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("stopped; pinned steering stays until its entries expire", "entry_ttl", o.cfg.EntryTTL.String())
	return nil
}

// socketHooks says whether the socket hooks load, and logs each kernel
// feature that is off.
func socketHooks(o *runOptions, features bpf.Features, log *slog.Logger) bool {
	if o.socketHooks && !features.Sockets {
		log.Warn("socket hooks unavailable: live connections from conntrack only, sockets to gone pods are not ended", "missing", features.SocketsMissing)
	}
	for _, f := range features.KernelFeatures {
		if !f.On {
			log.Warn("kernel feature off", "feature", f.Name, "kernel", features.Kernel, "reason", f.Reason)
		}
	}
	return o.socketHooks && features.Sockets
}

// flowLister opens a conntrack handle of its own for listing a gone pod's
// client flows, so an expiry pass on ct never delays ending their sockets;
// closeAll closes it and ct. Without ct there is none.
func flowLister(o *runOptions, ct conntrack.Interface, log *slog.Logger) (flows conntrack.FlowLister, closeAll func()) {
	if ct == nil {
		return nil, func() {}
	}
	fl, err := conntrack.Open(conntrack.Options{Zone: o.conntrackZone})
	if err != nil {
		log.Warn("a second conntrack handle for gone pods' client flows: sharing the first", "err", err)
		return nil, func() { ct.Close() }
	}
	return fl, func() { fl.Close(); ct.Close() }
}

// apiClient builds the API client from the kubeconfig or the pod's
// ServiceAccount.
func apiClient(o *runOptions) (kubernetes.Interface, *rest.Config, error) {
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return nil, nil, fmt.Errorf("loading the API client configuration: %w", err)
	}
	cfg.QPS, cfg.Burst = o.cfg.APIQPS, o.cfg.APIBurst
	cfg.UserAgent = "draind/" + version
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the API client: %w", err)
	}
	return client, cfg, nil
}

// openConntrack opens conntrack in this network namespace, or returns nil
// (with a warning, and the reason for status) when it is off or
// unavailable.
func openConntrack(o *runOptions, log *slog.Logger) (conntrack.Interface, daemon.ConntrackStatus) {
	if !o.conntrack {
		return nil, daemon.ConntrackStatus{Reason: "--conntrack=false"}
	}
	nl, err := conntrack.Open(conntrack.Options{Zone: o.conntrackZone})
	if err != nil {
		log.Warn("conntrack unavailable: no flow expiry, live connections not counted", "err", err)
		return nil, daemon.ConntrackStatus{Reason: "unavailable: " + err.Error()}
	}
	if !nl.Timestamps() {
		log.Warn("conntrack timestamps are off (net.netfilter.nf_conntrack_timestamp): flows of a reused pod IP are then never expired")
	}
	return nl, daemon.ConntrackStatus{Enabled: true, Timestamps: nl.Timestamps()}
}

// listeners are bound before anything runs: a port in use stops draind
// before it touches the datapath.
type listeners struct {
	offline, metrics net.Listener // nil: off
}

func bindListeners(o *runOptions) (*listeners, error) {
	ls := &listeners{}
	var err error
	if o.offlineAddr != "" {
		if ls.offline, err = net.Listen("tcp", o.offlineAddr); err != nil {
			return nil, fmt.Errorf("listening for the offline API on %s: %w", o.offlineAddr, err)
		}
	}
	if o.metricsAddr != "" {
		if ls.metrics, err = net.Listen("tcp", o.metricsAddr); err != nil {
			ls.close()
			return nil, fmt.Errorf("listening for metrics on %s: %w", o.metricsAddr, err)
		}
	}
	return ls, nil
}

func (ls *listeners) close() {
	for _, l := range []net.Listener{ls.offline, ls.metrics} {
		if l != nil {
			l.Close()
		}
	}
}

// serve runs the daemon and its servers until ctx ends or one fails, and
// returns once all of them stopped.
func serve(ctx context.Context, o *runOptions, d *daemon.Daemon, ls *listeners, src daemon.StatusSource) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(gctx) })
	if ls.offline != nil {
		g.Go(func() error { return d.API().Serve(gctx, ls.offline) })
	}
	if ls.metrics != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(d.Metrics.Registry, promhttp.HandlerOpts{}))
		g.Go(func() error { return nodeapi.Serve(gctx, nodeapi.BoundedServer(mux), ls.metrics) })
	}
	if o.statusSocket != "" {
		g.Go(func() error {
			return daemon.ServeStatus(gctx, o.statusSocket, func() daemon.Status { return d.Status(src) })
		})
	}
	return g.Wait()
}
