package deploycheck

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	"github.com/draind/draind/daemon"
	"github.com/draind/draind/daemon/datapathtest"
	"github.com/draind/draind/daemon/hosted"
	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// startCluster starts the real control plane of the bed (no root needed).
// Missing binaries are built, which takes minutes on a cold build cache.
func startCluster(t *testing.T) *kube.Cluster {
	t.Helper()
	set, ok, err := kubebin.Cached()
	if err != nil {
		t.Fatalf("looking for cached Kubernetes binaries: %v", err)
	}
	if !ok {
		// Build within the test's own deadline (go test's -timeout, 10 min
		// by default), keeping time for the test itself. A build cut short
		// is not wasted: the Go build cache keeps what was compiled.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
		if dl, ok := t.Deadline(); ok {
			ctx, cancel = context.WithDeadline(context.Background(), dl.Add(-2*time.Minute))
		}
		defer cancel()
		dl, _ := ctx.Deadline()
		t.Logf("kube-apiserver %s is not cached: building it and its siblings now, for at most %v (7-15 min on 2 cores with a cold Go build cache, ~30 s with a warm one)",
			kubebin.Version, time.Until(dl).Round(time.Second))
		start := time.Now()
		set, err = kubebin.Ensure(ctx, kube.TestLogger(t))
		if err != nil && ctx.Err() != nil {
			t.Skipf("SKIP: building kube-apiserver %s did not finish within this test's deadline (%v): run `go run ./cmd/kubebuild` in test/cluster once, or go test -timeout 30m; the compiled packages are cached, so the next try is shorter",
				kubebin.Version, time.Since(start).Round(time.Second))
		}
		if err != nil {
			t.Fatalf("building Kubernetes binaries: %v", err)
		}
		t.Logf("built in %v", time.Since(start).Round(time.Second))
	}
	return kube.StartT(t, kube.Config{Binaries: set, Log: slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
}

// installMonitoringCRDs installs the prometheus-operator CRDs the base
// needs (InstallMonitoringCRDs) or fails the test.
func installMonitoringCRDs(ctx context.Context, t *testing.T, cfg *rest.Config) {
	t.Helper()
	if err := InstallMonitoringCRDs(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// mapper resolves kinds to resources, retrying until discovery knows every
// kind of objs (CRDs appear in discovery shortly after they are established).
func mapper(ctx context.Context, t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured) meta.RESTMapper {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var m meta.RESTMapper
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		groups, err := restmapper.GetAPIGroupResources(dc)
		if err != nil {
			return false, nil
		}
		m = restmapper.NewDiscoveryRESTMapper(groups)
		for _, o := range objs {
			gvk := o.GroupVersionKind()
			if _, err := m.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("discovery does not list every kind of the base: %v", err)
	}
	return m
}

func resourceFor(t *testing.T, dyn dynamic.Interface, m meta.RESTMapper, o *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := o.GroupVersionKind()
	mapping, err := m.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("mapping %s: %v", Describe(o), err)
	}
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		return dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
	}
	return dyn.Resource(mapping.Resource)
}

// TestAPIServer checks the base against a real kube-apiserver of the
// version the project targets (the test/cluster bed; no root needed):
//   - every object passes server-side dry-run creation with strict field
//     validation: the API server's own defaulting, validation and admission,
//     and for PodMonitor and PrometheusRule the OpenAPI schemas of the
//     prometheus-operator CRDs;
//   - the RBAC is sufficient: the real daemon, authenticated as the
//     DaemonSet's ServiceAccount with only the base's bindings, syncs its
//     informers, drains a pod of its node (drain Lease create, renew with
//     progress, delete; DrainStarted and Drained Events) without a single
//     API error; client-go's event recorder can create and patch Events;
//   - the RBAC is minimal: SubjectAccessReviews show the ServiceAccount
//     cannot read secrets, write pods, touch Leases outside its namespace or
//     anything else it does not use.
func TestAPIServer(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if v, err := c.Admin.Discovery().ServerVersion(); err != nil || v.GitVersion != kubebin.Version {
		t.Fatalf("apiserver version %v (%v), want %s", v, err, kubebin.Version)
	}
	installMonitoringCRDs(ctx, t, c.AdminConfig)

	objs := rendered(t)
	dyn, err := dynamic.NewForConfig(c.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	m := mapper(ctx, t, c.AdminConfig, objs)

	ns := Find(objs, schema.GroupKind{Kind: "Namespace"}, namespace)
	if _, err := resourceFor(t, dyn, m, ns).Create(ctx, ns, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
		t.Fatalf("creating %s: %v", Describe(ns), err)
	}

	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
	t.Run("dry-run", func(t *testing.T) {
		for _, o := range objs {
			if o == ns {
				continue
			}
			got, err := resourceFor(t, dyn, m, o).Create(ctx, o, dryRun)
			if err != nil {
				t.Errorf("server-side dry-run of %s: %v", Describe(o), err)
				continue
			}
			if got.GetUID() == "" {
				t.Errorf("dry-run of %s returned no object", Describe(o))
			}
		}
		// Nothing was created.
		if _, err := c.Admin.AppsV1().DaemonSets(namespace).Get(ctx, "draind", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("DaemonSet exists after a dry run: %v", err)
		}
	})
	t.Run("dry-run rejects invalid objects", func(t *testing.T) {
		// An unknown field in a custom resource: the CRD schema, with
		// strict field validation, refuses it.
		pm := Find(objs, schema.GroupKind{Group: "monitoring.coreos.com", Kind: "PodMonitor"}, "draind").DeepCopy()
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		eps[0].(map[string]any)["scrapeIntervall"] = "30s"
		_ = unstructured.SetNestedSlice(pm.Object, eps, "spec", "podMetricsEndpoints")
		if _, err := resourceFor(t, dyn, m, pm).Create(ctx, pm, dryRun); err == nil || !strings.Contains(err.Error(), "scrapeIntervall") {
			t.Errorf("dry-run accepted a PodMonitor with scrapeIntervall: %v", err)
		}
		// A value the API server's validation refuses: with hostNetwork,
		// hostPort must equal containerPort.
		d := Find(objs, schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "draind").DeepCopy()
		ctrs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		ports := ctrs[0].(map[string]any)["ports"].([]any)
		ports[0].(map[string]any)["hostPort"] = int64(19460)
		_ = unstructured.SetNestedSlice(d.Object, ctrs, "spec", "template", "spec", "containers")
		if _, err := resourceFor(t, dyn, m, d).Create(ctx, d, dryRun); !apierrors.IsInvalid(err) {
			t.Errorf("dry-run accepted hostPort != containerPort under hostNetwork: %v", err)
		}
		// An invalid PromQL expression is not the API server's business
		// (the CRD only types it): TestStrictDecoding parses rules.
	})

	t.Run("rbac", func(t *testing.T) { testRBAC(ctx, t, c, dyn, m, objs) })
}

const saUser = "system:serviceaccount:" + namespace + ":draind"

func testRBAC(ctx context.Context, t *testing.T, c *kube.Cluster, dyn dynamic.Interface, m meta.RESTMapper, objs []*unstructured.Unstructured) {
	// Install the ServiceAccount and its bindings for real.
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
			"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if _, err := resourceFor(t, dyn, m, o).Create(ctx, o, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
				t.Fatalf("creating %s: %v", Describe(o), err)
			}
		}
	}

	t.Run("subject access reviews", func(t *testing.T) {
		type ra = authorizationv1.ResourceAttributes
		allowed := []ra{
			{Verb: "list", Group: "discovery.k8s.io", Resource: "endpointslices"},
			{Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"},
			{Verb: "list", Resource: "services"},
			{Verb: "watch", Resource: "services"},
			{Verb: "list", Resource: "pods"},
			{Verb: "watch", Resource: "pods"},
			// A registry-only drain Lease is checked against its pod.
			{Verb: "get", Resource: "pods", Namespace: "shop"},
			{Verb: "create", Resource: "events", Namespace: "shop"},
			{Verb: "patch", Resource: "events", Namespace: "shop"},
			// Its Node's zone label (topology hints).
			{Verb: "get", Resource: "nodes"},
		}
		for _, v := range []string{"get", "list", "watch", "create", "update", "delete"} {
			allowed = append(allowed, ra{Verb: v, Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace})
		}
		denied := []ra{
			{Verb: "get", Resource: "secrets", Namespace: namespace},
			{Verb: "list", Resource: "secrets"},
			{Verb: "patch", Resource: "pods", Namespace: "shop"},
			{Verb: "update", Resource: "pods", Namespace: "shop"},
			{Verb: "delete", Resource: "pods", Namespace: "shop"},
			{Verb: "create", Resource: "pods", Subresource: "eviction", Namespace: "shop"},
			{Verb: "patch", Resource: "pods", Subresource: "status", Namespace: "shop"},
			{Verb: "create", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-system"},
			{Verb: "update", Group: "coordination.k8s.io", Resource: "leases", Namespace: "kube-node-lease"},
			{Verb: "list", Group: "coordination.k8s.io", Resource: "leases"},
			{Verb: "deletecollection", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace},
			{Verb: "patch", Group: "coordination.k8s.io", Resource: "leases", Namespace: namespace},
			{Verb: "update", Resource: "services", Namespace: "shop"},
			{Verb: "update", Group: "discovery.k8s.io", Resource: "endpointslices", Namespace: "shop"},
			{Verb: "get", Resource: "configmaps", Namespace: namespace},
			{Verb: "list", Resource: "nodes"},
			{Verb: "update", Resource: "nodes"},
			{Verb: "patch", Resource: "nodes"},
			{Verb: "update", Resource: "events", Namespace: "shop"},
			{Verb: "delete", Resource: "events", Namespace: "shop"},
			{Verb: "create", Group: "events.k8s.io", Resource: "events", Namespace: "shop"},
			{Verb: "create", Resource: "serviceaccounts", Subresource: "token", Namespace: namespace},
			{Verb: "impersonate", Resource: "serviceaccounts"},
			{Verb: "escalate", Group: "rbac.authorization.k8s.io", Resource: "clusterroles"},
		}
		check := func(attrs []ra, want bool) {
			for _, a := range attrs {
				a := a
				sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: saUser, ResourceAttributes: &a}}
				got, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if got.Status.Allowed != want {
					t.Errorf("%s may %s %s/%s in %q: %v, want %v", saUser, a.Verb, a.Resource, a.Subresource, a.Namespace, got.Status.Allowed, want)
				}
			}
		}
		// The bindings were just created: the authorizer's cache must
		// have them before a denial means anything.
		if err := kube.WaitAllowed(ctx, c.Admin, saUser, nil, allowed...); err != nil {
			t.Error(err)
		}
		check(allowed, true)
		check(denied, false)
	})

	saCfg, err := c.ServiceAccountConfig(ctx, namespace, "draind", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := kubernetes.NewForConfig(saCfg)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("event recorder creates and patches", func(t *testing.T) {
		// The daemon's recorder (client-go record): the first Event is
		// created, a repeat is patched (count 2).
		b := record.NewBroadcaster()
		defer b.Shutdown()
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: sa.CoreV1().Events("")})
		rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "draind", Host: "node-a"})
		ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "default", Name: "recorder-probe", UID: "5f0e5c1e-0000-4000-8000-000000000001"}
		rec.Event(ref, corev1.EventTypeNormal, "DeploycheckProbe", "probe")
		rec.Event(ref, corev1.EventTypeNormal, "DeploycheckProbe", "probe")
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			evs, err := c.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{
				FieldSelector: fields.OneTermEqualSelector("involvedObject.name", "recorder-probe").String()})
			if err != nil {
				return false, err
			}
			return len(evs.Items) == 1 && evs.Items[0].Count == 2, nil
		})
		if err != nil {
			t.Errorf("the repeated Event was not created and patched to count 2 (RBAC on events?): %v", err)
		}
	})

	t.Run("drain Leases are bound to the writer's node", func(t *testing.T) { testLeasePolicy(ctx, t, c) })
	t.Run("the EndpointSlice controller's label is reserved", func(t *testing.T) { testSlicePolicy(ctx, t, c) })

	t.Run("daemon drains a pod with exactly these rights", func(t *testing.T) {
		testDaemonWithRBAC(ctx, t, c, sa)
	})
}

func testDaemonWithRBAC(ctx context.Context, t *testing.T, c *kube.Cluster, sa kubernetes.Interface) {
	const node = "node-a"
	logs := &syncWriter{}
	d, err := daemon.New(daemon.Config{
		Node: node, Namespace: namespace, Version: "deploycheck",
		LeaseDuration: 3 * time.Second, Quiet: 300 * time.Millisecond, Linger: time.Second, GoneGrace: 100 * time.Millisecond,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, sa, datapathtest.New(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dctx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(dctx) }()
	defer func() {
		stop()
		select {
		case err := <-runErr:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("daemon.Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("daemon.Run did not return after its context ended")
		}
		if t.Failed() {
			t.Logf("daemon warnings and errors:\n%s", logs.String())
		}
	}()
	d.SetAttached(true)
	poll := func(what string, cond func(context.Context) (bool, error)) {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, cond); err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
	}
	poll("the daemon to be ready (informers synced with the ServiceAccount's rights)", func(context.Context) (bool, error) {
		return d.Ready(), nil
	})

	// A pod on the daemon's node, running, then deleted: the daemon drains
	// it (reason pod-deleting) and publishes its drain Lease. There is no
	// kubelet, so the pod stays terminating until the test removes it.
	kl := &kube.Kubelet{Client: c.Admin, NodeName: node, NodeIPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}}
	pod, err := kl.RunPod(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "default"}}, netip.MustParseAddr("10.244.0.21"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Admin.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	leaseName := k8s.LeaseName(pod.UID)
	poll("the drain Lease to be published and marked drained by the node", func(ctx context.Context) (bool, error) {
		l, err := c.Admin.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == node && l.Annotations[k8s.AnnState] == daemon.StateDrained, nil
	})
	for _, reason := range []string{hosted.EventDrainStarted, hosted.EventDrained} {
		poll("Event "+reason, func(ctx context.Context) (bool, error) {
			evs, err := c.Admin.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
				fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)),
				fields.OneTermEqualSelector("reason", reason)).String()})
			return err == nil && len(evs.Items) > 0, err
		})
	}
	// The pod goes: the node deletes the drain Lease after the linger.
	if err := c.Admin.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	// Gone from the server, and the daemon's delete call has returned: on
	// a loaded machine its answer can still be on its way when the Lease
	// is already gone.
	poll("the drain Lease to be deleted", func(ctx context.Context) (bool, error) {
		_, err := c.Admin.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		return apierrors.IsNotFound(err) && testutil.ToFloat64(d.Metrics.LeaseOps.WithLabelValues("delete", "ok")) > 0, nil
	})

	for _, op := range []string{"create", "renew", "delete"} {
		if n := testutil.ToFloat64(d.Metrics.LeaseOps.WithLabelValues(op, "error")); n != 0 {
			t.Errorf("%v Lease %s calls failed", n, op)
		}
		if n := testutil.ToFloat64(d.Metrics.LeaseOps.WithLabelValues(op, "ok")); n == 0 {
			t.Errorf("no Lease %s call succeeded: the test did not exercise it", op)
		}
	}
	if strings.Contains(logs.String(), "forbidden") {
		t.Errorf("the daemon logged an authorization failure:\n%s", logs.String())
	}
}

// syncWriter serialises writes of concurrent loggers into one buffer.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
