package daemon

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

const ns = "draind"

// Label values known up front; every labelled series is pre-created at zero
// so dashboards and alerts see a 0, not an absent series.
var (
	drainReasons   = []string{k8s.ReasonOffline, k8s.ReasonOperator, k8s.ReasonPodDeleting, model.ReasonTerminating, model.ReasonNotReady, model.ReasonDeparted}
	drainOutcomes  = []string{"drained", "timed_out", "cancelled", "gone"}
	ctProtos       = []string{"tcp", "udp"}
	leaseOps       = []string{"create", "renew", "delete"}
	leaseResults   = []string{"ok", "error", "refused"}
	informerNames  = []string{"endpointslices", "services", "leases", "pods"}
	families       = []string{"ipv4", "ipv6"}
	datapathErrors = []string{"map_full", "other"}
)

// connOutcome maps a BPF outcome to the path/action/reason labels of
// draind_connections_total.
var connOutcome = map[bpf.Outcome][3]string{
	bpf.OutSteeredClusterIP:   {"clusterip", "steered", "draining"},
	bpf.OutSteeredPodIP:       {"podip", "steered", "draining"},
	bpf.OutRefused:            {"podip", "refused", "policy"},
	bpf.OutPassOff:            {"podip", "passthrough", "policy_off"},
	bpf.OutPassNoSteer:        {"clusterip", "passthrough", "no_steer"},
	bpf.OutNoBackendClusterIP: {"clusterip", "passthrough", "no_backend"},
	bpf.OutNoBackendPodIP:     {"podip", "passthrough", "no_backend"},
	bpf.OutExpired:            {"any", "passthrough", "expired"},
}

// Metrics are the daemon's Prometheus metrics.
type Metrics struct {
	Registry *prometheus.Registry

	SignalToDatapath prometheus.Histogram
	// NetworkProgramming: see programming.go.
	NetworkProgramming *prometheus.HistogramVec
	DrainStarts        *prometheus.CounterVec
	DrainOutcomes      *prometheus.CounterVec
	DrainDuration      prometheus.Histogram
	CTExpired          *prometheus.CounterVec
	CTExpiryDuration   prometheus.Histogram
	CTErrors           prometheus.Counter
	DatapathOps        prometheus.Counter
	DatapathErrors     *prometheus.CounterVec
	InformerSynced     *prometheus.GaugeVec
	LeaseOps           *prometheus.CounterVec
	PolicyInvalid      prometheus.Counter
	SteeringReady      prometheus.Gauge
	OfflineRequests    *prometheus.CounterVec
	// OfflineConnsRefused counts connections past the offline API's cap.
	OfflineConnsRefused prometheus.Counter
}

// NewMetrics registers the daemon's metrics; dp may be nil (no datapath
// collector, for tests of the model alone).
func NewMetrics(version string, dp Datapath, inf *k8s.Informers, pods func() []PodStatus) *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		SignalToDatapath: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "signal_to_datapath_seconds",
			Help:    "Time from draind receiving a Kubernetes event (an EndpointSlice before draind decodes it, any other object as its informer takes it decoded) to the datapath update it caused returning.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}}),
		NetworkProgramming: newNetworkProgramming(),
		DrainStarts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "drain_starts_total",
			Help: "Drains started, by reason."}, []string{"reason"}),
		DrainOutcomes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "drain_outcomes_total",
			Help: "Pod drains hosted on this node that ended, by outcome."}, []string{"outcome"}),
		DrainDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "drain_duration_seconds",
			Help:    "Time from a drain's start to the pod being drained (or the wait ending), for pods on this node.",
			Buckets: []float64{.5, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 300, 600}}),
		CTExpired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "conntrack_flows_expired_total",
			Help: "Connection-tracking flows of draining or departed endpoints removed, by protocol."}, []string{"proto"}),
		CTExpiryDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "conntrack_expiry_duration_seconds",
			Help: "Duration of one conntrack expiry pass.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}),
		CTErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "conntrack_errors_total",
			Help: "Conntrack expiry or count passes that failed (retried)."}),
		DatapathOps: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "datapath_operations_total",
			Help: "BPF map writes and deletes issued by the reconciler."}),
		DatapathErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "datapath_errors_total",
			Help: "BPF map operations that failed (retried), by kind."}, []string{"kind"}),
		InformerSynced: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "informer_synced",
			Help: "1 when the informer has synced its cache."}, []string{"informer"}),
		LeaseOps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lease_operations_total",
			Help: "Drain Lease API calls, by operation and result (error: retried within a second; refused: denied or invalid, retried after 1 s doubling to 30 s)."}, []string{"op", "result"}),
		PolicyInvalid: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "policy_annotation_invalid_total",
			Help: "Services whose draind.io/pod-ip-steering annotation has an unknown value (the default is used)."}),
		SteeringReady: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "steering_ready",
			Help: "1 when the programs are attached and the maps follow the API state."}),
		OfflineRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "offline_requests_total",
			Help: "Requests to the node-local offline API, by endpoint and status code."}, []string{"path", "code"}),
		OfflineConnsRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "offline_connections_refused_total",
			Help: "Connections to the offline API answered 503 and closed: the connection cap was reached."}),
	}
	m.precreateLabels()
	r.MustRegister(m.SignalToDatapath, m.NetworkProgramming, m.DrainStarts, m.DrainOutcomes, m.DrainDuration,
		m.CTExpired, m.CTExpiryDuration, m.CTErrors, m.DatapathOps, m.DatapathErrors, m.InformerSynced,
		m.LeaseOps, m.PolicyInvalid, m.SteeringReady, m.OfflineRequests, m.OfflineConnsRefused)
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "build_info",
		Help: "Build information (value 1)."}, []string{"version", "goversion"})
	bi.WithLabelValues(version, runtime.Version()).Set(1)
	r.MustRegister(bi, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if dp != nil {
		r.MustRegister(&datapathCollector{dp: dp, pods: pods})
	}
	if inf != nil {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Name: "informer_malformed_objects_total",
			Help: "API objects that could not be fully converted (skipped fields, bad addresses, malformed drain Leases)."},
			func() float64 { return float64(inf.Malformed.Load()) }))
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "node_names",
			Help: "Node names the informers number once (at 16,384, further names are kept by each slice that names them)."},
			func() float64 { return float64(inf.Nodes.Len()) }))
	}
	return m
}

// datapathCollector reads the BPF counters and map fill levels at scrape
// time, and the per-pod figures of pods drained right now.
type datapathCollector struct {
	dp   Datapath
	pods func() []PodStatus
}

var (
	descConns = prometheus.NewDesc(ns+"_connections_total",
		"connect() calls the hooks acted on, by path (clusterip: a Service VIP; podip: a draining pod IP), action and reason.",
		[]string{"path", "action", "reason", "family"}, nil)
	descSYNs = prometheus.NewDesc(ns+"_syns_to_draining_total",
		"TCP SYNs that reached a draining endpoint on this node.", []string{"family"}, nil)
	descMapEntries  = prometheus.NewDesc(ns+"_bpf_map_entries", "Entries in a BPF map.", []string{"map"}, nil)
	descMapCapacity = prometheus.NewDesc(ns+"_bpf_map_capacity", "Capacity of a BPF map.", []string{"map"}, nil)
	descMapErrors   = prometheus.NewDesc(ns+"_bpf_map_update_errors_total", "Failed updates of a BPF map.", []string{"map"}, nil)
	descDraining    = prometheus.NewDesc(ns+"_draining_endpoints",
		"Pods (endpoint owners) currently drained, by reason.", []string{"reason"}, nil)
	descPodSYNs = prometheus.NewDesc(ns+"_draining_pod_syns_total",
		"SYNs that reached a draining pod hosted on this node (one series per pod while it drains).", []string{"namespace", "pod"}, nil)
	descPodLive = prometheus.NewDesc(ns+"_draining_pod_live_connections",
		"Live connections of a draining pod hosted on this node.", []string{"namespace", "pod"}, nil)
	descPodSteered = prometheus.NewDesc(ns+"_draining_pod_steered_total",
		"connect()s to a draining pod's IP that this node steered or refused.", []string{"namespace", "pod"}, nil)
)

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDraining, descConns, descSYNs, descMapEntries, descMapCapacity, descMapErrors, descPodSYNs, descPodLive, descPodSteered} {
		ch <- d
	}
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	if ctr, err := c.dp.Counters(); err == nil {
		for o, l := range connOutcome {
			for f, fam := range families {
				ch <- prometheus.MustNewConstMetric(descConns, prometheus.CounterValue, float64(ctr.Get(o, bpf.Family(f))), l[0], l[1], l[2], fam)
			}
		}
		for f, fam := range families {
			ch <- prometheus.MustNewConstMetric(descSYNs, prometheus.CounterValue, float64(ctr.Get(bpf.OutSYNDraining, bpf.Family(f))), fam)
		}
	}
	if stats, err := c.dp.MapStats(); err == nil {
		for _, s := range stats {
			ch <- prometheus.MustNewConstMetric(descMapEntries, prometheus.GaugeValue, float64(s.Entries), string(s.Name))
			ch <- prometheus.MustNewConstMetric(descMapCapacity, prometheus.GaugeValue, float64(s.Capacity), string(s.Name))
			ch <- prometheus.MustNewConstMetric(descMapErrors, prometheus.CounterValue, float64(s.UpdateErrors), string(s.Name))
		}
	}
	if c.pods == nil {
		return
	}
	pods := c.pods()
	counts := map[string]int{}
	for _, p := range pods {
		counts[p.Reason]++
	}
	for _, r := range drainReasons {
		ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, float64(counts[r]), r)
	}
	for _, p := range pods {
		if !p.Local {
			continue
		}
		ch <- prometheus.MustNewConstMetric(descPodSYNs, prometheus.CounterValue, float64(p.SYNs), p.Namespace, p.Name)
		ch <- prometheus.MustNewConstMetric(descPodLive, prometheus.GaugeValue, float64(p.LiveConnections), p.Namespace, p.Name)
		ch <- prometheus.MustNewConstMetric(descPodSteered, prometheus.CounterValue, float64(p.Steered), p.Namespace, p.Name)
	}
}

// precreateLabels creates every labelled series at zero (label values
// known up front), so dashboards and alerts see a 0, not an absent series.
func (m *Metrics) precreateLabels() {
	for _, reason := range drainReasons {
		m.DrainStarts.WithLabelValues(reason)
	}
	for _, o := range drainOutcomes {
		m.DrainOutcomes.WithLabelValues(o)
	}
	for _, p := range ctProtos {
		m.CTExpired.WithLabelValues(p)
	}
	for _, k := range datapathErrors {
		m.DatapathErrors.WithLabelValues(k)
	}
	for _, i := range informerNames {
		m.InformerSynced.WithLabelValues(i)
	}
	for _, op := range leaseOps {
		for _, res := range leaseResults {
			m.LeaseOps.WithLabelValues(op, res)
		}
	}
	for _, path := range []string{"/v1/offline", "/v1/online"} {
		for _, code := range []string{"200", "400", "403", "404", "405", "429", "500", "503", "504"} {
			m.OfflineRequests.WithLabelValues(path, code)
		}
	}
}
