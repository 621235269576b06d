package deploycheck

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

const namespace = "draind-system"

// rendered renders the base once per test.
func rendered(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	dir, err := BaseDir()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Render(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// typed decodes every rendered object strictly.
func typed(t *testing.T, objs []*unstructured.Unstructured) []runtime.Object {
	t.Helper()
	s, err := Scheme()
	if err != nil {
		t.Fatal(err)
	}
	var out []runtime.Object
	for _, o := range objs {
		obj, err := DecodeStrict(s, o)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, obj)
	}
	return out
}

func only[T runtime.Object](t *testing.T, objs []runtime.Object, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			if m, ok := any(v).(interface{ GetName() string }); ok && (name == "" || m.GetName() == name) {
				found = append(found, v)
			}
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want exactly one %T named %q in the base, found %d", zero, name, len(found))
	}
	return found[0]
}

// TestKustomizeBuild renders deploy/daemonset with the kustomize library
// kubectl apply -k embeds, and checks that the base holds what an install
// needs, in draind's namespace, with the dashboard ConfigMap carrying the
// very JSON file of the repository.
func TestKustomizeBuild(t *testing.T) {
	objs := rendered(t)
	want := []struct {
		gk   schema.GroupKind
		name string
	}{
		{schema.GroupKind{Kind: "Namespace"}, namespace},
		{schema.GroupKind{Kind: "ServiceAccount"}, "draind"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}, "draind"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}, "draind"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "Role"}, "draind-leases"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "RoleBinding"}, "draind-leases"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}, "draind-operator"},
		{schema.GroupKind{Group: "rbac.authorization.k8s.io", Kind: "Role"}, "draind-operator"},
		{schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "draind"},
		{schema.GroupKind{Kind: "Service"}, "draind-metrics"},
		{schema.GroupKind{Kind: "ConfigMap"}, "draind-dashboard"},
		{schema.GroupKind{Group: "monitoring.coreos.com", Kind: "PodMonitor"}, "draind"},
		{schema.GroupKind{Group: "monitoring.coreos.com", Kind: "PrometheusRule"}, "draind"},
	}
	for _, w := range want {
		if Find(objs, w.gk, w.name) == nil {
			t.Errorf("rendered base lacks %s %s", w.gk, w.name)
		}
	}
	for _, o := range objs {
		ns := o.GetNamespace()
		switch o.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			if ns != "" {
				t.Errorf("%s is cluster-scoped but has namespace %q", Describe(o), ns)
			}
		default:
			if ns != namespace {
				t.Errorf("%s is in namespace %q, want %q", Describe(o), ns, namespace)
			}
		}
	}
	cm := Find(objs, schema.GroupKind{Kind: "ConfigMap"}, "draind-dashboard")
	if cm == nil {
		t.FailNow()
	}
	if got := cm.GetLabels()["grafana_dashboard"]; got != "1" {
		t.Errorf("dashboard ConfigMap label grafana_dashboard=%q, want \"1\" (Grafana sidecar)", got)
	}
	dir, _ := BaseDir()
	file, err := os.ReadFile(filepath.Join(dir, "dashboards", "draind.json"))
	if err != nil {
		t.Fatal(err)
	}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	if data["draind.json"] != string(file) {
		t.Errorf("ConfigMap data[draind.json] differs from dashboards/draind.json")
	}
	// Every ClusterRoleBinding/RoleBinding subject points at the rendered
	// ServiceAccount (kustomize rewrites namespaces; a typo would leave the
	// daemon without rights).
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		subs, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subs {
			m := s.(map[string]any)
			if m["kind"] != "ServiceAccount" || m["name"] != "draind" || m["namespace"] != namespace {
				t.Errorf("%s subject %v is not the draind ServiceAccount in %s", Describe(o), m, namespace)
			}
		}
	}
}

// TestStrictDecoding decodes every rendered object into its typed Go struct
// (client-go's Kubernetes types, prometheus-operator's monitoring/v1) with
// unknown and duplicate fields as errors, and checks the security-relevant
// choices of the DaemonSet. The negative cases show that a misspelt field
// and an unknown kind are caught.
func TestStrictDecoding(t *testing.T) {
	objs := typed(t, rendered(t))

	ds := only[*appsv1.DaemonSet](t, objs, "draind")
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork || pod.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Errorf("hostNetwork=%v dnsPolicy=%q, want true and ClusterFirstWithHostNet", pod.HostNetwork, pod.DNSPolicy)
	}
	if pod.ServiceAccountName != "draind" {
		t.Errorf("serviceAccountName %q", pod.ServiceAccountName)
	}
	if pod.PriorityClassName != "system-node-critical" {
		t.Errorf("priorityClassName %q", pod.PriorityClassName)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("tolerations %+v, want one operator: Exists without key (every node)", pod.Tolerations)
	}
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType ||
		ds.Spec.UpdateStrategy.RollingUpdate == nil || ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable.IntValue() != 1 {
		t.Errorf("updateStrategy %+v, want RollingUpdate maxUnavailable 1", ds.Spec.UpdateStrategy)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatal("container has no securityContext.capabilities")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
		t.Error("runAsUser is not 0 (the pin directory and status socket are root-only)")
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("capabilities.drop %v, want [ALL]", sc.Capabilities.Drop)
	}
	added := slices.Clone(sc.Capabilities.Add)
	slices.Sort(added)
	if !slices.Equal(added, []corev1.Capability{"BPF", "NET_ADMIN"}) {
		t.Errorf("capabilities.add %v, want exactly BPF and NET_ADMIN", sc.Capabilities.Add)
	}
	seccomp := pod.SecurityContext.SeccompProfile
	if c.SecurityContext.SeccompProfile != nil {
		seccomp = c.SecurityContext.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %+v, want RuntimeDefault", seccomp)
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.Name] = m
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if v := vols["cgroup"]; v.HostPath == nil || v.HostPath.Path != "/sys/fs/cgroup" || !mounts["cgroup"].ReadOnly {
		t.Errorf("cgroup volume %+v mount %+v: want hostPath /sys/fs/cgroup mounted read-only", v, mounts["cgroup"])
	}
	if v := vols["bpffs"]; v.HostPath == nil || v.HostPath.Path != "/sys/fs/bpf" || mounts["bpffs"].ReadOnly {
		t.Errorf("bpffs volume %+v mount %+v: want hostPath /sys/fs/bpf, writable (pins)", v, mounts["bpffs"])
	}
	if strings.HasPrefix(mounts["bpffs"].MountPath, "/sys/") {
		t.Errorf("bpffs mounted at %s: the runtimes' default AppArmor profile denies writes below /sys/fs/* (except cgroup)", mounts["bpffs"].MountPath)
	}
	if v := vols["run"]; v.EmptyDir == nil || mounts["run"].MountPath != "/run/draind" {
		t.Errorf("status socket volume %+v mount %+v: want an emptyDir at /run/draind", v, mounts["run"])
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil {
			t.Fatalf("liveness and readiness must be HTTP probes: %+v / %+v", c.LivenessProbe, c.ReadinessProbe)
		}
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Errorf("probes on %s and %s, want /healthz and /readyz", c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path)
	}

	// The PrometheusRule also passes Prometheus' own rule-file validation
	// (expressions, label names, annotation templates).
	pr := only[*monitoringv1.PrometheusRule](t, objs, "draind")
	groups, err := yaml.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs := rulefmt.Parse(groups, false, model.UTF8Validation, Parser); len(errs) > 0 {
		t.Errorf("PrometheusRule spec is not a valid Prometheus rule file: %v", errs)
	}
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			for _, a := range []string{"summary", "description", "runbook"} {
				if r.Annotations[a] == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
		}
	}
	for _, a := range []string{"DraindDrainTimedOut", "DraindSteeringUnavailable", "DraindDown", "DraindMapNearlyFull", "DraindDatapathErrors"} {
		if !slices.Contains(alerts, a) {
			t.Errorf("PrometheusRule lacks alert %s", a)
		}
	}
	pm := only[*monitoringv1.PodMonitor](t, objs, "draind")
	if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != "metrics" {
		t.Errorf("PodMonitor endpoints %+v, want the port named metrics", pm.Spec.PodMetricsEndpoints)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" }) {
		t.Error("the container has no port named metrics for the PodMonitor")
	}
	if pm.Spec.JobLabel != "app.kubernetes.io/name" || ds.Spec.Template.Labels["app.kubernetes.io/name"] != "draind" {
		t.Errorf("PodMonitor jobLabel %q and pod label app.kubernetes.io/name=%q must give job=\"draind\" (the alerts use it)",
			pm.Spec.JobLabel, ds.Spec.Template.Labels["app.kubernetes.io/name"])
	}

	t.Run("misspelt field is an error", func(t *testing.T) {
		s, _ := Scheme()
		bad := rendered(t)
		d := Find(bad, schema.GroupKind{Group: "apps", Kind: "DaemonSet"}, "draind")
		if err := unstructured.SetNestedField(d.Object, true, "spec", "template", "spec", "hostNetwrok"); err != nil {
			t.Fatal(err)
		}
		_, err := DecodeStrict(s, d)
		if err == nil || !strings.Contains(err.Error(), "hostNetwrok") {
			t.Errorf("strict decoding accepted spec.template.spec.hostNetwrok: err = %v", err)
		}
		r := Find(bad, schema.GroupKind{Group: "monitoring.coreos.com", Kind: "PrometheusRule"}, "draind")
		groups, _, _ := unstructured.NestedSlice(r.Object, "spec", "groups")
		groups[0].(map[string]any)["rules"].([]any)[0].(map[string]any)["expresion"] = "up"
		_ = unstructured.SetNestedSlice(r.Object, groups, "spec", "groups")
		if _, err := DecodeStrict(s, r); err == nil || !strings.Contains(err.Error(), "expresion") {
			t.Errorf("strict decoding accepted a rule field expresion: err = %v", err)
		}
	})
	t.Run("unknown kind is an error", func(t *testing.T) {
		s, _ := Scheme()
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("monitoring.coreos.com/v1")
		u.SetKind("PodMontor")
		u.SetName("x")
		if _, err := DecodeStrict(s, u); err == nil {
			t.Error("decoding kind PodMontor succeeded")
		}
	})
}

// TestLeasePolicyMatchesOnlyDraind: the Lease policy's match condition names
// draind's own ServiceAccount in the base's namespace, not any
// ServiceAccount called draind.
func TestLeasePolicyMatchesOnlyDraind(t *testing.T) {
	objs := rendered(t)
	vap := Find(objs, schema.GroupKind{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}, "draind-drain-lease-holder")
	if vap == nil {
		t.Fatal("no Lease policy in the base")
	}
	conds, _, _ := unstructured.NestedSlice(vap.Object, "spec", "matchConditions")
	var expr string
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["name"] == "draind-node-agent" {
			expr, _ = m["expression"].(string)
		}
	}
	want := "request.userInfo.username == 'system:serviceaccount:" + namespace + ":draind' && request.namespace == '" + namespace + "'"
	if expr != want {
		t.Errorf("the policy matches %q, want %q", expr, want)
	}
	if strings.Contains(expr, "+ request.namespace +") {
		t.Errorf("the policy matches a ServiceAccount named draind in any namespace: %q", expr)
	}
}
