package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack"
	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/k8s"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// realStatus runs a real daemon (fake API, fake datapath, fake clock) with
// one pod of this node drained by its offline call, one remote endpoint
// terminating, and returns its status.
func realStatus(t *testing.T) daemon.Status {
	t.Helper()
	return realStatusWith(t, true)
}

// realStatusWith is realStatus with conntrack on (withCT) or off.
func realStatusWith(t *testing.T, withCT bool) daemon.Status {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	client := fake.NewClientset()
	dp := datapathtest.New()
	ct := conntracktest.New(conntrack.Flow{Proto: conntrack.TCP, State: conntrack.TCPEstablished,
		Orig:  conntrack.Tuple{Src: netip.MustParseAddrPort("10.244.1.7:51000"), Dst: netip.MustParseAddrPort("10.96.0.10:80")},
		Reply: conntrack.Tuple{Src: netip.MustParseAddrPort("10.244.0.11:8080"), Dst: netip.MustParseAddrPort("10.244.1.7:51000")}})
	dp.Ctr[bpf.OutSteeredClusterIP][bpf.IPv4] = 1234
	dp.Ctr[bpf.OutSteeredPodIP][bpf.IPv4] = 56
	dp.Ctr[bpf.OutRefused][bpf.IPv6] = 7
	dp.Ctr[bpf.OutSYNDraining][bpf.IPv4] = 3
	dp.SetStats(bpf.EndpointKey{Addr: netip.MustParseAddr("10.244.0.11"), Port: 8080, Proto: bpf.TCP},
		bpf.DrainStats{SYNs: 3, Steered: 56, LastSYN: clk.Now().Add(-4 * time.Second)})

	tr, node := true, "node-a"
	other := "node-b"
	mk := func(ip string, ready bool, uid, name, n string) discoveryv1.Endpoint {
		term := !ready
		return discoveryv1.Endpoint{Addresses: []string{ip}, NodeName: &n,
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &tr, Terminating: &term},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "shop", Name: name, UID: types.UID("uid-" + uid)}}
	}
	pn, pp, pr := "http", int32(8080), corev1.ProtocolTCP
	objs := []func() error{
		func() error {
			_, err := client.CoreV1().Services("shop").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "cart", Namespace: "shop", UID: "uid-svc-cart"},
				Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "cart"},
					Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: pr}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.DiscoveryV1().EndpointSlices("shop").Create(ctx, &discoveryv1.EndpointSlice{
				ObjectMeta: metav1.ObjectMeta{Name: "cart-x1", Namespace: "shop", Labels: map[string]string{discoveryv1.LabelServiceName: "cart",
					discoveryv1.LabelManagedBy: k8s.ManagedByController},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "cart", UID: "uid-svc-cart", Controller: &tr}}},
				AddressType: discoveryv1.AddressTypeIPv4, Ports: []discoveryv1.EndpointPort{{Name: &pn, Port: &pp, Protocol: &pr}},
				Endpoints: []discoveryv1.Endpoint{mk("10.244.0.11", true, "a", "cart-a", node), mk("10.244.1.12", false, "b", "cart-b", other), mk("10.244.1.13", true, "c", "cart-c", other)},
			}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := client.CoreV1().Pods("shop").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cart-a", Namespace: "shop", UID: "uid-a"},
				Spec: corev1.PodSpec{NodeName: node}, Status: corev1.PodStatus{PodIP: "10.244.0.11", PodIPs: []corev1.PodIP{{IP: "10.244.0.11"}}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			l := &k8s.Leases{Client: client, Namespace: "draind-system"}
			_, _, err := l.Publish(ctx, k8s.DrainRequest{PodNamespace: "shop", PodName: "cart-a", PodUID: "uid-a",
				IPs: []netip.Addr{netip.MustParseAddr("10.244.0.11")}, Node: node, Reason: k8s.ReasonOffline, Duration: 30 * time.Second}, clk.Now().Add(-5*time.Second))
			return err
		},
	}
	for _, f := range objs {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	var cti conntrack.Interface = ct
	ctStatus := daemon.ConntrackStatus{Enabled: true, Timestamps: true}
	runFlags := newRunCmd().Flags()
	if !withCT {
		cti, ctStatus = nil, daemon.ConntrackStatus{Reason: "--conntrack=false"}
		if err := runFlags.Set("conntrack", "false"); err != nil {
			t.Fatal(err)
		}
	}
	d, err := daemon.New(daemon.Config{Node: node, Namespace: "draind-system", Version: "v0.1.0-test", Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RegistryOnlyPolicy: bpf.PolicyRefuse}, client, dp, cti)
	if err != nil {
		t.Fatal(err)
	}
	d.SetAttached(true)
	go d.Run(ctx)
	src := daemon.StatusSource{
		Features: bpf.Features{Kernel: "6.18.0-test", Cgroup2: "/sys/fs/cgroup", BTF: true, CgroupSockAddr: true, CgroupSKB: true,
			HelperSetRetval: true, HelperBootTime: true, HelperPrandom: true, BPFLink: true,
			CgroupSendmsg: true, CgroupRecvmsg: true, SocketStorage: true,
			KernelFeatures: []bpf.KernelFeature{{Name: bpf.FeatureRefuseECONNREFUSED, On: true},
				{Name: bpf.FeatureLiveConnections, On: true},
				{Name: bpf.FeatureEndTCPToGone, Reason: "no TCP_USER_TIMEOUT in bpf_setsockopt (Linux 5.9+)"},
				{Name: bpf.FeatureEndUDPToGone, On: true}}},
		Attached:  func() []string { return []string{"connect4", "connect6", "observe_ingress"} },
		Cgroup:    "/sys/fs/cgroup/kubepods.slice",
		PinDir:    "/sys/fs/bpf/draind",
		Conntrack: ctStatus,
		Config:    configInForce(runFlags, d.Config(), daemon.DefaultProcs),
		Started:   clk.Now().Add(-90 * time.Minute),
	}
	live := 1
	if !withCT {
		live = 0
	}
	var st daemon.Status
	// Settled: cart-a's Lease adopted by its node's draind (a hosted drain
	// renews its Lease, so it shows no deadline; until the adoption the
	// Lease's expiry shows).
	settled := func(context.Context) (bool, error) {
		st = d.Status(src)
		return st.Healthy && len(st.Pods) == 2 && st.Pods[0].Local && st.Pods[0].Deadline.IsZero() &&
			st.Pods[0].SYNs == 3 && st.Pods[0].LiveConnections == live && !st.LastSync.IsZero(), nil
	}
	if err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 10*time.Second, true, settled); err != nil {
		t.Fatalf("status never settled: %+v", st)
	}
	return st
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file (run with -update if intended):\n--- got\n%s\n--- want\n%s", name, got, want)
	}
}

func TestStatusGolden(t *testing.T) {
	st := realStatus(t)
	for _, tc := range []struct{ output, file string }{
		{"", "status.txt"}, {"wide", "status-wide.txt"}, {"json", "status.json"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			var b bytes.Buffer
			if err := printStatus(&b, &st, tc.output); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.file, b.Bytes())
		})
	}
	if err := printStatus(io.Discard, &st, "yaml"); err == nil {
		t.Error("an unknown output format was accepted")
	}
}

func TestStatusUnhealthyExitsNonZero(t *testing.T) {
	st := realStatus(t)
	st.Healthy, st.Problems = false, []string{"programs not attached"}
	var b bytes.Buffer
	if err := printStatus(&b, &st, ""); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b.Bytes(), []byte("Healthy:           NO: programs not attached")) {
		t.Errorf("unhealthy status not shown:\n%s", b.String())
	}
	// The command itself, against a daemon socket serving this status.
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go daemon.ServeStatus(ctx, sock, func() daemon.Status { return st })
	// The socket appears at its path already restricted.
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(sock)
		return err == nil, nil
	}); err != nil {
		t.Fatalf("the status socket never appeared: %v", err)
	}
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("status socket mode %v, want 0600 (root-only)", fi.Mode().Perm())
	}
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"status", "--socket", sock})
	if err := cmd.ExecuteContext(ctx); err != errUnhealthy {
		t.Errorf("draind status on an unhealthy daemon returned %v, want errUnhealthy (exit 1)", err)
	}
	st.Healthy, st.Problems = true, nil
	cmd = newRootCmd()
	cmd.SetOut(io.Discard)
	cmd.SetArgs([]string{"status", "--socket", sock, "-o", "json"})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Errorf("draind status on a healthy daemon: %v", err)
	}
}

// TestStatusConntrackOffDegrades: without conntrack, status says so and
// why, health is "degraded" (not healthy, not failing), and the text shows
// it on the Healthy and Conntrack lines.
func TestStatusConntrackOffDegrades(t *testing.T) {
	st := realStatusWith(t, false)
	if st.Health != daemon.HealthDegraded || !st.Healthy || len(st.Problems) != 0 {
		t.Fatalf("health %q healthy=%v problems %v, want degraded, no problems", st.Health, st.Healthy, st.Problems)
	}
	if len(st.Warnings) != 1 || !strings.Contains(st.Warnings[0], "conntrack off (--conntrack=false)") {
		t.Errorf("warnings %q, want conntrack off with its reason", st.Warnings)
	}
	if st.Conntrack.Enabled || st.Conntrack.Timestamps {
		t.Errorf("conntrack %+v, want off", st.Conntrack)
	}
	var b bytes.Buffer
	if err := printStatus(&b, &st, ""); err != nil {
		t.Fatal(err)
	}
	golden(t, "status-conntrack-off.txt", b.Bytes())
	for _, want := range []string{"Healthy:           DEGRADED: conntrack off (--conntrack=false)", "Conntrack:         OFF (--conntrack=false)"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status text lacks %q:\n%s", want, b.String())
		}
	}
}

// TestStatusProblemsInStableOrder: with several informers unsynced and the
// programs detached, every call lists the problems in the same order
// (informers by name), not in map order.
func TestStatusProblemsInStableOrder(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	d, err := daemon.New(daemon.Config{Node: "node-a", Namespace: "draind-system", Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, fake.NewClientset(), datapathtest.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"informer endpointslices not synced", "informer leases not synced", "informer pods not synced",
		"informer services not synced", "programs not attached", "not ready"}
	for range 50 {
		st := d.Status(daemon.StatusSource{})
		if !slices.Equal(st.Problems, want) {
			t.Fatalf("problems %q, want %q", st.Problems, want)
		}
		if st.Health != daemon.HealthUnhealthy || st.Healthy {
			t.Fatalf("health %q healthy=%v with problems", st.Health, st.Healthy)
		}
	}
}
