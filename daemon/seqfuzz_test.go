package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/conntrack/conntracktest"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/model"
	"github.com/draind/draind/k8s"
)

// The sequence differential test: a daemon fed a random sequence of
// events (EndpointSlices, pods, drain Leases, offline and online calls,
// clock steps, failed datapath writes) keeps incremental caches (the
// model's contributions, claims, the Lease trust, the gone peers, the
// reconciler's view of the datapath; see the declarations that say "checked
// by FuzzSequenceDifferential"). After every pass its datapath (drain
// entries, frontends, backends, the socket hooks' gone peers) must equal
// the one a fresh daemon writes from the final state alone, at the same
// instant.

// The universe the operations pick from: small, so that sequences collide
// (IPs reused by other pods, a pod listed by two Services, a Lease for a
// pod a slice lists elsewhere).
var (
	seqIPs      = []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}
	seqNodes    = []string{testNode, "node-b"}
	seqSlices   = []struct{ name, svc string }{{"a-1", "a"}, {"a-2", "a"}, {"b-1", "b"}}
	seqPolicies = []string{"", "rewrite", "refuse", "off"}
	seqSteps    = []time.Duration{time.Second, 10 * time.Second, time.Minute, 3 * time.Minute, 10 * time.Minute}
)

const seqPods = 4 // pod identities: uid "u<i>", name "pod-u<i>"

func seqUID(i int) types.UID { return types.UID(fmt.Sprintf("u%d", i)) }

// seqReader decodes the fuzzer's bytes: each read takes the next byte (0
// once they are used up), so that every input is a valid sequence.
type seqReader struct {
	b []byte
	i int
}

func (r *seqReader) more() bool { return r.i < len(r.b) }

func (r *seqReader) next(n int) int {
	if r.i >= len(r.b) {
		return 0
	}
	v := int(r.b[r.i])
	r.i++
	return v % n
}

// seqServices are the Services both daemons see from the start: two, each
// with one TCP port, so that a pod can be listed by both.
func seqServices() []*corev1.Service {
	return []*corev1.Service{
		svc("a", []string{"10.96.0.1"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}),
		svc("b", []string{"10.96.0.2"}, []corev1.ServicePort{port("http", 80, corev1.ProtocolTCP)}),
	}
}

// seqSlice builds slice s's next version: up to four endpoints, each a pod
// identity at an IP of the pool, on a node, ready, serving-terminating,
// terminating or not ready.
func seqSlice(r *seqReader, s int) *discoveryv1.EndpointSlice {
	var eps []epSpec
	seen := map[string]bool{}
	for n := r.next(5); n > 0; n-- {
		uid := string(seqUID(r.next(seqPods)))
		ip := seqIPs[r.next(len(seqIPs))]
		var e epSpec
		switch r.next(4) {
		case 0:
			e = ready(ip, uid)
		case 1:
			e = terminating(ip, uid)
		case 2:
			e = notReady(ip, uid)
			e.terminating = true
		default:
			e = notReady(ip, uid)
		}
		e = onNode(e, seqNodes[r.next(len(seqNodes))])
		if seen[ip] { // one endpoint per address in a slice, as the controller writes
			continue
		}
		seen[ip] = true
		eps = append(eps, e)
	}
	return slice(seqSlices[s].name, seqSlices[s].svc, v4, httpPorts(8080), eps...)
}

// seqRun is one sequence in progress.
type seqRun struct {
	t *testing.T
	h *harness
	// sd is h's datapath with the socket hooks (its gone peers).
	sd *datapathtest.Sockets
	// ops is the sequence so far, for failure messages.
	ops []string
	// apiLeaseEvents counts the Lease events the API sent (watchLeases).
	apiLeaseEvents atomic.Uint64
	// deleted are the pod identities deleted from the API, or named by a
	// Lease while they did not exist: a pod UID is never created (again).
	deleted map[int]bool
}

// putPod creates a pod identity's pod, at a free IP of the pool, or marks
// an existing one deleting, or a deleting one finished. As in a cluster, a
// pod keeps its IP and node for its life, its deletion cannot be undone,
// and no two live pods hold an IP at once (a pod's IP is reused only once
// the pod is deleted or has finished: the kubelet may give a finished
// pod's IP to a new one while the finished pod is still listed).
func (s *seqRun) putPod(r *seqReader) {
	h := s.h
	i, ip, node := r.next(seqPods), seqIPs[r.next(len(seqIPs))], seqNodes[r.next(len(seqNodes))]
	name := "pod-" + string(seqUID(i))
	if s.deleted[i] {
		return
	}
	if p, err := h.client.CoreV1().Pods("default").Get(h.ctx, name, metav1.GetOptions{}); err == nil {
		if p.DeletionTimestamp != nil {
			if p.Status.Phase != corev1.PodSucceeded {
				p.Status.Phase = corev1.PodSucceeded
				s.logf("pod %s finished", name)
				h.putPod(p)
			}
			return
		}
		ts := metav1.NewTime(h.clock.Now())
		p.DeletionTimestamp = &ts
		s.logf("pod %s deleting", name)
		h.putPod(p)
		return
	}
	list, err := h.client.CoreV1().Pods("default").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.Status.PodIP == ip && p.Status.Phase != corev1.PodSucceeded {
			return
		}
	}
	p := pod(name, string(seqUID(i)), ip)
	p.Spec.NodeName = node
	s.logf("put pod %s ip %s node %s", name, ip, node)
	h.putPod(p)
}

func (s *seqRun) logf(format string, args ...any) {
	s.ops = append(s.ops, fmt.Sprintf(format, args...))
}

// step decodes and applies one operation; it reports whether it was a
// pass (after which the datapaths are compared) and whether that pass may
// have had a failed write.
func (s *seqRun) step(r *seqReader) (passed, failed bool) {
	h := s.h
	switch op := r.next(12); op {
	case 0, 1:
		i := r.next(len(seqSlices))
		sl := seqSlice(r, i)
		s.logf("put slice %s %s", sl.Name, describeSlice(sl))
		h.putSlice(sl)
	case 2:
		i := r.next(len(seqSlices))
		if _, err := h.client.DiscoveryV1().EndpointSlices("default").Get(h.ctx, seqSlices[i].name, metav1.GetOptions{}); err != nil {
			return false, false
		}
		s.logf("delete slice %s", seqSlices[i].name)
		h.deleteSlice("default", seqSlices[i].name)
	case 3:
		s.putPod(r)
	case 4:
		i := r.next(seqPods)
		name := "pod-" + string(seqUID(i))
		if _, err := h.client.CoreV1().Pods("default").Get(h.ctx, name, metav1.GetOptions{}); err != nil {
			return false, false
		}
		s.logf("delete pod %s", name)
		h.deletePod("default", name)
		s.deleted[i] = true
	case 5:
		s.putLease(r)
	case 6:
		uid := seqUID(r.next(seqPods))
		if _, err := h.client.CoordinationV1().Leases(testNS).Get(h.ctx, k8s.LeaseName(uid), metav1.GetOptions{}); err != nil {
			return false, false
		}
		s.logf("delete lease of %s", uid)
		h.deleteLease(uid)
	case 7:
		ip := netip.MustParseAddr(seqIPs[r.next(len(seqIPs))])
		online := r.next(2) == 1
		s.logf("offline call from %s (online %v)", ip, online)
		s.leaseCall(func() {
			if online {
				h.d.Online(h.ctx, ip)
			} else {
				h.d.Offline(h.ctx, ip, 0, 0)
			}
		})
	case 8:
		i, v := r.next(2), seqPolicies[r.next(len(seqPolicies))]
		sv := seqServices()[i]
		if v != "" {
			withAnnotation(v)(sv)
		}
		s.logf("service %s policy %q", sv.Name, v)
		h.do(&h.d.events.services, 1, func(ctx context.Context) error {
			_, err := h.client.CoreV1().Services("default").Update(ctx, sv, metav1.UpdateOptions{})
			return err
		})
	case 9:
		d := seqSteps[r.next(len(seqSteps))]
		s.logf("clock +%v", d)
		h.clock.Step(d)
	case 10:
		n := 1 + r.next(3)
		s.logf("pass, %d writes fail", n)
		h.dp.FailNext = n
		s.sd.SetUpsertErr(errors.New("injected: gone peer map full"))
		h.pass()
		failed = true // a gone peer's write failed, or may have
		h.dp.FailNext = 0
		s.sd.SetUpsertErr(nil)
		s.settle()
		return true, failed
	default:
		s.logf("pass")
		h.pass()
		s.settle()
		return true, false
	}
	return false, false
}

// putLease writes a drain Lease as a node or draind drain would: for a pod
// identity, held by a node, with IPs of the pool, a reason, maybe the
// steer-pod-ip annotation or the gone state, and a duration.
func (s *seqRun) putLease(r *seqReader) {
	h := s.h
	i := r.next(seqPods)
	req := k8s.DrainRequest{PodNamespace: "default", PodName: "pod-" + string(seqUID(i)), PodUID: seqUID(i),
		Node: seqNodes[r.next(len(seqNodes))], Duration: []time.Duration{15 * time.Second, time.Minute, 10 * time.Minute}[r.next(3)]}
	for _, ip := range seqIPs {
		if r.next(2) == 1 {
			req.IPs = append(req.IPs, netip.MustParseAddr(ip))
		}
	}
	req.Reason = []string{k8s.ReasonOffline, k8s.ReasonOperator, k8s.ReasonPodDeleting}[r.next(3)]
	switch r.next(3) {
	case 1:
		req.SteerPodIP = true
	case 2:
		req.State = StateGone
	}
	if req.Node == testNode && s.hosts(req.PodUID) {
		return // this node's draind alone writes the Lease of a drain it holds
	}
	l := req.Lease(testNS, h.clock.Now())
	if _, err := h.client.CoreV1().Pods("default").Get(h.ctx, req.PodName, metav1.GetOptions{}); err != nil && !s.deleted[i] {
		// A Lease of a pod that does not exist: a node writes one only
		// for a pod it hosts, and a pod UID cannot be guessed, so this
		// pod identity is never created from now on (a Lease check that
		// found it missing stays right).
		s.logf("pod %s will never exist", req.PodName)
		s.deleted[i] = true
	}
	s.logf("put lease of %s holder %s ips %v reason %s steer %v state %q for %v", req.PodUID, req.Node, req.IPs, req.Reason, req.SteerPodIP, req.State, req.Duration)
	h.do(&h.d.events.leases, 1, func(ctx context.Context) error {
		api := h.client.CoordinationV1().Leases(testNS)
		if _, err := api.Get(ctx, l.Name, metav1.GetOptions{}); err == nil {
			_, err = api.Update(ctx, l, metav1.UpdateOptions{})
			return err
		}
		_, err := api.Create(ctx, l, metav1.CreateOptions{})
		return err
	})
}

// hosts reports whether this node's draind holds a drain of the pod.
func (s *seqRun) hosts(uid types.UID) bool {
	_, ok := s.h.d.hosted.Progress()[uid]
	return ok
}

// leaseCall runs an offline or online call, or the hosted drains' own
// work, and waits for the daemon's informer to see every Lease write it
// made.
func (s *seqRun) leaseCall(call func()) {
	call()
	s.syncLeases()
}

// syncLeases waits until the daemon's Lease handler has seen every write
// of a Lease the API made (watchLeases counts them).
func (s *seqRun) syncLeases() {
	if !s.h.holds(func() bool { return s.h.d.events.leases.Load() == s.apiLeaseEvents.Load() && s.leasesCached() }) {
		s.t.Fatalf("the daemon saw %d Lease events, the API made %d\nops %v", s.h.d.events.leases.Load(), s.apiLeaseEvents.Load(), s.ops)
	}
}

// leasesCached reports whether the daemon's Lease cache holds the API's
// drain and claim Leases, as last written.
func (s *seqRun) leasesCached() bool {
	list, err := s.h.client.CoordinationV1().Leases(testNS).List(s.h.ctx, metav1.ListOptions{})
	if err != nil {
		return false
	}
	have := map[string]string{}
	snap := s.h.d.drainLeasesNow()
	for _, l := range append(slices.Clone(snap.list), snap.claims...) {
		have[l.Name] = fmt.Sprint(l.Renewed.UTC())
	}
	n := 0
	for _, l := range list.Items {
		if _, err := k8s.ParseLease(&l); err != nil {
			continue // not a drain or claim Lease the informer keeps
		}
		n++
		if have[l.Name] != fmt.Sprint(l.Spec.RenewTime.UTC()) {
			return false
		}
	}
	return n == len(have)
}

// watchLeases counts the API's Lease events from now on, until the test
// ends.
func (s *seqRun) watchLeases() {
	w, err := s.h.client.CoordinationV1().Leases(testNS).Watch(s.h.ctx, metav1.ListOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range w.ResultChan() {
			s.apiLeaseEvents.Add(1)
		}
	}()
	s.t.Cleanup(func() { w.Stop(); <-done })
}

// settle lets the hosted drains do their part (drains of deleted pods,
// Lease writes), as their loop would after a pass, and passes again until
// the daemon has taken in every Lease write it made.
func (s *seqRun) settle() {
	h := s.h
	for range 3 {
		before := s.apiLeaseEvents.Load()
		h.d.hosted.Reconcile(h.ctx)
		h.d.leaseWriter.Flush(h.ctx)
		s.syncLeases()
		h.pass() // the pass the hosted drains ask for
		if s.apiLeaseEvents.Load() == before {
			return
		}
	}
}

func describeSlice(s *discoveryv1.EndpointSlice) string {
	var b strings.Builder
	for _, e := range s.Endpoints {
		fmt.Fprintf(&b, "[%s %s r=%v s=%v t=%v %s] ", e.Addresses[0], e.TargetRef.UID, *e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating, *e.NodeName)
	}
	return b.String()
}

// freshDatapath starts a second daemon over the same API objects and
// clock, with an empty datapath, runs its first passes as Run would, and
// returns it and its datapath.
func (s *seqRun) freshDatapath() (*Daemon, *datapathtest.Sockets) {
	h := s.h
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	sd := datapathtest.NewSockets(h.clock.Now())
	dp := sd.Datapath
	d := mustNew(s.t, h.d.cfg, h.client, sd, conntracktest.New())
	d.hosted.Start()
	defer d.hosted.Stop("the comparison is over")
	if err := d.adoptDatapath(); err != nil {
		s.t.Fatal(err)
	}
	startSynced(s.t, ctx, d)
	d.checkLeases(ctx)
	fh := &harness{t: s.t, client: h.client, dp: dp, clock: h.clock, d: d, ctx: ctx}
	fh.pass()
	// The hosted drains' first round, as their loop runs it at start: it
	// takes this node's own Leases of its pods back. Its Lease writes stay
	// queued (the writer is not flushed): the fresh daemon only reads.
	d.hosted.Reconcile(ctx)
	fh.pass()
	return d, sd
}

// seqHarness is newHarness without its API fault reactors, over a
// datapath with the socket hooks, started as fast as the informers allow
// (this test starts many daemons).
func seqHarness(t *testing.T) (*harness, *datapathtest.Sockets) {
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	sd := datapathtest.NewSockets(clk.Now())
	h := &harness{t: t, client: fake.NewClientset(), dp: sd.Datapath, ct: conntracktest.New(), clock: clk}
	h.d = mustNew(t, Config{Node: testNode, Namespace: testNS, Clock: h.clock, RegistryOnlyPolicy: bpf.PolicyRefuse,
		Logger: slog.New(slog.DiscardHandler)}, h.client, sd, h.ct)
	h.d.hosted.Start()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		h.d.hosted.Stop("the test is over")
	})
	h.ctx = ctx
	startSynced(t, ctx, h.d)
	return h, sd
}

// startSynced runs d's informers and waits for them and d's handlers to
// sync (in the bubble: until every goroutine waits; client-go's
// WaitForCacheSync would look every 100 ms of the bubble's clock), then
// marks d synced and attached.
func startSynced(t *testing.T, ctx context.Context, d *Daemon) {
	t.Helper()
	go d.inf.RunAndWait(ctx)
	synctest.Wait()
	for name, ok := range d.inf.Synced() {
		if !ok {
			t.Fatalf("the %s informer did not sync", name)
		}
	}
	if !d.handlersSynced() {
		t.Fatal("the handlers did not sync")
	}
	d.synced.Store(true)
	d.SetAttached(true)
}

// renderDatapath renders the datapath d wrote, but for what history
// alone decides:
//   - service-port ids (allocation order) are named by the Service port
//     d's status view shows for them (Service, port, protocol, family);
//   - deadlines (Expires) are when an entry was last written or refreshed;
//   - the keys in skip, and the service-ports named in skipSP, are left
//     out (see historyKeys and historyServicePorts), and the gone peers at
//     an address whose all-ports keys are skipped;
//   - a gone peer's times (when this node first saw its pod gone).
func renderDatapath(d *Daemon, sd *datapathtest.Sockets, skip map[bpf.EndpointKey]bool, skipSP map[string]bool) string {
	dump, _ := sd.Dump()
	sps := map[bpf.ServicePortID]string{}
	for _, sp := range d.model.ServicePortStatuses() {
		sps[sp.ID] = servicePortName(sp)
	}
	keyOf := func(id bpf.ServicePortID) (string, bool) {
		name, ok := sps[id]
		return name, ok
	}
	skipped := func(id bpf.ServicePortID) bool {
		k, ok := keyOf(id)
		return ok && skipSP[k]
	}
	name := func(id bpf.ServicePortID) string {
		if id == 0 {
			return "-"
		}
		if k, ok := keyOf(id); ok {
			return "{" + k + "}"
		}
		return fmt.Sprintf("{unknown id %d}", id)
	}
	var lines []string
	for _, f := range dump.Frontends {
		if skipped(f.Service) {
			continue
		}
		lines = append(lines, fmt.Sprintf("frontend %v -> %s nosteer=%v", f.Key, name(f.Service), f.NoSteer))
	}
	for _, b := range dump.Backends {
		if skipped(b.Service) {
			continue
		}
		lines = append(lines, fmt.Sprintf("backends %s: %v", name(b.Service), b.Backends))
	}
	for _, dr := range dump.Drains {
		if skip[dr.Key] {
			continue
		}
		svc := name(dr.Service)
		if dr.Policy != bpf.PolicyRewrite {
			// Kept for accounting only: of several service-ports the entry
			// could rewrite to, the first by key (Model.rewritesFirst).
			svc = "(accounting)"
		}
		lines = append(lines, fmt.Sprintf("drain %v -> %s %v", dr.Key, svc, dr.Policy))
	}
	for _, a := range sd.GonePeers() {
		if !skip[bpf.EndpointKey{Addr: a, Proto: bpf.TCP}] {
			lines = append(lines, fmt.Sprintf("gone peer %v", a))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// FuzzSequenceDifferential: after every pass of a random event sequence,
// the daemon's datapath is the one a fresh daemon writes from the final
// state alone (see renderDatapath and historyKeys for what is left out).
func FuzzSequenceDifferential(f *testing.F) {
	for _, seed := range seqSeeds() {
		f.Add(seed)
	}
	f.Fuzz(runSequence)
}

// runSequence decodes data into a sequence of operations and runs it,
// comparing after every pass.
func runSequence(t *testing.T, data []byte) {
	synctest.Test(t, func(t *testing.T) {
		if msg := sequenceDivergence(t, data); msg != "" {
			t.Fatal(msg)
		}
	})
}

// sequenceDivergence runs the sequence data decodes to and returns the
// first divergence found, "" if none.
func sequenceDivergence(t *testing.T, data []byte) string {
	if len(data) > 96 {
		data = data[:96] // a sequence of a few dozen operations
	}
	h, sd := seqHarness(t)
	for _, sv := range seqServices() {
		h.addService(sv)
	}
	s := &seqRun{t: t, h: h, sd: sd, deleted: map[int]bool{}}
	s.watchLeases()
	r := &seqReader{b: data}
	h.pass()
	for r.more() {
		passed, failed := s.step(r)
		if !passed || failed {
			// After a failed write the datapath is behind by design: the
			// reconciler retries at its next pass, which is compared.
			continue
		}
		if msg := s.compare(); msg != "" {
			return msg
		}
	}
	s.logf("final pass")
	h.pass()
	s.settle()
	return s.compare()
}

// compare describes how the datapath differs from a fresh daemon's ("" if
// it does not).
func (s *seqRun) compare() string {
	// What history decides is read from both models: where the two
	// daemons' answers differ by design, only one of them may have an
	// entry at a skipped address or for its Service.
	fd, fsd := s.freshDatapath()
	models := []*model.Model{s.h.d.model, fd.model}
	skip := s.historyKeys(models)
	skipSP := s.historyServicePorts(skip, models)
	got := renderDatapath(s.h.d, s.sd, skip, skipSP)
	// The fresh daemon's entries for the skipped keys are left out too.
	fresh := renderDatapath(fd, fsd, skip, skipSP)
	if got != fresh {
		var drains []string
		pds, _ := s.h.d.model.PodDrains()
		for uid, pd := range pds {
			drains = append(drains, fmt.Sprintf("%s: %+v", uid, *pd))
		}
		return fmt.Sprintf("pod drains %v\nleases %v\nafter\n  %s\nthe datapath differs from a fresh daemon's:\n--- incremental\n%s\n--- fresh\n%s\n(skipped: %v)",
			drains, s.leaseVersions(), strings.Join(s.ops, "\n  "), got, fresh, skip)
	}
	return ""
}

// historyKeys are the drain keys whose entries depend on what a daemon
// saw happen, which a fresh daemon cannot know, and are not compared (nor
// the gone peers at their addresses):
//   - lingering keys: a departed endpoint stays steered for --linger after
//     it left every slice, which a fresh daemon never saw it listed in
//     (what such an entry rewrites to is checked by the model package's
//     TestLingeringSelectsNow);
//   - the addresses of a pod this node hosted and saw vanish (its own gone
//     Lease, the pod no more; a slice may still list it, at its IPs or
//     elsewhere): a fresh daemon
//     finds only the Lease, which no local pod confirms any more, and
//     fails open, as the trust rule says (a restart ends that steering
//     early);
//   - the addresses of another node's Lease that the claims honour, or
//     refuse, only from memory of the pod's last listing (claims.departed:
//     a pod deleted without grace leaves its slice before its gone Lease
//     comes; a listing on another node voids the Lease for a while), which
//     a fresh daemon never saw.
//
// The keys at an address are those either model (the incremental daemon's
// first, then the fresh one's) has a contribution to.
func (s *seqRun) historyKeys(models []*model.Model) map[bpf.EndpointKey]bool {
	m := s.h.d.model
	out := map[bpf.EndpointKey]bool{}
	for _, sp := range m.ServicePortStatuses() {
		for _, k := range sp.Lingering {
			out[k] = true
		}
	}
	pds, _ := m.PodDrains()
	for _, pd := range pds {
		if pd.Holder != testNode || pd.State != StateGone || s.h.d.localPodsNow().ByUID[pd.UID] != nil {
			continue
		}
		for _, ip := range pd.IPs {
			skipAddr(out, models, ip) // its all-ports keys, and its listings'
		}
		for _, ip := range s.listedAt(pd.UID) {
			skipAddr(out, models, ip) // a slice that lists it elsewhere
		}
	}
	for _, l := range s.h.d.drainLeasesNow().list {
		if l.Holder == testNode {
			continue
		}
		for _, ip := range l.IPs {
			if _, _, until := s.h.d.claims.HostOf(ip, l.PodUID); !until.IsZero() {
				for _, ip := range l.IPs {
					skipAddr(out, models, ip) // the answer of a departed host
				}
				break
			}
		}
	}
	return out
}

// listedAt returns the addresses the Services' slices list pod uid at,
// which need not be the IPs its pod drain names.
func (s *seqRun) listedAt(uid types.UID) []netip.Addr {
	var out []netip.Addr
	key := k8s.PodKeyOf(uid)
	for _, svc := range seqServices() {
		for _, sl := range s.h.d.state.SlicesOf(svc.Namespace + "/" + svc.Name) {
			for i := range sl.Len() {
				if sl.PodKey(i) == key {
					out = append(out, sl.Addr(i))
				}
			}
		}
	}
	return out
}

// historyServicePorts are the service-ports whose entries depend on
// history as much as the skipped keys do: those only contributions to
// skipped keys keep active, and those whose Service lists an address with
// a skipped key (whether that endpoint is selectable, and so what the
// service-port steers to, or whether it steers at all, is history), in
// either model.
func (s *seqRun) historyServicePorts(skip map[bpf.EndpointKey]bool, models []*model.Model) map[string]bool {
	out := map[string]bool{}
	var all []model.ServicePortStatus
	for _, m := range models {
		for _, sp := range m.ServicePortStatuses() {
			keys := slices.Concat(sp.Draining, sp.Lingering)
			if len(keys) > 0 && !slices.ContainsFunc(keys, func(k bpf.EndpointKey) bool { return !skip[k] }) {
				out[servicePortName(sp)] = true
			}
			all = append(all, sp)
		}
	}
	addrs := map[netip.Addr]bool{}
	for k := range skip {
		addrs[k.Addr] = true
	}
	for _, svc := range seqServices() {
		name := svc.Namespace + "/" + svc.Name
		for _, sl := range s.h.d.state.SlicesOf(name) {
			for i := range sl.Len() {
				if !addrs[sl.Addr(i)] {
					continue
				}
				for _, sp := range all {
					if sp.Service == name {
						out[servicePortName(sp)] = true
					}
				}
			}
		}
	}
	return out
}

// servicePortName names a service-port by its Service port, which, unlike
// its id, does not depend on allocation order.
func servicePortName(sp model.ServicePortStatus) string {
	return fmt.Sprintf("%s %s %v %v", sp.Service, sp.Port, sp.Protocol, sp.Family)
}

// skipAddr adds every key of ip the models have a contribution to.
func skipAddr(out map[bpf.EndpointKey]bool, models []*model.Model, ip netip.Addr) {
	for _, m := range models {
		for k := range m.Desired().Keys() {
			if k.Addr == ip {
				out[k] = true
			}
		}
	}
	for _, proto := range []bpf.Protocol{bpf.TCP, bpf.UDP} {
		out[bpf.EndpointKey{Addr: ip, Proto: proto}] = true
	}
}

// seqSeeds are sequences that reach the interesting states quickly.
func seqSeeds() [][]byte {
	return [][]byte{
		{},
		{0, 0, 2, 0, 0, 0, 0, 1, 0, 0, 0, 11},
		// A local pod, deleted without grace: its gone Lease.
		{0x3, 0x2, 0x0, 0x0, 0x2, 0x0, 0x2, 0x0, 0x2, 0x0, 0x77, 0xa0, 0x2, 0xcb},
		// A pod's offline call, then its deletion.
		{0x3, 0x2, 0x2, 0x0, 0x37, 0x2, 0x0, 0x3, 0x2},
		// Another node's Lease of a pod that left its slice (departed host).
		{0x0, 0x0, 0x7c, 0x0, 0x0, 0x0, 0x0, 0x1, 0x1, 0x0, 0x1, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x2, 0x0, 0x74, 0x0, 0x0, 0xdd, 0x1, 0x1, 0x0, 0x0, 0x1, 0x0, 0x0, 0x2, 0x0},
		// This node's Lease for a local pod created after it.
		{0xad, 0x2, 0x0, 0x0, 0x0, 0x0, 0x1, 0x0, 0x0, 0x3, 0x2},
		// A vanished local pod's IP listed ready again, next to a not-ready
		// endpoint: whether the Service steers depends on history.
		{3, 0, 0, 0, 11, 4, 0, 0, 2, 2, 0, 1, 3, 0, 0, 0, 0, 0},
		// A reused IP listed terminating and ready by two slices.
		{0x2, 0x1, 0x1, 0x0, 0x1d, 0x1, 0xfe, 0x6f, 0x0, 0xc3, 0x96, 0x1, 0x77, 0x1, 0x1e, 0xcb, 0x1, 0x92, 0x38, 0x1d, 0x0, 0x8a, 0x93, 0xb5, 0x2, 0x20, 0x3, 0x3a, 0x0, 0x0, 0x0, 0x2, 0x0, 0x2, 0x90, 0x1, 0x44, 0x2e, 0x28, 0x19, 0x1, 0x0, 0x67, 0xe3, 0x3e, 0x1, 0x2, 0x0, 0x56, 0xec, 0x13, 0x3, 0xd0, 0xf7, 0x38, 0x1, 0x0, 0x1, 0x5b, 0x8f},
	}
}

// leaseVersions lists the drain Leases in the API (failure messages).
func (s *seqRun) leaseVersions() []string {
	list, err := s.h.client.CoordinationV1().Leases(testNS).List(s.h.ctx, metav1.ListOptions{})
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, l := range list.Items {
		out = append(out, fmt.Sprintf("%s %v holder %v", l.Name, l.Annotations, *l.Spec.HolderIdentity))
	}
	return out
}
