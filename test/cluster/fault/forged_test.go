package fault

import (
	"bufio"
	"context"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/draindbin"
)

// How long the tenant forges one case, and how long the test watches
// after the tenant deleted its slice. Without the policy a labelled copy
// lives until the EndpointSlice controller deletes it (about a second), so
// three seconds see it deleted and written again; with the policy every
// labelled create is refused and one second of refusals is enough.
const (
	forgeFor         = 3 * time.Second
	forgeForPolicy   = time.Second
	forgeAfter       = 1500 * time.Millisecond
	forgeAfterPolicy = 500 * time.Millisecond
	forgeEvery       = 100 * time.Millisecond
	controllerName   = "endpointslice-controller.k8s.io"
	policyDenial     = "reserved for the EndpointSlice controller"
)

// forgeCase is one forged slice: what the tenant of namespace B writes
// for its own selector Service, listing a pod of namespace A.
type forgeCase struct {
	name   string
	victim string    // the pod of namespace A it lists: pa or lone
	ready  bool      // listed ready (else not ready)
	label  bool      // the controller's managed-by value
	uid    types.UID // the targetRef's UID; "" for the victim's real one
	refNS  string    // the targetRef's namespace; "" for B
	owner  bool      // a controller ownerReference to B's Service, its real UID
	// policyOnly: run only with the slice policy in force.
	policyOnly bool
}

// forgeSettle is how long the test watches after the last case: the
// gone grace at draind's defaults (5 s, after which a departed endpoint's
// flows are expired) and a second.
const forgeSettle = 6 * time.Second

// TestHostileForgedSlice: a tenant who may write Services and
// EndpointSlices only in namespace B (a client certificate, a Role there)
// writes, every 100 ms, a slice for its own selector Service that lists
// the IP of pod pa of namespace A (in A's Service web-a), not ready — with
// the controller's managed-by label and a targetRef naming B, pa's name and
// pa's real UID; without the label; with a made-up UID; with a targetRef
// naming A; and with a controller ownerReference to its own Service with
// the Service's UID (everything the controller's own slice carries, for pa
// and, listed ready, for lone, a pod of A in no Service). When the
// EndpointSlice controller deletes or rewrites a copy, the tenant writes
// it again; then it deletes it. Every case runs with the base's slice
// policy (every labelled write refused) and without it (draind's own trust
// check alone). On every node, throughout and for the gone grace after: no
// drain entry for pa's or lone's IP (with the ownerReference and without
// the policy, where draind cannot tell the slice from the controller's,
// only entries with policy off), no new connection to pa — direct or
// through A's ClusterIP — or to lone fails or reaches another pod, no
// conntrack flow is expired, and a keep-alive connection to pa through A's
// ClusterIP stays on its first connection. One more case, lone listed not
// ready with the ownerReference, runs only with the policy: without it the
// other node takes lone for gone (docs/trust.md).
func TestHostileForgedSlice(t *testing.T) {
	bed.RequirePrivileged(t)
	f := newFixture(t, "forged", "a", "b")
	pa := f.pod("a", "pa", "web-a")
	lone := f.pod("a", "lone", "lone")
	vipA := f.service("web-a")
	f.watchReady("web-a", pa)
	f.waitProgrammed(vipA, pa)
	for _, n := range []string{"a", "b"} {
		f.startDraind(n)
	}
	fb := newForger(f, map[string]netip.Addr{"pa": pa.Bed.IP4, "lone": lone.Bed.IP4})
	paAddr := netip.AddrPortFrom(pa.Bed.IP4, serverPort)
	loneAddr := netip.AddrPortFrom(lone.Bed.IP4, serverPort)

	for _, n := range []string{"a", "b"} {
		c := f.client(n)
		f.reaches(c, paAddr, 3, "pa")
		f.reaches(c, vipA, 3, "pa")
		f.reaches(c, loneAddr, 3, "lone")
		fb.probers = append(fb.probers,
			wantProber{startProber("pa-direct-"+n, c, paAddr), "pa"},
			wantProber{startProber("pa-vip-"+n, c, vipA), "pa"},
			wantProber{startProber("lone-direct-"+n, c, loneAddr), "lone"})
		if _, err := c.Proc.Call(bed.Request{Op: "keepalive_start", ID: "ll", Addr: vipA.String(), Interval: forgeEvery}); err != nil {
			t.Fatal(err)
		}
		if _, err := bed.WaitServed(c.Proc, "ll", 10*time.Second); err != nil {
			t.Fatal(err)
		}
		fb.clients[n] = c.Proc
	}
	defer func() {
		for _, p := range fb.probers {
			p.Stop()
		}
	}()
	stop := fb.watchMaps(t)
	defer stop()
	ct0 := fb.ctExpired(t)
	cases := []forgeCase{
		{name: "label-victim-uid", victim: "pa", label: true},
		{name: "no-label", victim: "pa"},
		{name: "made-up-uid", victim: "pa", label: true, uid: "0e1f2a3b-4c5d-4e6f-8a9b-0c1d2e3f4a5b"},
		{name: "victim-namespace", victim: "pa", label: true, refNS: f.ns},
		// Last: without the policy draind trusts these (they carry all the
		// controller's marks) and keeps an off entry for the IP.
		{name: "owner-reference", victim: "pa", label: true, owner: true},
		{name: "owner-reference-lone-ready", victim: "lone", ready: true, label: true, owner: true},
		// Only with the policy: without it, nodes other than lone's own
		// take lone, listed not ready by a slice they cannot tell from the
		// controller's and then withdrawn, for a gone pod and refuse
		// connections to its IP for the linger (docs/trust.md).
		{name: "owner-reference-lone", victim: "lone", label: true, owner: true, policyOnly: true},
	}
	// With the policy first: without it the ownerReference cases are
	// trusted and leave off entries for pa's IP that later cases would see.
	fb.applyPolicy(t)
	for _, policy := range []bool{true, false} {
		mode := "with-policy"
		if !policy {
			mode = "without-policy"
			fb.removePolicy(t)
		}
		for _, fc := range cases {
			if fc.policyOnly && !policy {
				continue
			}
			t.Run(mode+"/"+fc.name, func(t *testing.T) {
				r := fb.run(t, fc, policy)
				r.checkWrites(t, fc, policy)
				if fc.owner && !policy {
					fb.trusted = true
				}
				fb.check(t, r, fb.trusted)
			})
		}
	}
	// The last departure's gone grace, then the whole run's conntrack.
	from := time.Now()
	time.Sleep(forgeSettle)
	fb.check(t, &forgeResult{from: from, to: time.Now(), expired: map[string]float64{}}, fb.trusted)
	for n, v := range fb.ctExpired(t) {
		t.Logf("node %s: %v conntrack flows expired over the whole test", n, v-ct0[n])
		if v != ct0[n] {
			t.Errorf("node %s: %v conntrack flows expired while a tenant forged slices", n, v-ct0[n])
		}
	}
}

type wantProber struct {
	*prober
	want string // the only pod that may answer
}

// forger is the tenant of namespace B and what the test watches.
type forger struct {
	f       *fixture
	ns      string // the tenant's namespace
	tenant  kubernetes.Interface
	svc     *corev1.Service // the tenant's selector Service
	victims map[string]*corev1.Pod
	ips     map[string]netip.Addr // the victims' IPs
	probers []wantProber
	clients map[string]*bed.Proc // by node, each with keep-alive client "ll"
	trusted bool                 // a case draind trusts has run: its off entries linger

	mu    sync.Mutex
	polls []mapRead
}

// mapRead is one read of a node's maps: the policies of the live drain
// entries for each victim's IP.
type mapRead struct {
	at      time.Time
	node    string
	entries map[string][]bpf.Policy
}

func newForger(f *fixture, ips map[string]netip.Addr) *forger {
	t := f.t
	t.Helper()
	fb := &forger{f: f, ns: f.ns + "-b", victims: map[string]*corev1.Pod{}, ips: ips, clients: map[string]*bed.Proc{}}
	admin := f.env.kc.Admin
	for name := range ips {
		p, err := admin.CoreV1().Pods(f.ns).Get(f.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fb.victims[name] = p
	}
	if _, err := admin.CoreV1().Namespaces().Create(f.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fb.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", fb.ns, err)
	}
	t.Cleanup(fb.clear)
	var err error
	fb.tenant, err = f.env.kc.Tenant(f.ctx, "tenant-"+fb.ns, fb.ns, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"create", "get", "list", "update", "delete"}},
		{APIGroups: []string{discoveryv1.GroupName}, Resources: []string{"endpointslices"}, Verbs: []string{"create", "get", "list", "update", "delete"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fb.tenant.CoreV1().Pods(f.ns).List(f.ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("the tenant may list pods of namespace A (%v): it must not", err)
	}
	single := corev1.IPFamilyPolicySingleStack
	fb.svc, err = fb.tenant.CoreV1().Services(fb.ns).Create(f.ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: fb.ns, Name: "web-b"},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web-b"}, IPFamilyPolicy: &single, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: svcPort, TargetPort: intstr.FromInt32(serverPort)}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the tenant creating its Service: %v", err)
	}
	// The controller has seen the Service once its own (empty) slice is
	// there: from then on it reacts to look-alikes.
	waitFor(t, 30*time.Second, "the EndpointSlice controller's slice of "+fb.ns+"/web-b", func() bool {
		l, err := admin.DiscoveryV1().EndpointSlices(fb.ns).List(f.ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelManagedBy + "=" + controllerName})
		return err == nil && len(l.Items) > 0
	})
	return fb
}

// clear deletes B's Service and every slice in B (the bed runs no garbage
// collector), and the slice policy if applied.
func (fb *forger) clear() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := fb.f.env.kc.Admin
	if err := admin.CoreV1().Services(fb.ns).Delete(ctx, "web-b", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		fb.f.t.Errorf("deleting service %s/web-b: %v", fb.ns, err)
	}
	api := admin.DiscoveryV1().EndpointSlices(fb.ns)
	for range 50 {
		if err := api.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			fb.f.t.Errorf("deleting the endpointslices of %s: %v", fb.ns, err)
			return
		}
		time.Sleep(200 * time.Millisecond)
		if l, err := api.List(ctx, metav1.ListOptions{}); err == nil && len(l.Items) == 0 {
			return
		}
	}
	fb.f.t.Errorf("endpointslices of %s keep coming back", fb.ns)
}

// slice is the case's forged slice as the tenant writes it.
func (fb *forger) slice(fc forgeCase) *discoveryv1.EndpointSlice {
	labels := map[string]string{discoveryv1.LabelServiceName: "web-b"}
	if fc.label {
		labels[discoveryv1.LabelManagedBy] = controllerName
	}
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: fb.ns, Name: "forged-" + fc.name, Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   fb.endpoints(fc),
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("http"), Protocol: ptr(corev1.ProtocolTCP), Port: ptr(int32(serverPort))}},
	}
	if fc.owner {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: fb.svc.Name, UID: fb.svc.UID, Controller: ptr(true)}}
	}
	return s
}

func (fb *forger) endpoints(fc forgeCase) []discoveryv1.Endpoint {
	v := fb.victims[fc.victim]
	ref := &corev1.ObjectReference{Kind: "Pod", Namespace: fc.refNS, Name: v.Name, UID: fc.uid}
	if ref.Namespace == "" {
		ref.Namespace = fb.ns
	}
	if ref.UID == "" {
		ref.UID = v.UID
	}
	ep := discoveryv1.Endpoint{
		Addresses:  []string{fb.ips[fc.victim].String()},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(fc.ready), Serving: ptr(fc.ready), Terminating: ptr(false)},
		TargetRef:  ref,
	}
	if v.Spec.NodeName != "" {
		ep.NodeName = ptr(v.Spec.NodeName)
	}
	return []discoveryv1.Endpoint{ep}
}

func ptr[T any](v T) *T { return &v }

// applyPolicy creates the base's slice policy and its binding as shipped
// and waits until the API server refuses the tenant a labelled slice.
func (fb *forger) applyPolicy(t *testing.T) {
	t.Helper()
	root, err := draindbin.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "daemonset", "slice-policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	admin := fb.f.env.kc.Admin.AdmissionregistrationV1()
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("decoding slice-policy.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *admissionregistrationv1.ValidatingAdmissionPolicy:
			if _, err := admin.ValidatingAdmissionPolicies().Create(fb.f.ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				admin.ValidatingAdmissionPolicies().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		case *admissionregistrationv1.ValidatingAdmissionPolicyBinding:
			if _, err := admin.ValidatingAdmissionPolicyBindings().Create(fb.f.ctx, o, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				admin.ValidatingAdmissionPolicyBindings().Delete(context.Background(), o.Name, metav1.DeleteOptions{})
			})
		default:
			t.Fatalf("slice-policy.yaml holds a %T", obj)
		}
	}
	start := time.Now()
	waitFor(t, time.Minute, "the slice policy to refuse the tenant a labelled slice", func() bool { return !fb.labelAdmitted() })
	t.Logf("slice policy in force %s after it was created", ms(time.Since(start)))
}

// removePolicy deletes the slice policy and waits until the tenant may
// write a labelled slice again.
func (fb *forger) removePolicy(t *testing.T) {
	t.Helper()
	admin := fb.f.env.kc.Admin.AdmissionregistrationV1()
	const name = "draind-endpointslice-controller-label"
	if err := admin.ValidatingAdmissionPolicyBindings().Delete(fb.f.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := admin.ValidatingAdmissionPolicies().Delete(fb.f.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, time.Minute, "the tenant's labelled slice to be admitted again", fb.labelAdmitted)
	t.Logf("slice policy gone %s after it was deleted", ms(time.Since(start)))
}

// labelAdmitted reports whether the tenant may create a slice with the
// controller's label (one for no Service, without endpoints: it claims
// nothing), deleting it again.
func (fb *forger) labelAdmitted() bool {
	api := fb.tenant.DiscoveryV1().EndpointSlices(fb.ns)
	probe := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: fb.ns, Name: "policy-probe", Labels: map[string]string{discoveryv1.LabelServiceName: "policy-probe", discoveryv1.LabelManagedBy: controllerName}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	_, err := api.Create(fb.f.ctx, probe, metav1.CreateOptions{})
	if err == nil || apierrors.IsAlreadyExists(err) {
		api.Delete(fb.f.ctx, probe.Name, metav1.DeleteOptions{})
		return true
	}
	return false
}

// forgeResult is what one case did and when.
type forgeResult struct {
	from, to  time.Time
	deleted   time.Time // the tenant deleted its slice
	attempts  int
	created   int // creates admitted (the first, and one per copy the controller deleted)
	rewritten int // updates putting the forged endpoints back after the controller changed them
	denied    int // refused with the policy's message
	errs      []string
	expired   map[string]float64 // conntrack flows expired during the case, by node
}

// run forges one case: a write every forgeEvery for its window, the
// tenant's delete, then forgeAfter of watching.
func (fb *forger) run(t *testing.T, fc forgeCase, policy bool) *forgeResult {
	r := &forgeResult{expired: map[string]float64{}}
	ct0 := fb.ctExpired(t)
	r.from = time.Now()
	window, after := forgeFor, forgeAfter
	if policy {
		window, after = forgeForPolicy, forgeAfterPolicy
	}
	api := fb.tenant.DiscoveryV1().EndpointSlices(fb.ns)
	tick := time.NewTicker(forgeEvery)
	// Without the policy a labelled case goes on until the controller
	// deleted or rewrote a copy at least once (a loaded machine's API
	// server may take longer than the window), for 20 s at most.
	reacted := func() bool { return policy || !fc.label || r.created+r.rewritten >= 2 }
	for end, limit := time.Now().Add(window), time.Now().Add(20*time.Second); (time.Now().Before(end) || !reacted()) && time.Now().Before(limit); <-tick.C {
		r.attempts++
		fb.forgeOnce(api, fc, r)
	}
	tick.Stop()
	if err := api.Delete(fb.f.ctx, "forged-"+fc.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("the tenant deleting its slice: %v", err)
	}
	r.deleted = time.Now()
	time.Sleep(after)
	r.to = time.Now()
	for n, v := range fb.ctExpired(t) {
		r.expired[n] = v - ct0[n]
	}
	return r
}

// checkWrites holds the tenant's writes to what the policy promises.
func (r *forgeResult) checkWrites(t *testing.T, fc forgeCase, policy bool) {
	t.Logf("tenant: %d writes in %s: %d created, %d rewritten after the controller, %d refused by the policy, other errors %d %v",
		r.attempts, ms(r.deleted.Sub(r.from)), r.created, r.rewritten, r.denied, len(r.errs), r.errs)
	switch {
	case len(r.errs) > 0:
		t.Errorf("unexpected API errors: %v", r.errs)
	case policy && fc.label && (r.created+r.rewritten > 0 || r.denied != r.attempts):
		t.Errorf("with the slice policy a labelled slice was admitted (%d created, %d rewritten, %d of %d refused)", r.created, r.rewritten, r.denied, r.attempts)
	case (!policy || !fc.label) && r.created == 0:
		t.Errorf("the tenant's slice was never created: the case shows nothing")
	case !policy && fc.label && r.created+r.rewritten < 2:
		t.Errorf("the controller never deleted or rewrote the labelled copy (%d created, %d rewritten): the case did not see it react", r.created, r.rewritten)
	}
}

// watchMaps reads every daemon's pinned maps every mapPoll until the
// returned stop is called.
func (fb *forger) watchMaps(t *testing.T) (stop func()) {
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			for n, d := range fb.f.daemons {
				dm, err := pinned(d)
				if err != nil {
					t.Errorf("reading the maps of %s: %v", n, err)
					return
				}
				now := time.Now()
				rd := mapRead{at: now, node: n, entries: map[string][]bpf.Policy{}}
				for v, ip := range fb.ips {
					for _, dr := range liveDrains(dm, ip, now) {
						rd.entries[v] = append(rd.entries[v], dr.Policy)
					}
				}
				fb.mu.Lock()
				fb.polls = append(fb.polls, rd)
				fb.mu.Unlock()
			}
			select {
			case <-quit:
				return
			case <-time.After(mapPoll):
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-done
	}
}

// forgeOnce writes the forged slice: creates it, or puts its endpoints
// back if the controller changed them.
func (fb *forger) forgeOnce(api interface {
	Create(context.Context, *discoveryv1.EndpointSlice, metav1.CreateOptions) (*discoveryv1.EndpointSlice, error)
	Get(context.Context, string, metav1.GetOptions) (*discoveryv1.EndpointSlice, error)
	Update(context.Context, *discoveryv1.EndpointSlice, metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error)
}, fc forgeCase, r *forgeResult) {
	ctx := fb.f.ctx
	want := fb.slice(fc)
	_, err := api.Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := api.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return // deleted in between: the next tick creates it
		}
		if gerr != nil {
			r.errs = append(r.errs, gerr.Error())
			return
		}
		if len(cur.Endpoints) == 1 && slices.Equal(cur.Endpoints[0].Addresses, want.Endpoints[0].Addresses) {
			return
		}
		cur.Endpoints, cur.Labels = want.Endpoints, want.Labels
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
		if err == nil {
			r.rewritten++
			return
		}
	} else if err == nil {
		r.created++
		return
	}
	switch {
	case err == nil:
	case strings.Contains(err.Error(), policyDenial):
		r.denied++
	case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
		// the controller wrote or deleted it in between: the next tick
	default:
		r.errs = append(r.errs, err.Error())
	}
}

var ctExpiredLine = regexp.MustCompile(`^draind_conntrack_flows_expired_total\{[^}]*\} ([0-9.e+]+)$`)

// ctExpired scrapes every daemon's conntrack_flows_expired_total (all
// protocols) from its metrics listener in the node's network namespace.
func (fb *forger) ctExpired(t *testing.T) map[string]float64 {
	out := map[string]float64{}
	for n, d := range fb.f.daemons {
		ns := d.Node().NS
		hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := ns.Do(func() (err error) {
					c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
		}}
		resp, err := hc.Get("http://127.0.0.1:9461/metrics")
		if err != nil {
			t.Fatalf("scraping draind on %s: %v", n, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if m := ctExpiredLine.FindStringSubmatch(sc.Text()); m != nil {
				v, _ := strconv.ParseFloat(m[1], 64)
				out[n] += v
			}
		}
		resp.Body.Close()
	}
	return out
}

// check holds what every node and client saw in [r.from, r.to) to the
// promises: no live drain entry for a victim's IP (allowOff: none but
// with policy off), no conntrack flow expired, every new connection
// answered by the pod it was made to, the keep-alive connection up.
func (fb *forger) check(t *testing.T, r *forgeResult, allowOff bool) {
	fb.mu.Lock()
	polls := map[string]int{}
	seen := map[string]map[string]int{} // node → "victim policy" → polls
	for _, rd := range fb.polls {
		if rd.at.Before(r.from) || !rd.at.Before(r.to) {
			continue
		}
		polls[rd.node]++
		for v, ps := range rd.entries {
			for _, p := range ps {
				if seen[rd.node] == nil {
					seen[rd.node] = map[string]int{}
				}
				seen[rd.node][v+" "+p.String()]++
				if !allowOff || p != bpf.PolicyOff {
					t.Errorf("node %s at %s: a live drain entry for %s's IP %s with policy %s", rd.node, rd.at.Format("15:04:05.000"), v, fb.ips[v], p)
				}
			}
		}
	}
	fb.mu.Unlock()
	for _, n := range slices.Sorted(maps.Keys(polls)) {
		t.Logf("node %s: %d map reads, reads with a live entry for a victim's IP (victim policy: reads) %v; conntrack flows expired %v", n, polls[n], seen[n], r.expired[n])
		if r.expired[n] != 0 {
			t.Errorf("node %s: %v conntrack flows expired while a tenant forged slices", n, r.expired[n])
		}
	}
	if len(polls) != len(fb.f.daemons) {
		t.Errorf("map reads of %d nodes, want %d", len(polls), len(fb.f.daemons))
	}
	for _, p := range fb.probers {
		ps := p.between(r.from, r.to)
		tl := tally(ps)
		t.Logf("%s → %s: %s", p.name, p.addr, fmtTally(tl))
		if len(ps) == 0 {
			t.Errorf("%s: no connection tried during the case", p.name)
		}
		// A connection that timed out was neither refused nor rewritten:
		// a loaded machine may stall one now and then; more than 1 % is
		// not that.
		if tm := tl["!timeout"]; tm > 0 && tm*100 <= len(ps) {
			delete(tl, "!timeout")
		}
		for k, c := range tl {
			if k != p.want {
				t.Errorf("%s → %s: %d new connections answered %q, want every one by %s", p.name, p.addr, c, k, p.want)
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(fb.clients)) {
		resp, err := fb.clients[n].Call(bed.Request{Op: "keepalive_peek", ID: "ll"})
		if err != nil {
			t.Fatal(err)
		}
		var ok, bad int
		for _, s := range resp.Timeline {
			at := time.Unix(0, s.At)
			if at.Before(r.from) || !at.Before(r.to) {
				continue
			}
			if s.Err != "" || s.Conn != 1 || s.Server != "pa" {
				bad++
				if bad <= 3 {
					t.Errorf("keep-alive client on %s through A's ClusterIP: %+v (want connection 1 answered by pa)", n, s)
				}
			} else {
				ok++
			}
		}
		t.Logf("keep-alive client on %s through A's ClusterIP: %d requests on its first connection, %d failed or redialled", n, ok, bad)
		if ok == 0 {
			t.Errorf("keep-alive client on %s made no request during the case", n)
		}
	}
}
