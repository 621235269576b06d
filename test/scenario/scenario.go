// Package scenario is draind's headline workload and its measurements: a
// rolling replacement of a Service's pods while clients on another node keep
// opening connections — through the ClusterIP, straight to a pod IP from a
// stale registry cache, and over one long-lived keep-alive connection.
// Every figure comes from real connections between network-namespace pods
// (test/bed).
//
// Who plays Kubernetes is behind ControlPlane: the embedded control plane of
// `draind-demo` (package embedded: an in-process fake API, stand-ins for the
// EndpointSlice controller, kube-proxy and the kubelet, the real daemon in
// process) or the real kube-apiserver, EndpointSlice controller and
// kube-proxy of test/cluster.
//
// Words are defined in the repository's docs/glossary.md.
package scenario

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/test/bed"
)

// PreStop is what a variant's pods run before they are stopped.
type PreStop string

const (
	// PreStopNone: the server stops as soon as the pod is deleted.
	PreStopNone PreStop = "none"
	// PreStopSleep: `preStop: sleep` (Config.SleepPreStop).
	PreStopSleep PreStop = "sleep"
	// PreStopOffline: the pod calls draind's /v1/offline?wait= on its node
	// and returns when draind says it is drained.
	PreStopOffline PreStop = "offline"
)

// Variant is one way of running the rollout.
type Variant struct {
	Name    string // baseline, sleep, draind
	PreStop PreStop
	// Draind runs draind on every node.
	Draind bool
	// Load puts the cluster under load while the variant runs (extra
	// Services and EndpointSlice churn); only control planes that support
	// it accept it.
	Load bool
}

// The headline variants.
var (
	Baseline = Variant{Name: "baseline", PreStop: PreStopNone}
	Sleep    = Variant{Name: "sleep", PreStop: PreStopSleep}
	Draind   = Variant{Name: "draind", PreStop: PreStopOffline, Draind: true}
)

// UnderLoad returns the variant with the cluster under load.
func (v Variant) UnderLoad() Variant {
	v.Load = true
	return v
}

// Label names the variant in tables: "draind", "draind+load".
func (v Variant) Label() string {
	if v.Load {
		return v.Name + "+load"
	}
	return v.Name
}

// Namespace is where the variant's objects live (each variant has its own).
func (v Variant) Namespace() string {
	return strings.ReplaceAll(v.Label(), "+", "-")
}

// ParseVariants reads a comma-separated list: baseline, sleep, draind, each
// optionally with "+load".
func ParseVariants(s string) ([]Variant, error) {
	var out []Variant
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		name, load := strings.CutSuffix(f, "+load")
		var v Variant
		switch name {
		case Baseline.Name:
			v = Baseline
		case Sleep.Name:
			v = Sleep
		case Draind.Name:
			v = Draind
		default:
			return nil, fmt.Errorf("unknown variant %q: want baseline, sleep or draind, each optionally +load", f)
		}
		v.Load = load
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no variant in %q", s)
	}
	return out, nil
}

// ServiceSpec is the rollout's Service: ClusterIP, IPv4, one TCP port.
type ServiceSpec struct {
	Namespace, Name string
	Selector        map[string]string
	Port            uint16 // the Service port (name "http")
	TargetPort      uint16 // the pods' port
}

// PodHooks is a pod's life after its graceful deletion, as its node's
// kubelet runs it: PreStop (nil: none), then Ready=false, then Stop (the
// containers exit and the sandbox is removed), then the pod object is
// removed; Gone is told the outcome.
type PodHooks struct {
	PreStop func(context.Context) error
	Stop    func(context.Context) error
	Gone    func(error)
}

// PodSpec is a pod the scenario runs: its bed pod (network namespace and
// server) exists; the control plane registers it.
type PodSpec struct {
	Namespace, Name string
	Node            *bed.Node
	Labels          map[string]string
	Port            uint16
	IPs             []netip.Addr // primary first
	// PreStop is what the pod's manifest would say (documentation in the
	// API object); the kubelet stand-in runs Hooks.PreStop.
	PreStop *corev1.LifecycleHandler
	Hooks   PodHooks
	// Annotations of the pod object (draind variants opt in to pod-IP
	// steering from the deletion on, as draind's webhook does).
	Annotations map[string]string
}

// ControlPlane plays Kubernetes for the scenario: the API, the EndpointSlice
// controller, kube-proxy on every node, the kubelet of every node and,
// in draind variants, draind on every node.
type ControlPlane interface {
	// Describe names the control plane in reports.
	Describe() string
	// ServerNodes host the Service's pods (two); ClientNode hosts the
	// clients.
	ServerNodes() []*bed.Node
	ClientNode() *bed.Node
	// Prepare readies the cluster for a variant (draind running and ready
	// on every node, load); undo reverses what must not outlive it.
	Prepare(ctx context.Context, v Variant) (undo func() error, err error)
	// CreateService creates the Service and returns its ClusterIP:port.
	CreateService(ctx context.Context, s ServiceSpec) (netip.AddrPort, error)
	// RunPod creates the pod object bound to p.Node and reports it running
	// and Ready; its graceful deletion makes the node's kubelet run p.Hooks.
	RunPod(ctx context.Context, p PodSpec) error
	// DeletePod deletes a pod gracefully (a Deployment scaling down).
	DeletePod(ctx context.Context, namespace, name string) error
	// WaitProgrammed waits until the Service data plane of node balances
	// new connections to vip over exactly endpoints.
	WaitProgrammed(ctx context.Context, node *bed.Node, vip netip.AddrPort, endpoints []netip.AddrPort) error
	// Clear removes what a variant left in namespace (its Service and
	// pods) without running any hook.
	Clear(ctx context.Context, namespace string) error
}

// Config holds the workload's parameters.
type Config struct {
	Replicas   int    // the Service's pods (3)
	Port       uint16 // Service port (80)
	TargetPort uint16 // pod port (8080)
	// Interval is the ClusterIP and stale-registry clients' pace: one new
	// connection per request, every Interval (20 ms).
	Interval time.Duration
	// DialTimeout bounds a connect plus the server's greeting (2 s).
	DialTimeout time.Duration
	// KeepAliveEvery is the keep-alive client's request pace (100 ms);
	// KeepAliveMaxAge is how long it keeps a connection before closing it
	// after a response and opening a new one (1 s: connections close
	// promptly, as with HTTP keepalive_requests or gRPC MaxConnectionAge);
	// a negative value keeps it until it breaks.
	KeepAliveEvery  time.Duration
	KeepAliveMaxAge time.Duration
	// Warmup runs the clients before the rollout (1 s).
	Warmup time.Duration
	// Tail keeps every client running after the last old pod is gone: the
	// stale-registry client keeps dialing its pod's IP (60 s).
	Tail time.Duration
	// SleepPreStop is the sleep variant's preStop (5 s).
	SleepPreStop time.Duration
	// OfflineWait is ?wait= of the draind variant's /v1/offline call (30 s);
	// OfflinePort is draind's offline API port on every node IP (9460).
	OfflineWait time.Duration
	OfflinePort uint16
	// Teardown is how long after its server stops a pod's sandbox (its
	// network namespace) is removed and the pod object deleted: the
	// kubelet noticing the exit (PLEG relist, 1 s period) and CNI DEL
	// (500 ms).
	Teardown time.Duration
	Log      *slog.Logger
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Replicas == 0 {
		c.Replicas = 3
	}
	if c.Port == 0 {
		c.Port = 80
	}
	if c.TargetPort == 0 {
		c.TargetPort = 8080
	}
	if c.OfflinePort == 0 {
		c.OfflinePort = 9460
	}
	def(&c.Interval, 20*time.Millisecond)
	def(&c.DialTimeout, 2*time.Second)
	def(&c.KeepAliveEvery, 100*time.Millisecond)
	def(&c.Warmup, time.Second)
	def(&c.Tail, time.Minute)
	def(&c.SleepPreStop, 5*time.Second)
	def(&c.OfflineWait, 30*time.Second)
	def(&c.Teardown, 500*time.Millisecond)
	if c.KeepAliveMaxAge < 0 {
		c.KeepAliveMaxAge = 0
	} else if c.KeepAliveMaxAge == 0 {
		c.KeepAliveMaxAge = time.Second
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
}

// Defaults returns cfg with every unset field at its default.
func Defaults(cfg Config) Config {
	cfg.defaults()
	return cfg
}
