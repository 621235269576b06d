package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/draind/draind/test/fakeapi"
)

// envFakeCluster makes the test binary serve the synthetic cluster.
const envFakeCluster = "DRAIND_BENCH_FAKE_CLUSTER"

const (
	scaleServices     = 10000
	scaleEndpoints    = 10 // per Service: 100,000 in all, one slice each
	scaleChurnPerSec  = 1000
	scaleChurnSeconds = 10
)

func init() {
	if os.Getenv(envFakeCluster) == "1" {
		if err := serveFakeCluster(); err != nil {
			fmt.Fprintln(os.Stderr, "fake cluster:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func benchSlice(i int, terminating int) *discoveryv1.EndpointSlice {
	name, port, proto := "http", int32(8080), corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		TypeMeta:    metav1.TypeMeta{Kind: "EndpointSlice", APIVersion: "discovery.k8s.io/v1"},
		ObjectMeta:  metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d-abcde", i), Namespace: fmt.Sprintf("ns-%d", i%100), Labels: map[string]string{discoveryv1.LabelServiceName: fmt.Sprintf("svc-%d", i)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for j := 0; j < scaleEndpoints; j++ {
		n := i*scaleEndpoints + j
		ready, term := j != terminating, j == terminating
		serving := true
		node := fmt.Sprintf("node-%d", n%100)
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 100+n>>16, (n>>8)&255, n&255)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &term},
			NodeName:   &node,
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: s.Namespace, Name: fmt.Sprintf("pod-%d", n), UID: types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", n))},
		})
	}
	return s
}

// serveFakeCluster runs in a child process: 10,000 Services with one slice
// of 10 endpoints each, then, on "churn" from stdin, 1,000 slice updates per
// second (one endpoint of a random slice turns terminating, the previous
// one of that slice ready again).
func serveFakeCluster() error {
	s := fakeapi.New()
	s.Kind("services", "v1", "ServiceList")
	s.Kind("endpointslices", "discovery.k8s.io/v1", "EndpointSliceList")
	s.Kind("leases", "coordination.k8s.io/v1", "LeaseList")
	s.Kind("pods", "v1", "PodList")
	for i := 0; i < scaleServices; i++ {
		svc := &corev1.Service{TypeMeta: metav1.TypeMeta{Kind: "Service", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("svc-%d", i), Namespace: fmt.Sprintf("ns-%d", i%100)},
			Spec: corev1.ServiceSpec{ClusterIP: fmt.Sprintf("10.96.%d.%d", i>>8, i&255),
				ClusterIPs: []string{fmt.Sprintf("10.96.%d.%d", i>>8, i&255)},
				Ports:      []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}}}
		if err := s.Put("services", svc); err != nil {
			return err
		}
		sl := benchSlice(i, -1)
		if err := s.Put("endpointslices", sl); err != nil {
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
		if len(f) != 3 || f[0] != "churn" {
			continue
		}
		rate, _ := strconv.Atoi(f[1])
		secs, _ := strconv.Atoi(f[2])
		term := map[int]int{}
		t := time.NewTicker(10 * time.Millisecond)
		end := time.Now().Add(time.Duration(secs) * time.Second)
		for time.Now().Before(end) {
			<-t.C
			for k := 0; k < rate/100; k++ {
				i := rand.IntN(scaleServices)
				next := rand.IntN(scaleEndpoints)
				if prev, ok := term[i]; ok && prev == next {
					next = (next + 1) % scaleEndpoints
				}
				term[i] = next
				sl := benchSlice(i, next)
				s.Put("endpointslices", sl)
			}
		}
		t.Stop()
		fmt.Println("done")
	}
	return nil
}

func rssKB(field string) int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field+":") {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return v
		}
	}
	return 0
}

// BenchmarkClusterScale: a synthetic cluster of 10,000 Services and 100,000
// endpoints served over HTTP by another process; the real informers and
// model with the fake datapath. Reports the time to the first complete
// pass, heap and RSS after it, and the event-to-datapath latency while
// 1,000 slice updates per second churn.
func BenchmarkClusterScale(b *testing.B) {
	// The synthetic server speaks plain list+watch, not streaming lists.
	os.Setenv("KUBE_FEATURE_WatchListClient", "false")
	// Watches end with the benchmark: not news.
	klog.SetSlogLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envFakeCluster+"=1")
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
	baseRSS := rssKB("VmRSS")
	cfg := &rest.Config{Host: "http://" + addr, QPS: 1000, Burst: 1000}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	var lat []time.Duration
	recording := false
	dp := NewFakeDatapath()
	d := New(Config{Node: "node-0", Namespace: "draind-system", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnLatency: func(l time.Duration) {
			mu.Lock()
			if recording {
				lat = append(lat, l)
			}
			mu.Unlock()
		}}, client, dp, nil)
	d.SetAttached(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ResetTimer()
	start := time.Now()
	go d.Run(ctx)
	for !d.Ready() {
		time.Sleep(5 * time.Millisecond)
	}
	syncTime := time.Since(start)
	b.StopTimer()
	if n := len(d.inf.Slices.GetStore().ListKeys()); n != scaleServices {
		b.Fatalf("synced %d slices, want %d", n, scaleServices)
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	heapMB := float64(ms.HeapInuse) / (1 << 20)
	rssMB := float64(rssKB("VmRSS")) / 1024

	mu.Lock()
	recording = true
	mu.Unlock()
	fmt.Fprintf(stdin, "churn %d %d\n", scaleChurnPerSec, scaleChurnSeconds)
	if !out.Scan() {
		b.Fatal("churn did not finish")
	}
	time.Sleep(200 * time.Millisecond) // the tail of the churn to arrive (samples, not sync)
	mu.Lock()
	samples := slices.Clone(lat)
	mu.Unlock()
	if len(samples) < scaleChurnPerSec*scaleChurnSeconds/2 {
		b.Fatalf("only %d latency samples for %d updates", len(samples), scaleChurnPerSec*scaleChurnSeconds)
	}
	slices.Sort(samples)
	p := func(q float64) float64 {
		return float64(samples[int(q*float64(len(samples)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(syncTime.Seconds(), "sync-s")
	b.ReportMetric(heapMB, "heap-MB")
	b.ReportMetric(rssMB, "rss-MB")
	b.ReportMetric(p(0.50), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(float64(len(samples)), "samples")
	b.Logf("baseline RSS before the informers %.1f MB; %d datapath ops; drains now %d", float64(baseRSS)/1024, dp.OpCount(), len(dp.Drains))
}
