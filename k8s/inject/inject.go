// Package inject decides whether a Pod gets draind's preStop call and
// computes the JSON patch that gives it, for the `draind webhook` admission
// webhook. It is pure: a Pod and Options in, a patch out, no I/O, so every
// rule is table-tested without an API server.
//
// Glossary:
//   - opted in: the namespace carries the label draind.io/inject=true (and
//     the pod does not say draind.io/inject: "false"), or the pod carries
//     the annotation draind.io/inject: "true" in a namespace without the
//     label. A pod in kube-system or in draind's own namespace never is,
//     whatever it or its namespace says. The webhook configuration's
//     selectors make the same choice; the webhook checks again because a
//     configuration can be edited.
//   - tools volume: the emptyDir draind-tools, into which the init
//     container draind-tools copies the draind binary (`draind copy-self`),
//     exactly as the README's recipe for images without a shell does.
//   - chain: a container that already has a preStop handler keeps it: the
//     injected hook runs `draind offline`, then the original handler
//     (--then-exec, --then-http-get, --then-sleep), in one exec hook.
//
// The patch only adds: it never rewrites a whole container or list, so
// fields this package's k8s.io/api does not know (a newer API server's) are
// kept. Mutating a pod twice changes nothing the second time: every addition
// is skipped when it is already there.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package inject

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names every injected pod shares. They are reserved: a pod that uses one
// of them for something else is left alone (see Mutate).
const (
	// Key is the namespace label and the pod annotation that opt in or out.
	Key = "draind.io/inject"
	// KeyWait overrides Options.Wait for one pod (a Go duration).
	KeyWait = "draind.io/wait"
	// KeyContainers names the containers to inject (comma-separated);
	// without it every regular container is.
	KeyContainers = "draind.io/inject-containers"
	// KeyInjected is written on an injected pod: the containers that got
	// the hook, for operators (kubectl get pod -o yaml shows what happened).
	KeyInjected = "draind.io/injected"
	// KeySteerOnDelete is written "true" on an injected pod (unless the pod
	// sets it itself): connections made straight to its IP are steered from
	// its deletion on (k8s.AnnotationSteerOnDelete), so the window before
	// its preStop call reaches draind is covered too.
	KeySteerOnDelete = "draind.io/steer-on-delete"

	// KubeSystem is never injected: the cluster's own components.
	KubeSystem = "kube-system"

	ToolsVolume   = "draind-tools"
	ToolsDir      = "/draind-tools"
	ToolsBinary   = ToolsDir + "/draind"
	InitContainer = "draind-tools"

	// HostIPEnv is what `draind offline` reads the node's address from.
	HostIPEnv = "HOST_IP"
	// PodIPEnv is the pod's own IP, added only for a chained httpGet
	// without a host (the kubelet sends those to the pod IP).
	PodIPEnv = "DRAIND_POD_IP"
)

// Defaults of Options.
const (
	DefaultImageBinary   = "/usr/local/bin/draind"
	DefaultWait          = 60 * time.Second
	DefaultFallbackSleep = 20 * time.Second
	// defaultGrace is the API server's default terminationGracePeriodSeconds,
	// used if a pod reaches the webhook without one.
	defaultGrace = 30
)

// Options are the webhook's settings for every pod.
type Options struct {
	// Image is the draind image of the init container: the one the
	// DaemonSet runs, so every node already has it.
	Image string
	// ImageBinary is the path of draind inside Image.
	ImageBinary string
	// Wait is `draind offline --wait` (0: DefaultWait; `draind webhook`
	// refuses an explicit --wait=0); a pod's draind.io/wait overrides it.
	Wait time.Duration
	// FallbackSleep is `draind offline --fallback-sleep`: the sleep when
	// the node's draind cannot be reached (0: none; negative is refused).
	FallbackSleep time.Duration
	// Namespace is draind's own namespace: never injected (a DaemonSet
	// pod whose preStop waited on itself would never stop).
	Namespace string
}

func (o Options) withDefaults() Options {
	if o.ImageBinary == "" {
		o.ImageBinary = DefaultImageBinary
	}
	if o.Wait == 0 {
		o.Wait = DefaultWait
	}
	return o
}

// Validate reports settings no pod could be injected with.
func (o Options) Validate() error {
	if o.Image == "" {
		return fmt.Errorf("inject options: no draind image")
	}
	if o.Namespace == "" {
		return fmt.Errorf("inject options: no draind namespace")
	}
	if o.Wait < 0 || o.Wait > maxWait {
		return fmt.Errorf("inject options: wait %s outside 0..%s", o.Wait, maxWait)
	}
	if o.FallbackSleep < 0 {
		return fmt.Errorf("inject options: fallback sleep %s is negative", o.FallbackSleep)
	}
	return nil
}

// maxWait bounds draind.io/wait: the daemon caps waits at --max-wait (10
// minutes by default); an hour is a typo guard, not a policy.
const maxWait = time.Hour

// Op is one RFC 6902 JSON patch operation.
type Op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Result is what Mutate decided.
type Result struct {
	// Patch is empty when the pod is left as it is.
	Patch []Op
	// Injected names the containers that get the hook in this patch.
	Injected []string
	// Skipped says why the pod (key "") or a container (its name) is left
	// alone; it is logged, not sent to the user.
	Skipped map[string]string
	// Warnings go back to the client (kubectl prints them): settings the
	// pod asked for that could not be honoured.
	Warnings []string
}

// PatchJSON encodes the patch ("[]" when empty).
func (r Result) PatchJSON() ([]byte, error) {
	if len(r.Patch) == 0 {
		return []byte("[]"), nil
	}
	return json.Marshal(r.Patch)
}

// OptedIn applies the opt-in rules to a pod (see the package doc).
// namespaceOptedIn says whether the pod's namespace carries
// draind.io/inject=true; the webhook learns it from which of its two
// configurations called it. draindNamespace is draind's own namespace. The
// reason is for the log.
func OptedIn(pod *corev1.Pod, namespaceOptedIn bool, draindNamespace string) (bool, string) {
	switch {
	case pod.Namespace == KubeSystem || pod.Namespace == draindNamespace:
		return false, fmt.Sprintf("namespace %q is never injected", pod.Namespace)
	case pod.Spec.HostNetwork:
		return false, "the pod uses the host network (draind cannot drain it)"
	case (pod.Spec.OS != nil && pod.Spec.OS.Name == corev1.Windows) || pod.Spec.NodeSelector[corev1.LabelOSStable] == string(corev1.Windows):
		return false, "a Windows pod (the draind binary is Linux's)"
	case pod.Annotations[Key] == "false":
		return false, "the pod opts out (" + Key + `: "false")`
	case namespaceOptedIn:
		return true, "the namespace opts in"
	case pod.Annotations[Key] == "true":
		return true, "the pod opts in"
	}
	return false, "neither the namespace nor the pod opts in"
}

// Mutate returns the patch that injects draind into pod. An error means the
// options are unusable; a pod that cannot be injected is a Result with no
// patch and the reason in Skipped.
func Mutate(pod *corev1.Pod, namespaceOptedIn bool, opts Options) (Result, error) {
	if err := opts.Validate(); err != nil {
		return Result{}, err
	}
	opts = opts.withDefaults()
	res := Result{Skipped: map[string]string{}}
	if ok, why := OptedIn(pod, namespaceOptedIn, opts.Namespace); !ok {
		res.Skipped[""] = why
		return res, nil
	}
	if why := reservedNamesConflict(pod); why != "" {
		res.Skipped[""] = why
		res.Warnings = append(res.Warnings, "draind: not injected: "+why)
		return res, nil
	}
	wait := opts.Wait
	if s, ok := pod.Annotations[KeyWait]; ok {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 || d > maxWait {
			res.Warnings = append(res.Warnings, fmt.Sprintf("draind: %s=%q is not a duration in (0, %s]: using %s", KeyWait, s, maxWait, wait))
		} else {
			wait = d
		}
	}
	selected, warn := selectContainers(pod)
	res.Warnings = append(res.Warnings, warn...)

	var ops []Op
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if !selected[c.Name] {
			continue
		}
		cops, why := containerOps(i, c, wait, opts.FallbackSleep)
		if why != "" {
			res.Skipped[c.Name] = why
			if why != alreadyInjected {
				res.Warnings = append(res.Warnings, fmt.Sprintf("draind: container %s not injected: %s", c.Name, why))
			}
			continue
		}
		ops = append(ops, cops...)
		res.Injected = append(res.Injected, c.Name)
	}
	if len(res.Injected) == 0 {
		if res.Skipped[""] == "" {
			res.Skipped[""] = "no container to inject"
		}
		return res, nil
	}
	var podOps []Op
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == ToolsVolume }) {
		podOps = append(podOps, appendOp("/spec/volumes", len(pod.Spec.Volumes), toolsVolume()))
	}
	if !slices.ContainsFunc(pod.Spec.InitContainers, func(c corev1.Container) bool { return c.Name == InitContainer }) {
		// First, so it has run before any other init container (a native
		// sidecar among them included) and costs nothing later.
		if len(pod.Spec.InitContainers) == 0 {
			podOps = append(podOps, Op{Op: "add", Path: "/spec/initContainers", Value: []corev1.Container{initContainer(opts)}})
		} else {
			podOps = append(podOps, Op{Op: "add", Path: "/spec/initContainers/0", Value: initContainer(opts)})
		}
	}
	grace := int64(defaultGrace)
	if pod.Spec.TerminationGracePeriodSeconds != nil {
		grace = *pod.Spec.TerminationGracePeriodSeconds
	}
	podOps = append(podOps, Op{Op: "add", Path: "/spec/terminationGracePeriodSeconds", Value: grace + DrainBudgetSeconds(wait, opts.FallbackSleep)})
	injected := strings.Join(res.Injected, ",")
	if prev := pod.Annotations[KeyInjected]; prev != "" {
		injected = prev + "," + injected
	}
	res.Patch = append(append(podOps, annotationOps(pod, injected)...), ops...)
	return res, nil
}

// annotationOps writes KeyInjected and, unless the pod chose itself,
// KeySteerOnDelete.
func annotationOps(pod *corev1.Pod, injected string) []Op {
	add := map[string]string{KeyInjected: injected}
	if _, ok := pod.Annotations[KeySteerOnDelete]; !ok {
		add[KeySteerOnDelete] = "true"
	}
	if pod.Annotations == nil {
		return []Op{{Op: "add", Path: "/metadata/annotations", Value: add}}
	}
	var ops []Op
	for _, k := range []string{KeyInjected, KeySteerOnDelete} {
		if v, ok := add[k]; ok {
			ops = append(ops, Op{Op: "add", Path: "/metadata/annotations/" + escape(k), Value: v})
		}
	}
	return ops
}

// DrainBudgetSeconds is what the injected hook adds to the pod's grace
// period: the longest the draind part of the hook may take, wait +
// fallback, rounded up (`draind offline` ends it by then, whatever
// happens: a drain that times out, draind unreachable and the fallback
// sleep, a draind restart mid-wait). The kubelet counts the grace period
// from the start of the preStop hook, so the original handler and the
// application's own SIGTERM handling keep the time they had.
func DrainBudgetSeconds(wait, fallback time.Duration) int64 {
	return int64(math.Ceil((wait + fallback).Seconds()))
}

const alreadyInjected = "already injected"

// containerOps returns the additions for container i, or why it is left
// alone.
func containerOps(i int, c *corev1.Container, wait, fallback time.Duration) ([]Op, string) {
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && isDraindHook(c.Lifecycle.PreStop) {
		return nil, alreadyInjected
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath == ToolsDir && m.Name != ToolsVolume {
			return nil, fmt.Sprintf("it mounts volume %s at %s, where the draind binary goes", m.Name, ToolsDir)
		}
	}
	for _, e := range c.Env {
		if e.Name == HostIPEnv && !isFieldRef(e, "status.hostIP") {
			return nil, fmt.Sprintf("it sets %s to something other than status.hostIP, which draind offline reads", HostIPEnv)
		}
		if e.Name == PodIPEnv && !isFieldRef(e, "status.podIP") {
			return nil, fmt.Sprintf("it sets %s, which draind reserves", PodIPEnv)
		}
	}
	cmd := []string{ToolsBinary, "offline", "--wait=" + wait.String(), "--fallback-sleep=" + fallback.String()}
	needPodIP := false
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		then, podIP, err := chain(c.Lifecycle.PreStop, c)
		if err != "" {
			return nil, err
		}
		cmd = append(cmd, then...)
		needPodIP = podIP
	}
	base := fmt.Sprintf("/spec/containers/%d", i)
	var ops []Op
	env := []corev1.EnvVar{}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == HostIPEnv }) {
		env = append(env, fieldEnv(HostIPEnv, "status.hostIP"))
	}
	if needPodIP && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == PodIPEnv }) {
		env = append(env, fieldEnv(PodIPEnv, "status.podIP"))
	}
	ops = append(ops, appendAll(base+"/env", len(c.Env), env)...)
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == ToolsDir }) {
		ops = append(ops, appendOp(base+"/volumeMounts", len(c.VolumeMounts), corev1.VolumeMount{Name: ToolsVolume, MountPath: ToolsDir, ReadOnly: true}))
	}
	hook := &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: cmd}}
	if c.Lifecycle == nil {
		ops = append(ops, Op{Op: "add", Path: base + "/lifecycle", Value: &corev1.Lifecycle{PreStop: hook}})
	} else {
		// add on an existing member replaces it (RFC 6902 4.1); postStart
		// and any other lifecycle field stay.
		ops = append(ops, Op{Op: "add", Path: base + "/lifecycle/preStop", Value: hook})
	}
	return ops, ""
}

// chain turns an existing preStop handler into `draind offline` flags that
// run it after the drain, as the kubelet would have run it. It reports
// whether the chain needs the pod's IP, or why it cannot be chained.
func chain(h *corev1.LifecycleHandler, c *corev1.Container) (args []string, podIP bool, why string) {
	switch {
	case h.Exec != nil:
		if len(h.Exec.Command) == 0 {
			return nil, false, "its preStop exec has no command"
		}
		return append([]string{"--then-exec", "--"}, h.Exec.Command...), false, ""
	case h.HTTPGet != nil:
		u, podIP, err := httpGetURL(h.HTTPGet, c)
		if err != nil {
			return nil, false, "its preStop httpGet: " + err.Error()
		}
		args = []string{"--then-http-get=" + u}
		for _, hd := range h.HTTPGet.HTTPHeaders {
			args = append(args, "--then-http-header="+hd.Name+": "+hd.Value)
		}
		return args, podIP, ""
	case h.Sleep != nil:
		return []string{"--then-sleep=" + (time.Duration(h.Sleep.Seconds) * time.Second).String()}, false, ""
	}
	return nil, false, "its preStop handler is neither exec, httpGet nor sleep (tcpSocket does nothing in a lifecycle hook): it is kept as it is"
}

// httpGetURL builds the URL the kubelet would GET for h: the scheme
// (HTTP by default), the host (the pod IP when empty: left empty here,
// and filled from $DRAIND_POD_IP by draind offline), the port (a number,
// or a name resolved against the container's ports, as the kubelet does)
// and the path, which may carry a query.
func httpGetURL(h *corev1.HTTPGetAction, c *corev1.Container) (string, bool, error) {
	port, err := resolvePort(h.Port, c)
	if err != nil {
		return "", false, err
	}
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	if scheme != "http" && scheme != "https" {
		return "", false, fmt.Errorf("scheme %q", h.Scheme)
	}
	u, err := url.Parse(h.Path)
	if err != nil {
		u = &url.URL{Path: h.Path}
	}
	u.Scheme = scheme
	u.Host = net.JoinHostPort(h.Host, strconv.Itoa(port))
	if h.Host != "" && strings.Contains(h.Host, ":") && net.ParseIP(h.Host) == nil {
		return "", false, fmt.Errorf("host %q", h.Host)
	}
	return u.String(), h.Host == "", nil
}

func resolvePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal <= 0 || p.IntVal > 65535 {
			return 0, fmt.Errorf("port %d", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil && n > 0 && n <= 65535 {
		return n, nil
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("port %q is not a number nor the name of a port of the container", p.StrVal)
}

// isDraindHook recognises a preStop that already calls draind offline
// through the tools volume: an injected one, or the README's recipe.
func isDraindHook(h *corev1.LifecycleHandler) bool {
	return h.Exec != nil && len(h.Exec.Command) >= 2 && h.Exec.Command[0] == ToolsBinary && h.Exec.Command[1] == "offline"
}

func isFieldRef(e corev1.EnvVar, path string) bool {
	return e.Value == "" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == path
}

func fieldEnv(name, path string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}}
}

// selectContainers returns the regular containers to inject: those named
// by draind.io/inject-containers, or all.
func selectContainers(pod *corev1.Pod) (map[string]bool, []string) {
	sel := map[string]bool{}
	list, ok := pod.Annotations[KeyContainers]
	if !ok {
		for _, c := range pod.Spec.Containers {
			sel[c.Name] = true
		}
		return sel, nil
	}
	var warn []string
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if !slices.ContainsFunc(pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == n }) {
			warn = append(warn, fmt.Sprintf("draind: %s names %q, which is not a container of the pod", KeyContainers, n))
			continue
		}
		sel[n] = true
	}
	return sel, warn
}

// reservedNamesConflict reports a pod that uses the tools volume's or the
// init container's name for something else.
func reservedNamesConflict(pod *corev1.Pod) string {
	for _, v := range pod.Spec.Volumes {
		if v.Name == ToolsVolume && v.EmptyDir == nil {
			return fmt.Sprintf("its volume %s is not an emptyDir (the name is draind's)", ToolsVolume)
		}
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == InitContainer {
			return fmt.Sprintf("it has a container named %s (the name is draind's init container's)", InitContainer)
		}
	}
	return ""
}

func toolsVolume() corev1.Volume {
	limit := resource.MustParse("256Mi")
	return corev1.Volume{Name: ToolsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &limit}}}
}

// initContainerUID is the distroless "nonroot" user: copying a file into an
// emptyDir (mode 0777) needs no privilege, and a namespace enforcing the
// "restricted" Pod Security level admits the container as it is.
const initContainerUID = 65532

func initContainer(o Options) corev1.Container {
	uid := int64(initContainerUID)
	f, t := false, true
	return corev1.Container{
		Name:            InitContainer,
		Image:           o.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command:         []string{o.ImageBinary, "copy-self", ToolsBinary},
		VolumeMounts:    []corev1.VolumeMount{{Name: ToolsVolume, MountPath: ToolsDir}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsUser:                &uid,
			RunAsGroup:               &uid,
			RunAsNonRoot:             &t,
			AllowPrivilegeEscalation: &f,
			ReadOnlyRootFilesystem:   &t,
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
}

// appendOp adds v to the list at path, creating the list when it has n=0
// elements (an absent list cannot be appended to with "/-").
func appendOp(path string, n int, v any) Op {
	if n == 0 {
		return Op{Op: "add", Path: path, Value: []any{v}}
	}
	return Op{Op: "add", Path: path + "/-", Value: v}
}

func appendAll[T any](path string, n int, vs []T) []Op {
	if len(vs) == 0 {
		return nil
	}
	if n == 0 {
		return []Op{{Op: "add", Path: path, Value: vs}}
	}
	ops := make([]Op, 0, len(vs))
	for _, v := range vs {
		ops = append(ops, Op{Op: "add", Path: path + "/-", Value: v})
	}
	return ops
}

// escape encodes a JSON pointer token (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
