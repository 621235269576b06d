package daemon

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/fakeapi"
)

// envFakeCluster makes the test binary serve the synthetic cluster; its
// value is the number of endpoints per Service.
const envFakeCluster = "DRAIND_BENCH_FAKE_CLUSTER"

const (
	scaleServices    = 10000
	scaleNodes       = 100
	scaleChurnPerSec = 1000
	// scaleLocalPods is how many pods run on draind's node (node-0): the
	// kubelet's default limit. They are endpoints of the slices, as the
	// API lists them.
	scaleLocalPods = 110
	// scaleDrainLeases is how many pods of other nodes drain throughout
	// (a rollout's preStop calls), half of them gone: each node's draind
	// reads every drain Lease on every pass.
	scaleDrainLeases = 200
)

var scaleChurn = flag.Duration("clusterscale.churn", 10*time.Second,
	"how long BenchmarkClusterScale churns slices at 1,000 updates/s (CI runs a short form)")

func init() {
	if v := os.Getenv(envFakeCluster); v != "" {
		perService, err := strconv.Atoi(v)
		if err == nil {
			err = serveFakeCluster(perService)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake cluster:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// benchService is Service i as the API serves it: a ClusterIP Service with
// a selector, so the EndpointSlice controller lists its pods.
func benchService(i int) *corev1.Service {
	name := fmt.Sprintf("svc-%d", i)
	single := corev1.IPFamilyPolicySingleStack
	cluster := corev1.ServiceInternalTrafficPolicyCluster
	ip := fmt.Sprintf("10.96.%d.%d", i>>8, i&255)
	return &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: fmt.Sprintf("ns-%d", i%100), UID: types.UID(fmt.Sprintf("5e4f0000-0000-0000-0000-%012d", i)),
			Labels: map[string]string{"app": name}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Selector: map[string]string{"app": name}, SessionAffinity: corev1.ServiceAffinityNone,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
}

// benchSlice is the EndpointSlice controller's slice of Service i, with
// perService endpoints and endpoint terminating (-1: none).
func benchSlice(i, perService, terminating int) *discoveryv1.EndpointSlice {
	return benchSliceOf(i, perService, nil, terminating)
}

// benchSliceOf is benchSlice with endpoint j listing pod pods[j] (nil: the
// Service's own pods i*perService+j; another number is a pod a rollout
// made). The churn builds one per update in the API server's process,
// which shares the machine with draind: it formats without fmt.
func benchSliceOf(i, perService int, pods []int, terminating int) *discoveryv1.EndpointSlice {
	itoa := strconv.Itoa
	name, port, proto := "http", int32(8080), corev1.ProtocolTCP
	svc := "svc-" + itoa(i)
	ns := "ns-" + itoa(i%100)
	isTrue := true
	s := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta: metav1.ObjectMeta{Name: svc + "-abcde", GenerateName: svc + "-", Namespace: ns,
			UID: types.UID("5e1c0000-0000-0000-0000-" + zeroPad(i, 12)),
			Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: k8s.ManagedByController,
				"app": svc},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc,
				UID: types.UID("5e4f0000-0000-0000-0000-" + zeroPad(i, 12)), Controller: &isTrue, BlockOwnerDeletion: &isTrue}}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for j := 0; j < perService; j++ {
		n, podName := i*perService+j, benchPodName(svc, j)
		if pods != nil && pods[j] != n {
			n, podName = pods[j], svc+"-5f6c7d8e9-"+itoa(pods[j])
		}
		ready, term := j != terminating, j == terminating
		serving := true
		node := "node-" + itoa(n%scaleNodes)
		zone := "zone-" + itoa(n%3)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{benchPodIP(n)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
			NodeName:   &node,
			Zone:       &zone,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: podName, UID: benchPodUID(n)},
		})
	}
	return s
}

// benchPod is the pod of endpoint n of the cluster (the endpoint j of
// Service n/perService), running and ready on node-(n%scaleNodes).
func benchPod(n, perService int) *corev1.Pod {
	i, j := n/perService, n%perService
	svc := "svc-" + strconv.Itoa(i)
	ip := benchPodIP(n)
	return &corev1.Pod{TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Name: benchPodName(svc, j), Namespace: "ns-" + strconv.Itoa(i%100), UID: benchPodUID(n),
			Labels: map[string]string{"app": svc}},
		Spec: corev1.PodSpec{NodeName: "node-" + strconv.Itoa(n%scaleNodes)},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}}
}

// benchDrainLease is the drain Lease of a pod of node-1 to node-99 (the
// endpoint k*scaleNodes + 1 + k%99), published by its node's draind; the
// pod is gone for even k.
func benchDrainLease(k, perService int) *coordinationv1.Lease {
	n := k*scaleNodes + 1 + k%(scaleNodes-1)
	p := benchPod(n, perService)
	r := k8s.DrainRequest{PodNamespace: p.Namespace, PodName: p.Name, PodUID: p.UID, IPs: []netip.Addr{netip.MustParseAddr(p.Status.PodIP)},
		Node: p.Spec.NodeName, Reason: k8s.ReasonOffline, Duration: 10 * time.Minute}
	if k%2 == 0 {
		// Half of them say the pod is gone (deleted after its drain, its
		// Lease kept for the linger): every node lists those as gone
		// peers. (Their pods stay listed here; a deleted pod's slice
		// update comes within seconds, and its departed host keeps the
		// Lease honoured the same way.)
		r.State = StateGone
	}
	l := r.Lease("draind-system", time.Now())
	l.TypeMeta = metav1.TypeMeta{Kind: "Lease", APIVersion: "coordination.k8s.io/v1"}
	return l
}

func benchPodIP(n int) string {
	return "10." + strconv.Itoa(100+n>>16) + "." + strconv.Itoa((n>>8)&255) + "." + strconv.Itoa(n&255)
}

func benchPodName(svc string, j int) string { return svc + "-7d4b9c8f6-" + zeroPad(j, 5) }

func benchPodUID(n int) types.UID { return types.UID("00000000-0000-0000-0000-" + zeroPad(n, 12)) }

// zeroPad is fmt's %0*d for n >= 0.
func zeroPad(n, width int) string {
	d := strconv.Itoa(n)
	if len(d) >= width {
		return d
	}
	return strings.Repeat("0", width-len(d)) + d
}

// serveFakeCluster runs in a child process: 10,000 Services with one slice
// of perService endpoints each and the pods of draind's node, then, on
// "churn <rate> <duration> <burst> <rollout>" from stdin, rate slice
// updates per second, burst at a time: one endpoint of a random slice
// turns terminating, and the previous one of that slice is ready again
// (rollout 0) or replaced by a new pod, ready, at a new IP on another
// node (rollout 1; not the pods of draind's node, whose pod objects stay).
func serveFakeCluster(perService int) error {
	s := fakeapi.New()
	s.SetHistory(1000) // draind's watches never resume here
	s.Kind("services", "v1", "ServiceList")
	s.Kind("endpointslices", "discovery.k8s.io/v1", "EndpointSliceList")
	s.Kind("leases", "coordination.k8s.io/v1", "LeaseList")
	s.Kind("pods", "v1", "PodList")
	for i := 0; i < scaleServices; i++ {
		if err := s.Put("services", benchService(i)); err != nil {
			return err
		}
		if err := s.Put("endpointslices", benchSlice(i, perService, -1)); err != nil {
			return err
		}
	}
	// node-0's pods: the endpoints n with n%scaleNodes == 0.
	for k := 0; k < scaleLocalPods; k++ {
		if err := s.Put("pods", benchPod(k*scaleNodes, perService)); err != nil {
			return err
		}
	}
	for k := 0; k < scaleDrainLeases; k++ {
		if err := s.Put("leases", benchDrainLease(k, perService)); err != nil {
			return err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go http.Serve(l, s)
	fmt.Println(l.Addr().String())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 5 || f[0] != "churn" {
			continue
		}
		rate, _ := strconv.Atoi(f[1])
		dur, _ := time.ParseDuration(f[2])
		burst, _ := strconv.Atoi(f[3])
		rollout := f[4] == "1"
		term := map[int]int{}
		roll := benchRollout{perService: perService, pods: map[int][]int{}, next: scaleServices * perService}
		// A tick every burst updates' worth of time; a tick that comes late
		// (the ticker drops what it cannot deliver) sends what is due, so
		// the rate holds.
		t := time.NewTicker(time.Duration(burst) * time.Second / time.Duration(rate))
		start := time.Now()
		for sent := 0; sent < int(dur.Seconds()*float64(rate)); {
			<-t.C
			due := min(int(time.Since(start).Seconds()*float64(rate)), int(dur.Seconds()*float64(rate)))
			for ; sent < due; sent++ {
				i := rand.IntN(scaleServices)
				next := rand.IntN(perService)
				if prev, ok := term[i]; ok && prev == next {
					next = (next + 1) % perService
				}
				var pods []int
				if prev, ok := term[i]; ok && rollout {
					pods = roll.replace(i, prev)
				}
				term[i] = next
				if err := s.Put("endpointslices", benchSliceOf(i, perService, pods, next)); err != nil {
					return err
				}
			}
		}
		t.Stop()
		fmt.Println("done")
	}
	return nil
}

// benchRollout is the pods a rollout churn made: by slice, the pod number
// of each endpoint.
type benchRollout struct {
	perService int
	pods       map[int][]int
	next       int // the next new pod's number
}

// replace replaces the pod of slice i's endpoint j with a new one, unless
// it is one of draind's node's, and returns the slice's pods.
func (r *benchRollout) replace(i, j int) []int {
	pods := r.pods[i]
	if pods == nil {
		pods = make([]int, r.perService)
		for k := range pods {
			pods[k] = i*r.perService + k
		}
		r.pods[i] = pods
	}
	if pods[j]%scaleNodes != 0 {
		if r.next%scaleNodes == 0 {
			r.next++
		}
		pods[j] = r.next
		r.next++
	}
	return pods
}

func procStatusKB(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return v
		}
	}
	return 0
}

// liveHeapMB is the heap the last GC found live (no GC forced).
func liveHeapMB() float64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return float64(s[0].Value.Uint64()) / (1 << 20)
}

// latencySample is one event-to-datapath latency and when its event
// happened, from the start of the churn.
type latencySample struct {
	at, lat time.Duration
}

// BenchmarkClusterScale: a synthetic cluster of 10,000 Services (with
// selectors) and their EndpointSlice controller slices (10 or 15 endpoints
// each), served over HTTP by another process (streamed, as API servers >=
// 1.34 serve lists, or as one list response); the real informers, trust
// checks, model and reconciler, with a stand-in for the kernel's maps. It
// reports the time from start to Ready (sync-s) and of the first full pass
// (first-pass-ms); the event-to-datapath latency (from the moment the
// slice informer received the update, k8s.Receipt, to the end of the pass
// that wrote it) while 1,000 slice updates per second churn from the
// moment draind is Ready (p50, p99, the worst sample, p99 of the first
// second alone: a restart must not stall), with a periodic refresh round in
// the middle; and memory after the churn: live
// heap, RSS as the process runs, RSS after a GC and scavenge (the state
// alone), peak RSS (the initial lists included), heap and RSS growth per
// 10,000 endpoints. Run one scale per process (test/bench.sh does) so that
// RSS is the scale's own.
func BenchmarkClusterScale(b *testing.B) {
	for _, sc := range []struct {
		name string
		scaleCase
	}{
		// As draind runs against API servers >= 1.34: streamed lists, in
		// protobuf (client-go's typed clients ask for it). The churn comes
		// in bursts of 10 updates every 10 ms.
		{"endpoints=100k", scaleCase{perService: 10, stream: true, encoding: "protobuf", burst: 10}},
		{"endpoints=150k", scaleCase{perService: 15, stream: true, encoding: "protobuf", burst: 10}},
		// The same churn spread out: one update every millisecond. A
		// burst's last update waits for the nine before it, and at bursts
		// of 10 those are a tenth of all updates: the p99 above is a
		// burst's, this one an update's.
		{"endpoints=150k-spread", scaleCase{perService: 15, stream: true, encoding: "protobuf", burst: 1}},
		// A rollout: each update replaces the slice's last terminating
		// pod with a new one at a new IP (on another node), as the
		// EndpointSlice controller writes while Deployments roll: the
		// claims' index changes on every update.
		// Departed pods linger 3 s here (--linger, 2 min by default),
		// so that the churn reaches the steady state of a long rollout,
		// where lingers end as fast as pods depart.
		{"endpoints=150k-rollout", scaleCase{perService: 15, stream: true, encoding: "protobuf", burst: 10, rollout: true, linger: 3 * time.Second}},
		// The fallback when the API server does not stream lists (before
		// 1.34, or WatchList off): one list response decoded whole.
		{"endpoints=150k-list", scaleCase{perService: 15, stream: false, encoding: "protobuf", burst: 10}},
		// JSON: what an API server answers a client that cannot ask for
		// protobuf (draind's client asks for protobuf).
		{"endpoints=150k-json", scaleCase{perService: 15, stream: true, encoding: "json", burst: 10}},
	} {
		b.Run(sc.name, func(b *testing.B) { benchClusterScale(b, sc.scaleCase) })
	}
}

// scaleCase is one cluster and churn of BenchmarkClusterScale.
type scaleCase struct {
	perService int           // endpoints per Service (10,000 Services)
	stream     bool          // the initial list streamed (WatchList), not one response
	encoding   string        // "protobuf" or "json"
	burst      int           // the churn's updates come this many at once, 1,000 a second in all
	rollout    bool          // the churn replaces pods (new pods at new IPs), not only their conditions
	linger     time.Duration // --linger (0: the default)
}

// watchListGate turns client-go's streaming lists on or off (its feature
// gates are read once from the environment otherwise); reflectors read it
// when they are made.
type watchListGate struct {
	clientfeatures.Gates
	on bool
}

func (g watchListGate) Enabled(f clientfeatures.Feature) bool {
	if f == clientfeatures.WatchListClient {
		return g.on
	}
	return g.Gates.Enabled(f)
}

var defaultGates = sync.OnceValue(clientfeatures.FeatureGates)

func benchClusterScale(b *testing.B, sc scaleCase) {
	perService, stream, encoding := sc.perService, sc.stream, sc.encoding
	// Watches end with the benchmark: not news.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	clientfeatures.ReplaceFeatureGates(watchListGate{defaultGates(), stream})
	defer clientfeatures.ReplaceFeatureGates(defaultGates())
	endpoints := scaleServices * perService
	per10k := float64(endpoints) / 10000
	if *scaleProcs > 0 { // as draind run does
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(*scaleProcs))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envFakeCluster+"="+strconv.Itoa(perService))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	out := bufio.NewScanner(stdout)
	if !out.Scan() {
		b.Fatal("the fake cluster did not start")
	}
	addr := out.Text()

	runtime.GC()
	debug.FreeOSMemory()
	baseRSS := float64(procStatusKB("VmRSS")) / 1024
	baseClasses := memoryClasses()
	// Peak RSS from here on (Linux: 5 resets VmHWM to the current RSS).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Logf("peak RSS includes what ran before: %v", err)
	}
	cfg := &rest.Config{Host: "http://" + addr, QPS: 1000, Burst: 1000}
	if encoding == "json" {
		// client-go's typed clients ask for protobuf unless told.
		cfg.ContentType = k8sruntime.ContentTypeJSON
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	samples := make([]latencySample, 0, 2*int(scaleChurnPerSec*scaleChurn.Seconds()))
	var churnStart time.Time
	intake := make([]float64, 0, cap(samples)) // receipt to draind's handler, ms
	dp := newBenchDatapath()
	// Every entry is rewritten by a full pass each quarter of the entry
	// TTL (a minute by default): a TTL of twice the churn puts one such
	// pass in the middle of the churn, where its cost shows as latency.
	d := mustNew(b, Config{Node: "node-0", Namespace: "draind-system", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		EntryTTL: 2 * *scaleChurn, Linger: sc.linger, REST: cfg}, client, dp, nil)
	d.onIntake = func(l time.Duration) {
		mu.Lock()
		if !churnStart.IsZero() {
			intake = append(intake, float64(l)/float64(time.Millisecond))
		}
		mu.Unlock()
	}
	d.onLatency = func(l time.Duration) {
		now := time.Now()
		mu.Lock()
		if !churnStart.IsZero() {
			samples = append(samples, latencySample{at: now.Add(-l).Sub(churnStart), lat: l})
		}
		mu.Unlock()
	}
	d.SetAttached(true)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	defer func() { cancel(); <-ran }()
	b.ResetTimer()
	start := time.Now()
	go func() { ran <- d.Run(ctx) }()
	var synced time.Time
	// Polled in real time: the benchmark measures it, against an API
	// server over HTTP.
	for !d.Ready() {
		if synced.IsZero() && d.synced.Load() {
			synced = time.Now()
		}
		time.Sleep(time.Millisecond)
	}
	ready := time.Now()
	b.StopTimer()
	if d.inf.SliceDecoding != "slim" {
		b.Fatalf("the EndpointSlice watch is not decoded straight into slim slices: %s", d.inf.SliceDecoding)
	}
	// The churn starts the moment draind is Ready: the first second after
	// a restart must be like the rest.
	mu.Lock()
	churnStart = ready
	mu.Unlock()
	if *scaleCPUProfile != "" {
		f, err := os.Create(*scaleCPUProfile)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	if *scaleAllocProfile != "" {
		writeHeapProfile(b, *scaleAllocProfile+".base") // the same records: allocations too
	}
	allocBefore, passesBefore := totalAlloc(), d.passes.Load()
	cpuBefore, apiBefore := processCPU(), childCPU(cmd.Process.Pid)
	rollout := 0
	if sc.rollout {
		rollout = 1
	}
	fmt.Fprintf(stdin, "churn %d %s %d %d\n", scaleChurnPerSec, *scaleChurn, sc.burst, rollout)
	if synced.IsZero() {
		synced = ready
	}
	if n := len(d.inf.Slices.GetStore().ListKeys()); n != scaleServices {
		b.Fatalf("synced %d slices, want %d", n, scaleServices)
	}
	if n := len(d.state.LocalPods()); n != scaleLocalPods {
		b.Fatalf("synced %d local pods, want %d", n, scaleLocalPods)
	}
	d.modelMu.Lock()
	pd, _ := d.model.PodDrains()
	drains := len(pd)
	d.modelMu.Unlock()
	dp.mu.Lock()
	gone := len(dp.gone)
	dp.mu.Unlock()
	if drains != scaleDrainLeases {
		b.Fatalf("%d pods drain, want the %d of the drain Leases", drains, scaleDrainLeases)
	}
	if gone != scaleDrainLeases/2 {
		b.Fatalf("%d gone peers listed, want the %d gone pods'", gone, scaleDrainLeases/2)
	}
	if !out.Scan() {
		b.Fatal("churn did not finish")
	}
	time.Sleep(200 * time.Millisecond) // the tail of the churn to arrive (samples, not sync; a real API process)
	cpu, apiCPU := processCPU()-cpuBefore, childCPU(cmd.Process.Pid)-apiBefore
	allocated, passes := totalAlloc()-allocBefore, d.passes.Load()-passesBefore
	if *scaleCPUProfile != "" {
		pprof.StopCPUProfile()
	}
	if *scaleAllocProfile != "" {
		writeHeapProfile(b, *scaleAllocProfile)
	}
	// Memory, now that the samples are in: RSS as the process runs, its
	// peak, then the live heap and RSS without garbage (what the state
	// itself costs). The heap includes the latency samples (24 bytes
	// each with the intake's, allocated up front) and the stand-in for the kernel's maps
	// (benchDatapath), nothing else of the benchmark's.
	rssMB := float64(procStatusKB("VmRSS")) / 1024
	peakMB := float64(procStatusKB("VmHWM")) / 1024
	debug.FreeOSMemory()
	heapMB := liveHeapMB()
	rssGCMB := float64(procStatusKB("VmRSS")) / 1024
	if *scaleHeapProfile != "" {
		writeHeapProfile(b, *scaleHeapProfile)
	}
	mu.Lock()
	got := slices.Clone(samples)
	gotIntake := slices.Clone(intake)
	mu.Unlock()

	if *scaleSamples != "" {
		writeSamples(b, *scaleSamples, got)
	}
	updates := int(scaleChurnPerSec * scaleChurn.Seconds())
	if len(got) < updates/2 {
		b.Fatalf("only %d latency samples for %d updates", len(got), updates)
	}
	var first, all []float64
	for _, s := range got {
		ms := float64(s.lat) / float64(time.Millisecond)
		all = append(all, ms)
		if s.at < time.Second {
			first = append(first, ms)
		}
	}
	slices.SortFunc(got, func(x, y latencySample) int { return cmp.Compare(y.lat, x.lat) })
	for _, s := range got[:min(3, len(got))] {
		b.Logf("slowest: an event %v after Ready waited %v", s.at.Round(time.Millisecond), s.lat.Round(time.Microsecond))
	}
	b.ReportMetric(ready.Sub(start).Seconds(), "sync-s")
	b.ReportMetric(float64(ready.Sub(synced))/float64(time.Millisecond), "first-pass-ms")
	b.ReportMetric(quantile(all, 0.50), "p50-ms")
	b.ReportMetric(quantile(all, 0.99), "p99-ms")
	b.ReportMetric(quantile(first, 0.99), "p99-first-s-ms")
	b.ReportMetric(quantile(all, 1), "max-ms")
	// client-go's part of it: from the receipt to draind's slice handler
	// (its queue, indexer and handler dispatch), which draind's own work
	// (the handler and the pass) follows.
	b.ReportMetric(quantile(gotIntake, 0.50), "intake-p50-ms")
	b.ReportMetric(quantile(gotIntake, 0.99), "intake-p99-ms")
	b.ReportMetric(float64(len(all)), "samples")
	// Passes per update: how many updates a pass takes in at once.
	b.ReportMetric(float64(passes)/float64(updates), "passes/update")
	// This process's CPU per update while it churns (draind's informers,
	// handlers and passes; the API server is the other process): what a
	// node pays for the cluster's churn, and on a small machine what the
	// latency tail queues behind.
	b.ReportMetric(float64(cpu.Microseconds())/float64(updates), "cpu-µs/update")
	// The API server stand-in's, on the same CPUs (building, encoding and
	// writing the updates): what the latency tail competes with here, and
	// a real node does not.
	b.ReportMetric(float64(apiCPU.Microseconds())/float64(updates), "api-cpu-µs/update")
	// Bytes allocated per update while it churns: how often the GC runs,
	// and each of its cycles is a burst of slow samples (README).
	b.ReportMetric(float64(allocated)/1024/float64(updates), "alloc-KB/update")
	b.ReportMetric(heapMB, "heap-MB")
	b.ReportMetric(heapMB/per10k, "heap-MB/10k")
	b.ReportMetric(rssMB, "rss-MB")
	b.ReportMetric((rssMB-baseRSS)/per10k, "rss-MB/10k")
	b.ReportMetric(rssGCMB, "rss-gc-MB")
	b.ReportMetric(peakMB, "peak-rss-MB")
	b.ReportMetric(float64(dp.drainCount()), "drains")
	b.Logf("%d endpoints; RSS before the informers %.1f MB (%s); %d datapath ops; after the GC: %s", endpoints, baseRSS, baseClasses, dp.opCount(), memoryClasses())
}

// childCPU is the CPU time process pid used so far (user and system, from
// /proc, in clock ticks: USER_HZ, 100 on Linux; over seconds of churn,
// close enough).
func childCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command's name, which is in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// processCPU is the CPU time this process used so far (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memoryClasses says where the runtime's memory goes (objects, the unused
// parts of their spans, free, metadata, stacks).
func memoryClasses() string {
	names := []string{"heap/objects", "heap/unused", "heap/free", "metadata/other", "metadata/mspan/inuse", "os-stacks", "other"}
	s := make([]metrics.Sample, len(names))
	for i, n := range names {
		s[i].Name = "/memory/classes/" + n + ":bytes"
	}
	metrics.Read(s)
	var parts []string
	for i, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f MB", n, float64(s[i].Value.Uint64())/(1<<20)))
	}
	return strings.Join(parts, ", ")
}

var (
	scaleHeapProfile  = flag.String("clusterscale.heapprofile", "", "write the live heap after the churn to this file")
	scaleCPUProfile   = flag.String("clusterscale.cpuprofile", "", "write a CPU profile of the churn alone to this file")
	scaleProcs        = flag.Int("clusterscale.procs", DefaultProcs, "GOMAXPROCS of draind's process, as draind run --procs (0: the runtime's default; the stand-in API server keeps its own)")
	scaleSamples      = flag.String("clusterscale.samples", "", "write every latency sample (ms after Ready, latency in µs) to this file")
	scaleAllocProfile = flag.String("clusterscale.allocprofile", "", "write the heap profile after the churn to this file and before it to FILE.base: go tool pprof -sample_index=alloc_space -base FILE.base shows the churn's allocations (two GCs before each)")
)

// writeSamples writes the samples, one per line, in the order they came.
func writeSamples(b *testing.B, path string, samples []latencySample) {
	var buf strings.Builder
	for _, s := range samples {
		fmt.Fprintf(&buf, "%.3f %d\n", float64(s.at)/float64(time.Millisecond), s.lat.Microseconds())
	}
	if err := os.WriteFile(path, []byte(buf.String()), 0o644); err != nil {
		b.Errorf("writing the samples: %v", err)
	}
}

// writeHeapProfile writes the heap profile: the live heap, and every
// allocation so far (go tool pprof -sample_index=alloc_space).
func writeHeapProfile(b *testing.B, path string) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	// The profile is as of the last GC that completed before the one
	// before it: two more make it the heap's and allocations' of now.
	runtime.GC()
	runtime.GC()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// totalAlloc is the bytes this process has allocated so far.
func totalAlloc() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.TotalAlloc
}

// quantile returns the q-quantile of v (0 when v is empty).
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// benchDatapath stands in for the kernel's maps: it counts operations and
// keeps what *bpf.Datapath keeps in Go memory (the keys of the frontends
// and drain entries written), so that the benchmark's heap is draind's
// own, not a copy of the maps the kernel holds. It offers the socket hooks
// (SocketDatapath) as a node whose kernel loads them: passes then do their
// gone-peer work as there.
type benchDatapath struct {
	mu        sync.Mutex
	ops       int
	frontends map[bpf.EndpointKey]struct{}
	drains    map[bpf.EndpointKey]struct{}
	gone      map[bpf.EndpointKey]struct{} // gone peers, by address
}

var (
	_ Datapath       = (*benchDatapath)(nil)
	_ SocketDatapath = (*benchDatapath)(nil)
)

func (f *benchDatapath) SocketsLoaded() bool                           { return true }
func (f *benchDatapath) Connections(netip.Addr) (bpf.ConnCount, error) { return bpf.ConnCount{}, nil }
func (f *benchDatapath) CountingSince() (time.Time, error)             { return time.Time{}, nil }
func (f *benchDatapath) UpsertGonePeer(p bpf.GonePeer) error {
	return f.set(f.gone, bpf.EndpointKey{Addr: p.Addr}, true)
}
func (f *benchDatapath) DeleteGonePeer(a netip.Addr) error {
	return f.set(f.gone, bpf.EndpointKey{Addr: a}, false)
}
func (f *benchDatapath) UpsertGoneFlow(bpf.GoneFlow) error {
	return f.set(nil, bpf.EndpointKey{}, true)
}
func (f *benchDatapath) DeleteGoneFlow(_, _ netip.AddrPort) error {
	return f.set(nil, bpf.EndpointKey{}, false)
}
func (f *benchDatapath) GoneEntries() ([]bpf.GonePeer, []bpf.GoneFlow, error) { return nil, nil, nil }
func (f *benchDatapath) SocketCounters() (bpf.SocketCounters, error) {
	return bpf.SocketCounters{}, nil
}
func (f *benchDatapath) PruneConnections(func(netip.Addr) bool) (int, error) {
	return 0, nil
}

func newBenchDatapath() *benchDatapath {
	return &benchDatapath{frontends: map[bpf.EndpointKey]struct{}{}, drains: map[bpf.EndpointKey]struct{}{},
		gone: map[bpf.EndpointKey]struct{}{}}
}

func (f *benchDatapath) set(m map[bpf.EndpointKey]struct{}, k bpf.EndpointKey, present bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops++
	switch {
	case m == nil: // a gone flow: counted only
	case present:
		m[k] = struct{}{}
	default:
		delete(m, k)
	}
	return nil
}

func (f *benchDatapath) UpsertFrontend(fe bpf.Frontend) error {
	return f.set(f.frontends, fe.Key, true)
}
func (f *benchDatapath) DeleteFrontend(k bpf.EndpointKey) error { return f.set(f.frontends, k, false) }
func (f *benchDatapath) UpsertDrain(d bpf.Drain) error          { return f.set(f.drains, d.Key, true) }
func (f *benchDatapath) DeleteDrain(k bpf.EndpointKey) error    { return f.set(f.drains, k, false) }

func (f *benchDatapath) SetBackends(bpf.Backends) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops++
	return nil
}

func (f *benchDatapath) DeleteBackends(bpf.ServicePortID) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ops++
	return nil
}

func (f *benchDatapath) DrainStats(bpf.EndpointKey) (bpf.DrainStats, error) {
	return bpf.DrainStats{}, nil
}
func (f *benchDatapath) Counters() (bpf.Counters, error)  { return bpf.Counters{}, nil }
func (f *benchDatapath) MapStats() ([]bpf.MapStat, error) { return nil, nil }
func (f *benchDatapath) Dump() (*bpf.Dump, error)         { return &bpf.Dump{}, nil }

func (f *benchDatapath) opCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ops
}

func (f *benchDatapath) drainCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.drains)
}
