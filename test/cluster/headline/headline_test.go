package headline

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/scenario"
)

// Environment knobs of the headline test.
const (
	// EnvTail shortens or lengthens the traffic after each rollout (the
	// default: a minute, as in the issue; CI may shorten it).
	EnvTail = "DRAIND_HEADLINE_TAIL"
	// EnvVariants runs a subset, e.g. "baseline,draind".
	EnvVariants = "DRAIND_HEADLINE_VARIANTS"
)

// TestPrivilegedHeadline is the headline scenario on real Kubernetes:
// baseline (kube-proxy only, no preStop), sleep (preStop sleep 5) and draind
// (preStop /v1/offline?wait=30s, draind on every node as its
// ServiceAccount), quiet and under load (2,000 extra Services, 20
// EndpointSlice updates a second). It prints the side-by-side table and
// fails if draind let any client fail, if the baseline showed no failure,
// or if a draind pod's preStop took as long as sleep's.
func TestPrivilegedHeadline(t *testing.T) {
	bed.RequirePrivileged(t)
	if _, err := bpf.Probe(); err != nil {
		t.Skipf("SKIP: this kernel cannot run draind's datapath: %v", err)
	}
	tail := time.Minute
	if s := os.Getenv(EnvTail); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvTail, s, err)
		}
		tail = d
	}
	variants := Variants
	if s := os.Getenv(EnvVariants); s != "" {
		vs, err := scenario.ParseVariants(s)
		if err != nil {
			t.Fatalf("%s: %v", EnvVariants, err)
		}
		variants = vs
	}
	kc := kube.StartT(t, kube.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	log := kube.TestLogger(t)
	start := time.Now()
	c, err := Start(ctx, kc, Config{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("closing the headline cluster: %v", err)
		}
	})
	results, err := RunVariants(ctx, c, scenario.Config{Tail: tail, Log: log}, variants)
	var b strings.Builder
	scenario.WriteTable(&b, results)
	t.Logf("headline scenario figures (%v in all):\n%s", time.Since(start).Round(time.Second), b.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range c.Programming() {
		t.Logf("headline figures: network-programming latency (trigger time → data path, summed over the nodes), %s", p)
		if p.Draind.count() == 0 || p.KubeProxy.count() == 0 {
			t.Errorf("%s: network programming observed by draind %.0f times, by kube-proxy %.0f times: want both", p.Variant, p.Draind.count(), p.KubeProxy.count())
		}
	}
	for _, p := range Check(results) {
		t.Error(p)
	}
	for _, p := range CheckDraindLogs(c) {
		t.Errorf("draind was refused an API call: %s", p)
	}
	for _, r := range results {
		if !r.Variant.Draind {
			continue
		}
		ev, err := DrainEvents(ctx, c, r.Variant.Namespace())
		if err != nil {
			t.Fatal(err)
		}
		if ev["DrainStarted"] < len(r.Pods) || ev["Drained"] < len(r.Pods) {
			t.Errorf("%s: draind's Events on the pods %v, want DrainStarted and Drained for each of %d pods", r.Variant.Label(), ev, len(r.Pods))
		}
	}
}

// TestPrivilegedDraindRBAC applies deploy/daemonset's RBAC to a real
// apiserver and asks it (SubjectAccessReview) what the draind
// ServiceAccount may do: everything the daemon calls, and not patching
// pods, reading secrets or writing Leases outside its namespace. Then it
// tries a few of those calls with the ServiceAccount's own token.
func TestPrivilegedDraindRBAC(t *testing.T) {
	bed.RequirePrivileged(t)
	kc := kube.StartT(t, kube.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := ApplyRBAC(ctx, kc.Admin); err != nil {
		t.Fatal(err)
	}
	for _, a := range NeededAccess {
		ok, err := Allowed(ctx, kc.Admin, a)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("%s may not %s: the daemon needs it", DraindUser, a)
		}
	}
	for _, a := range ForbiddenAccess {
		ok, err := Allowed(ctx, kc.Admin, a)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			t.Errorf("%s may %s: it must not", DraindUser, a)
		}
	}

	// The same with the ServiceAccount's token, against real objects.
	cfg, err := kc.ServiceAccountConfig(ctx, DraindNamespace, DraindServiceAccount, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "victim"},
		Spec: corev1.PodSpec{NodeName: "nowhere", Containers: []corev1.Container{{Name: "c", Image: "draind.test/none"}}}}
	if _, err := kc.Admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "s"}, StringData: map[string]string{"k": "v"}}
	if _, err := kc.Admin.CoreV1().Secrets("default").Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := sa.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing pods as draind: %v", err)
	}
	_, err = sa.CoreV1().Pods("default").Patch(ctx, "victim", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	wantForbidden(t, "patching a pod", err)
	_, err = sa.CoreV1().Secrets("default").Get(ctx, "s", metav1.GetOptions{})
	wantForbidden(t, "reading a secret", err)
	_, err = sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	wantForbidden(t, "listing secrets", err)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "draind-rbac-check"}}
	_, err = sa.CoordinationV1().Leases("default").Create(ctx, lease, metav1.CreateOptions{})
	wantForbidden(t, "creating a Lease in default", err)
	if _, err := sa.CoordinationV1().Leases(DraindNamespace).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a Lease in %s as draind: %v", DraindNamespace, err)
	} else if err := sa.CoordinationV1().Leases(DraindNamespace).Delete(ctx, lease.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("deleting a Lease in %s as draind: %v", DraindNamespace, err)
	}
}

func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s as draind: got %v, want Forbidden", what, err)
	}
}
