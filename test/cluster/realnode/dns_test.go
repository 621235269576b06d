package realnode_test

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/test/cluster/realnode"
)

const dnsAppName = "dns"

// dnsSleepSeconds is the kube-proxy-alone variant's preStop sleep: the
// 5 s CoreDNS waits after SIGTERM with kubeadm's default `lameduck 5s`,
// moved into a preStop so that both variants' servers stop the moment
// SIGTERM arrives.
const dnsSleepSeconds = 5

// dnsTail is how long the clients keep running after the last old pod is
// gone: a client still pinned to a gone backend shows it here.
const dnsTail = 5 * time.Second

// dnsWarm is how many lookups in a row each client must have had
// answered before the rollout starts.
const dnsWarm = 25

// dnsLinger is draind's --linger in the DNS rollout (see Install).
const dnsLinger = 20 * time.Second

var dnsClientKinds = []string{realnode.DNSClientGo, realnode.DNSClientSendto}

// dnsRollout is one `kubectl rollout restart` of the DNS Deployment.
type dnsRollout struct {
	variant   string // the namespace
	restarted time.Time
	took      time.Duration // restart → last old pod gone
	oldPods   []corev1.Pod
	// drainStart of each old pod: draind's DrainStarted, or the deletion.
	drainStart map[string]time.Time
	podOfIP    map[string]string
	// lookups of each client kind sent from the restart on, finished.
	lookups map[string][]realnode.Lookup
	errors  map[string][]string // the clients' first failures
}

// TestDNSRollout runs a rolling restart of a DNS Deployment (3 replicas of
// a miekg/dns server behind a ClusterIP Service on UDP 53) on the real
// node while two clients each look a name up 50 times a second with a 1 s
// timeout, one through Go's resolver (a connected UDP socket per query),
// one with sendto() on one unconnected socket (as glibc and musl do):
// first with kube-proxy alone (the pods' preStop a plain sleep), then with
// the shipped DaemonSet and the README's offline preStop. With draind no
// lookup may fail. Both variants run on one node; the table shows failed
// lookups per client kind and how long after each backend's drain start
// its answers stop.
func TestDNSRollout(t *testing.T) {
	requireRealNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	b := startDraindBed(ctx, t)
	n := b.n
	offlineSpec, err := realnode.MergeRecipe(realnode.DNSPodSpec(), b.recipe)
	if err != nil {
		t.Fatal(err)
	}
	if ps := offlineSpec.Containers[0].Lifecycle; ps == nil || ps.PreStop == nil || ps.PreStop.Exec == nil {
		t.Fatalf("the README's recipe did not give the DNS server an exec preStop: %+v", offlineSpec.Containers[0].Lifecycle)
	}

	var results []*dnsRollout
	// The table, also when a variant failed (before the node stops).
	t.Cleanup(func() { printDNSTable(t, results) })
	must := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	must("KubeProxyAlone", func(t *testing.T) {
		res := runDNSRollout(ctx, t, n, dnsVariant{namespace: "dns-kube-proxy", spec: realnode.DNSSleepPodSpec(dnsSleepSeconds)})
		results = append(results, res)
		// The comparison shows something only if kube-proxy alone loses
		// lookups: its conntrack entry keeps the sendto client's one
		// socket on its old backend until that pod leaves the slice.
		if len(failures(res.lookups[realnode.DNSClientSendto])) == 0 {
			t.Errorf("with kube-proxy alone the %s client lost no lookup: the rollout tests nothing", realnode.DNSClientSendto)
		}
		// The next variant runs alone: no clients or servers of this one.
		kubectl(ctx, t, n, "delete", "namespace", "dns-kube-proxy", "--timeout=2m")
	})
	must("Install", func(t *testing.T) {
		install(ctx, t, n, b.root, b.overlay)
		// A gone pod's steering lingers --linger (2 min) for stale
		// registry caches; a DNS client asks the ClusterIP, so a
		// shorter linger changes nothing for it but brings the hand-back
		// to kube-proxy's rules (steering ends) into the measured run.
		kubectl(ctx, t, n, "-n", "draind-system", "patch", "ds/draind", "--type=json",
			"-p", fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--linger=%v"}]`, dnsLinger))
		waitDraindRolledOut(ctx, t, n)
	})
	must("WithDraind", func(t *testing.T) {
		pinned, err := bpf.OpenPinned(bpf.DefaultPinDir)
		if err != nil {
			t.Fatalf("opening draind's pinned maps: %v", err)
		}
		defer pinned.Close()
		before, err := pinned.Dump()
		if err != nil {
			t.Fatal(err)
		}
		res := runDNSRollout(ctx, t, n, dnsVariant{namespace: "dns-draind", spec: offlineSpec, drainStarts: draindDrainStarts,
			settle: func(ctx context.Context, t *testing.T, server netip.AddrPort) {
				waitSteeringEnds(ctx, t, pinned, server)
			}})
		results = append(results, res)
		after, err := pinned.Dump()
		if err != nil {
			t.Fatal(err)
		}
		// The mechanisms were exercised: the Go resolver's connect()s and
		// the sendto client's datagrams to the ClusterIP were steered.
		conn := after.Counters.Get(bpf.OutSteeredClusterIP, bpf.IPv4) - before.Counters.Get(bpf.OutSteeredClusterIP, bpf.IPv4)
		dgram := after.DatagramCounters.Get(bpf.OutSteeredClusterIP, bpf.IPv4) - before.DatagramCounters.Get(bpf.OutSteeredClusterIP, bpf.IPv4)
		t.Logf("steered to a ClusterIP's backend during the rollout: %d connect()s, %d unconnected datagrams; every outcome (IPv4), connect()s: %s; datagrams: %s",
			conn, dgram, counterDiff(before.Counters, after.Counters), counterDiff(before.DatagramCounters, after.DatagramCounters))
		if conn == 0 {
			t.Errorf("no connect() to the DNS ClusterIP was steered during the rollout (the Go resolver's queries)")
		}
		if dgram == 0 {
			t.Errorf("no unconnected datagram to the DNS ClusterIP was steered during the rollout (the sendto client's queries)")
		}
		for _, kind := range dnsClientKinds {
			if f := failures(res.lookups[kind]); len(f) > 0 {
				t.Errorf("with draind the %s client had %d failed lookups (%s): %v", kind, len(f), failKinds(f), res.errors[kind])
			}
		}
		if t.Failed() {
			dnsDiagnostics(ctx, t, n, res)
		}
	})
	t.Logf("real-node figures: TestDNSRollout wall time (node start, images, both variants; Stop follows): %v", time.Since(start).Round(time.Second))
}

// dnsVariant is one side of the comparison.
type dnsVariant struct {
	namespace string
	spec      corev1.PodSpec // the DNS server's pods
	// drainStarts tells when each old pod's drain started; nil: its
	// deletion as the test's watch saw it (the API's deletionTimestamp has
	// whole seconds and lies a grace period ahead).
	drainStarts func(ctx context.Context, t *testing.T, n *realnode.Node, res *dnsRollout) map[string]time.Time
	// settle, if set, runs once the last old pod is gone, before the tail,
	// with the clients running.
	settle func(ctx context.Context, t *testing.T, server netip.AddrPort)
	// clientNode is the node the clients run on ("": the scheduler's choice).
	clientNode string
}

// runDNSRollout deploys the DNS server (3 replicas of spec) and its
// Service in namespace, starts both clients, runs `kubectl rollout
// restart`, waits until the last old pod is gone (and settle) plus dnsTail,
// and returns what the clients saw from the restart on.
func runDNSRollout(ctx context.Context, t *testing.T, n *realnode.Node, v dnsVariant) *dnsRollout {
	t.Helper()
	namespace, spec := v.namespace, v.spec
	cs := n.Cluster.Admin
	dep, svc := realnode.DNSObjects(namespace, dnsAppName, 3, spec)
	svc = deploy(ctx, t, n, namespace, dep, svc)
	res := &dnsRollout{variant: namespace, lookups: map[string][]realnode.Lookup{}, errors: map[string][]string{}}
	res.oldPods = podsOf(ctx, t, n, namespace, dnsAppName)
	if len(res.oldPods) != 3 {
		t.Fatalf("want 3 DNS pods before the rollout, have %d", len(res.oldPods))
	}
	vip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil {
		t.Fatal(err)
	}
	server := netip.AddrPortFrom(vip, realnode.DNSPort)
	for _, kind := range dnsClientKinds {
		cp := realnode.DNSClientPod(namespace, kind, server)
		cp.Spec.NodeName = v.clientNode
		if _, err := cs.CoreV1().Pods(namespace).Create(ctx, cp, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubectl(ctx, t, n, "-n", namespace, "wait", "pod", "-l", "role=dns-client", "--for=condition=Ready", "--timeout=2m")
	clientIP := map[string]string{}
	for _, kind := range dnsClientKinds {
		p, err := cs.CoreV1().Pods(namespace).Get(ctx, "dns-client-"+kind, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		clientIP[kind] = p.Status.PodIP
	}
	// Warm: each client's last dnsWarm finished lookups were answered. A
	// client may start before kube-proxy has the Service's rules (its
	// first lookups refused); only lookups from the restart on count.
	deadline := time.Now().Add(time.Minute)
	for {
		ok := true
		var last map[string][]realnode.Lookup
		for _, kind := range dnsClientKinds {
			ls, err := n.ReadLookups(ctx, clientIP[kind], 0)
			if err != nil {
				t.Fatal(err)
			}
			var done []realnode.Lookup
			for _, l := range ls {
				if !l.Pending() {
					done = append(done, l)
				}
			}
			done = done[max(0, len(done)-dnsWarm):]
			ok = ok && len(done) == dnsWarm && len(failures(done)) == 0
			if last == nil {
				last = map[string][]realnode.Lookup{}
			}
			last[kind] = done
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			for kind, done := range last {
				t.Logf("the %s client's last lookups: %d finished, failures %s", kind, len(done), failKinds(failures(done)))
			}
			t.Fatalf("DNS clients not answering %d lookups in a row within a minute", dnsWarm)
		}
		time.Sleep(200 * time.Millisecond)
	}

	deletions := watchDeletions(ctx, t, n, namespace, dnsAppName)
	res.restarted = time.Now()
	kubectl(ctx, t, n, "-n", namespace, "rollout", "restart", "deploy/"+dnsAppName)
	kubectl(ctx, t, n, "-n", namespace, "rollout", "status", "deploy/"+dnsAppName, "--timeout=4m")
	old := map[string]bool{}
	for _, p := range res.oldPods {
		old[p.Name] = true
	}
	var newPods []corev1.Pod
	for {
		left := 0
		newPods = nil
		for _, p := range podsOf(ctx, t, n, namespace, dnsAppName) {
			if old[p.Name] {
				left++
			} else {
				newPods = append(newPods, p)
			}
		}
		if left == 0 {
			break
		}
		if time.Since(res.restarted) > 4*time.Minute {
			t.Fatalf("old DNS pods still there 4 minutes after the restart")
		}
		time.Sleep(100 * time.Millisecond)
	}
	res.took = time.Since(res.restarted)
	if v.settle != nil {
		v.settle(ctx, t, server)
	}
	time.Sleep(dnsTail)
	readAt := time.Now()

	// Backends are named by the address they answer with: pod IPs must
	// not have been reused within the rollout.
	res.podOfIP = map[string]string{}
	for _, p := range append(slices.Clone(res.oldPods), newPods...) {
		if other, dup := res.podOfIP[p.Status.PodIP]; dup {
			t.Fatalf("pods %s and %s had the same IP %s: answers cannot name their backend", other, p.Name, p.Status.PodIP)
		}
		res.podOfIP[p.Status.PodIP] = p.Name
	}
	for _, kind := range dnsClientKinds {
		all, err := n.ReadLookups(ctx, clientIP[kind], 0)
		if err != nil {
			t.Fatal(err)
		}
		st, err := n.ReadClientStats(ctx, clientIP[kind])
		if err != nil {
			t.Fatal(err)
		}
		res.errors[kind] = st.Errors
		var ls []realnode.Lookup
		for _, l := range all {
			if l.Time().Before(res.restarted) {
				continue
			}
			if l.Pending() {
				// Lookups sent a moment ago may still be waiting; one
				// waiting longer than its timeout was lost by the client.
				if readAt.Sub(l.Time()) > 2*realnode.DNSTimeout {
					l.Fail = "never-finished"
				} else {
					continue
				}
			}
			if l.Backend != "" {
				if _, ok := res.podOfIP[l.Backend]; !ok {
					t.Errorf("the %s client got an answer naming %s, no pod of the Deployment", kind, l.Backend)
				}
			}
			ls = append(ls, l)
		}
		res.lookups[kind] = ls
		if answered(ls) == 0 {
			t.Errorf("the %s client had no answer during the rollout", kind)
		}
	}
	if v.drainStarts != nil {
		res.drainStart = v.drainStarts(ctx, t, n, res)
	} else {
		res.drainStart = deletions()
	}
	for _, p := range res.oldPods {
		if _, ok := res.drainStart[p.Name]; !ok {
			t.Errorf("no drain start for old pod %s", p.Name)
		}
	}
	t.Logf("%s: rollout took %v; %s", namespace, res.took.Round(time.Millisecond), dnsSummary(res))
	return res
}

// waitSteeringEnds waits until draind steers server no more: its
// frontend leaves the map when the last old pod's linger ends, and the
// clients' datagrams go back to kube-proxy's rules.
func waitSteeringEnds(ctx context.Context, t *testing.T, pinned *bpf.Pinned, server netip.AddrPort) {
	began := time.Now()
	for {
		d, err := pinned.Dump()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, f := range d.Frontends {
			found = found || (f.Key.Addr == server.Addr() && f.Key.Port == server.Port())
		}
		if !found {
			t.Logf("draind steered %s no more %v after the last old pod was gone", server, time.Since(began).Round(100*time.Millisecond))
			return
		}
		if time.Since(began) > 5*time.Minute {
			t.Fatalf("draind still steers %s 5 minutes after the rollout", server)
		}
		sleepCtx(ctx, 500*time.Millisecond)
	}
}

// podsOf lists the pods of an app (terminating ones included) by name.
func podsOf(ctx context.Context, t *testing.T, n *realnode.Node, namespace, app string) []corev1.Pod {
	t.Helper()
	pods, err := n.Cluster.Admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items
}

// watchDeletions watches an app's pods and returns a function that stops
// the watch and tells when each pod was first seen with a deletion
// timestamp (the test's clock, which is the clients' clock: one host).
func watchDeletions(ctx context.Context, t *testing.T, n *realnode.Node, namespace, app string) func() map[string]time.Time {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	var mu sync.Mutex
	seen := map[string]time.Time{}
	list, err := n.Cluster.Admin.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	rv := list.ResourceVersion
	done := make(chan struct{})
	go func() {
		defer close(done)
		for wctx.Err() == nil {
			w, err := n.Cluster.Admin.CoreV1().Pods(namespace).Watch(wctx, metav1.ListOptions{LabelSelector: "app=" + app, ResourceVersion: rv})
			if err != nil {
				sleepCtx(wctx, 100*time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					// An error (after an apiserver restart: the resource
					// version is too old): list again, and note the
					// deletions the list shows from now.
					if list, err := n.Cluster.Admin.CoreV1().Pods(namespace).List(wctx, metav1.ListOptions{LabelSelector: "app=" + app}); err == nil {
						rv = list.ResourceVersion
						mu.Lock()
						for _, p := range list.Items {
							if _, ok := seen[p.Name]; !ok && p.DeletionTimestamp != nil {
								seen[p.Name] = time.Now()
							}
						}
						mu.Unlock()
					}
					break
				}
				rv = p.ResourceVersion
				if p.DeletionTimestamp != nil {
					mu.Lock()
					if _, ok := seen[p.Name]; !ok {
						seen[p.Name] = time.Now()
					}
					mu.Unlock()
				}
			}
			w.Stop()
		}
	}()
	return func() map[string]time.Time {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// draindDrainStarts takes each old pod's drain start from draind: its
// DrainStarted Event must exist, and the time is draind's log line
// recorded with it ("drain started"; the Event's own timestamps have
// whole seconds).
func draindDrainStarts(ctx context.Context, t *testing.T, n *realnode.Node, res *dnsRollout) map[string]time.Time {
	evs, err := n.Cluster.Admin.CoreV1().Events(res.variant).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]corev1.Event{}
	for _, e := range evs.Items {
		if e.Source.Component == "draind" && e.Reason == hosted.EventDrainStarted {
			events[e.InvolvedObject.Name] = e
		}
	}
	logged := draindLogTimes(ctx, t, n, "drain started")
	out := map[string]time.Time{}
	for _, p := range res.oldPods {
		ev, ok := events[p.Name]
		if !ok {
			t.Errorf("old pod %s has no DrainStarted Event from draind", p.Name)
			continue
		}
		at, ok := logged[res.variant+"/"+p.Name]
		if !ok {
			t.Errorf("draind's log has no \"drain started\" for %s", p.Name)
			continue
		}
		if d := at.Sub(ev.FirstTimestamp.Time); d < -time.Second || d > 2*time.Second {
			t.Errorf("draind logged the drain start of %s at %v, its DrainStarted Event says %v", p.Name, at, ev.FirstTimestamp.Time)
		}
		out[p.Name] = at
	}
	return out
}

// draindLogTimes returns when draind first logged msg for each pod
// (namespace/name).
func draindLogTimes(ctx context.Context, t *testing.T, n *realnode.Node, msg string) map[string]time.Time {
	logs, err := n.Kubectl(ctx, "-n", "draind-system", "logs", "ds/draind", "--all-containers", "--prefix=false")
	if err != nil {
		t.Fatalf("kubectl logs ds/draind: %v", err)
	}
	out := map[string]time.Time{}
	for _, rec := range draindRecords(logs) {
		if rec.Msg != msg || rec.Pod == "" {
			continue
		}
		if _, ok := out[rec.Pod]; !ok {
			out[rec.Pod] = rec.Time
		}
	}
	return out
}

// draindRecord is one line of draind's JSON log: the fields the tests read.
type draindRecord struct {
	Time    time.Time `json:"time"`
	Msg     string    `json:"msg"`
	Pod     string    `json:"pod"` // namespace/name
	Reason  string    `json:"reason"`
	Seconds float64   `json:"seconds"`
}

// draindRecords parses draind's JSON log, skipping lines that are not.
func draindRecords(logs []byte) []draindRecord {
	var out []draindRecord
	for _, line := range strings.Split(string(logs), "\n") {
		var rec draindRecord
		if json.Unmarshal([]byte(line), &rec) == nil {
			out = append(out, rec)
		}
	}
	return out
}

func answered(ls []realnode.Lookup) int {
	n := 0
	for _, l := range ls {
		if l.Backend != "" {
			n++
		}
	}
	return n
}

func failures(ls []realnode.Lookup) []realnode.Lookup {
	var out []realnode.Lookup
	for _, l := range ls {
		if l.Fail != "" {
			out = append(out, l)
		}
	}
	return out
}

// failKinds formats failures by class: "timeout=3 wrong-source=1", or "-".
func failKinds(fs []realnode.Lookup) string {
	st := realnode.ClientStats{Fails: map[string]int{}}
	for _, f := range fs {
		st.Fails[f.Fail]++
	}
	return st.FailKinds()
}

// stopTimes returns, for each old pod the client was using when its drain
// started (an answer from it in the second before), how long after the
// drain start its last answer to the client was sent (0 if none after),
// and how many lookups it answered after its drain start.
func stopTimes(res *dnsRollout, kind string) (stops []time.Duration, after int) {
	for _, p := range res.oldPods {
		start, ok := res.drainStart[p.Name]
		if !ok {
			continue
		}
		inUse := false
		var last time.Time
		for _, l := range res.lookups[kind] {
			if l.Backend != p.Status.PodIP {
				continue
			}
			at := l.Time()
			if !at.Before(start.Add(-time.Second)) && at.Before(start) {
				inUse = true
			}
			if at.After(start) {
				after++
			}
			if at.After(last) {
				last = at
			}
		}
		if inUse {
			stops = append(stops, max(0, last.Sub(start)))
		}
	}
	slices.Sort(stops)
	return stops, after
}

// failureOffsets returns the range of the failures' times after the drain
// start of the backend that last answered the client before each (the
// backend the client was on), or else after the latest drain start before
// it, or else after the restart.
func failureOffsets(res *dnsRollout, ls []realnode.Lookup) string {
	ipStart := map[string]time.Time{}
	var starts []time.Time
	for _, p := range res.oldPods {
		if s, ok := res.drainStart[p.Name]; ok {
			ipStart[p.Status.PodIP] = s
			starts = append(starts, s)
		}
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b realnode.Lookup) int { return cmp.Compare(a.At, b.At) })
	lo, hi := time.Duration(1<<62), time.Duration(-1<<62)
	lastBackend, n := "", 0
	for _, l := range ls {
		if l.Backend != "" {
			lastBackend = l.Backend
			continue
		}
		if l.Fail == "" {
			continue
		}
		ref := res.restarted
		if s, ok := ipStart[lastBackend]; ok && !s.After(l.Time()) {
			ref = s
		} else {
			for _, s := range starts {
				if !s.After(l.Time()) {
					ref = s
				}
			}
		}
		d := l.Time().Sub(ref)
		lo, hi, n = min(lo, d), max(hi, d), n+1
	}
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("sent %v…%v after the drain start of the backend last answering", lo.Round(10*time.Millisecond), hi.Round(10*time.Millisecond))
}

func durRange(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%v–%v (%d)", ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond), len(ds))
}

func dnsSummary(res *dnsRollout) string {
	var parts []string
	for _, k := range dnsClientKinds {
		fs := failures(res.lookups[k])
		parts = append(parts, fmt.Sprintf("%s: answered=%d failed=%d (%s) %s", k, answered(res.lookups[k]), len(fs), failKinds(fs), failureOffsets(res, res.lookups[k])))
	}
	return strings.Join(parts, "; ")
}

func printDNSTable(t *testing.T, results []*dnsRollout) {
	var b strings.Builder
	b.WriteString("\n| variant | rollout | client | lookups | failed | drain start → last answer, per old backend in use (min–max, count) | answers after drain start |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, k := range dnsClientKinds {
			ls := r.lookups[k]
			fs := failures(ls)
			stops, after := stopTimes(r, k)
			failed := fmt.Sprintf("%d", len(fs))
			if len(fs) > 0 {
				failed += fmt.Sprintf(" (%s; %s)", failKinds(fs), failureOffsets(r, ls))
			}
			fmt.Fprintf(&b, "| %s | %v | %s | %d | %s | %s | %d |\n", r.variant, r.took.Round(100*time.Millisecond), k, len(ls), failed, durRange(stops), after)
		}
	}
	t.Logf("DNS rollout figures (3 replicas, kubectl rollout restart, 2 clients × 50 lookups/s, 1 s timeout):%s", b.String())
}

// counterDiff formats the IPv4 outcome counters that changed.
func counterDiff(before, after bpf.Counters) string {
	var parts []string
	for o := bpf.Outcome(0); int(o) < bpf.NumOutcomes; o++ {
		if d := after.Get(o, bpf.IPv4) - before.Get(o, bpf.IPv4); d != 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", o, d))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// dnsDiagnostics prints what says why a lookup failed with draind: its
// log, `draind status`, `draind bpf dump` and the node's UDP conntrack
// entries to port 53.
func dnsDiagnostics(ctx context.Context, t *testing.T, n *realnode.Node, res *dnsRollout) {
	for _, p := range res.oldPods {
		t.Logf("old pod %s: %s, drain start %s", p.Name, p.Status.PodIP, res.drainStart[p.Name].UTC().Format("15:04:05.000"))
	}
	for ip, name := range res.podOfIP {
		t.Logf("pod %s: %s", name, ip)
	}
	// Each failure with the lookups around it: which backends the client
	// was on before and after.
	for _, kind := range dnsClientKinds {
		ls := slices.Clone(res.lookups[kind])
		slices.SortFunc(ls, func(a, b realnode.Lookup) int { return cmp.Compare(a.At, b.At) })
		for _, f := range failures(ls) {
			var b strings.Builder
			for _, l := range ls {
				if d := l.Time().Sub(f.Time()); d >= -300*time.Millisecond && d <= 300*time.Millisecond {
					what := l.Backend
					if l.Fail != "" {
						what = "FAILED " + l.Fail
					}
					fmt.Fprintf(&b, "  %s (%+6dms) took %6.1fms %s\n", l.Time().UTC().Format("15:04:05.000"), d.Milliseconds(), float64(l.Took)/1e6, what)
				}
			}
			t.Logf("%s client, lookups around the failure sent at %s:\n%s", kind, f.Time().UTC().Format("15:04:05.000"), b.String())
		}
	}
	for _, args := range [][]string{
		{"-n", "draind-system", "logs", "ds/draind"},
		{"-n", "draind-system", "exec", "ds/draind", "--", "draind", "status"},
		{"-n", "draind-system", "exec", "ds/draind", "--", "draind", "bpf", "dump"},
	} {
		out, err := n.Kubectl(ctx, args...)
		t.Logf("kubectl %s (%v):\n%s", strings.Join(args, " "), err, out)
	}
	out, err := n.InNode(ctx, "conntrack", "-L", "-p", "udp", "--dport", "53")
	t.Logf("conntrack -L -p udp --dport 53 in the node namespace (%v):\n%s", err, out)
}
