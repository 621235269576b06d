package inject

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var testOpts = Options{Image: "ghcr.io/draind/draind:v0.2.0", Namespace: "draind-system", Wait: 60 * time.Second, FallbackSleep: 20 * time.Second}

// pod builds a pod as the API server hands it to admission: defaults
// applied (a 30 s grace period).
func pod(mod ...func(*corev1.Pod)) *corev1.Pod {
	grace := int64(30)
	p := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "cart-a", Namespace: "shop"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "app", Image: "shop/cart:1"}},
		},
	}
	for _, m := range mod {
		m(p)
	}
	return p
}

func annotate(k, v string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[k] = v
	}
}

func preStop(h corev1.LifecycleHandler) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &h} }
}

// apply applies a patch to the pod's JSON, as the API server does, and
// decodes the result.
func apply(t *testing.T, raw []byte, r Result) ([]byte, *corev1.Pod) {
	t.Helper()
	pj, err := r.PatchJSON()
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(pj)
	if err != nil {
		t.Fatalf("decoding patch %s: %v", pj, err)
	}
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("applying patch %s: %v", pj, err)
	}
	var p corev1.Pod
	if err := json.Unmarshal(out, &p); err != nil {
		t.Fatal(err)
	}
	return out, &p
}

func hook(p *corev1.Pod, container string) []string {
	for _, c := range p.Spec.Containers {
		if c.Name == container && c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Exec != nil {
			return c.Lifecycle.PreStop.Exec.Command
		}
	}
	return nil
}

func env(p *corev1.Pod, container, name string) *corev1.EnvVar {
	for _, c := range p.Spec.Containers {
		if c.Name != container {
			continue
		}
		for i := range c.Env {
			if c.Env[i].Name == name {
				return &c.Env[i]
			}
		}
	}
	return nil
}

var offline60 = []string{ToolsBinary, "offline", "--wait=1m0s", "--fallback-sleep=20s"}

func TestMutate(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pod       *corev1.Pod
		nsOptedIn bool
		// want: nil means no patch at all.
		want     map[string][]string // container -> preStop command
		grace    int64
		warning  string // a substring of one warning
		skipped  string // a substring of Skipped[""] when nothing is injected
		check    func(t *testing.T, p *corev1.Pod)
		noInitOp bool
	}{
		{
			name: "namespace opts in, no preStop", pod: pod(), nsOptedIn: true,
			want: map[string][]string{"app": offline60}, grace: 110,
		},
		{
			name: "pod opts in, namespace does not", pod: pod(annotate(Key, "true")),
			want: map[string][]string{"app": offline60}, grace: 110,
		},
		{
			name: "neither opts in", pod: pod(), skipped: "neither",
		},
		{
			name: "pod opts out in an opted-in namespace", pod: pod(annotate(Key, "false")), nsOptedIn: true, skipped: "opts out",
		},
		{
			name: "host network", pod: pod(annotate(Key, "true"), func(p *corev1.Pod) { p.Spec.HostNetwork = true }), nsOptedIn: true, skipped: "host network",
		},
		{
			name: "Windows pod", pod: pod(func(p *corev1.Pod) { p.Spec.OS = &corev1.PodOS{Name: corev1.Windows} }), nsOptedIn: true, skipped: "Windows",
		},
		{
			name: "pod for Windows nodes", pod: pod(func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{corev1.LabelOSStable: "windows"} }), nsOptedIn: true, skipped: "Windows",
		},
		{
			name: "exec preStop is chained", nsOptedIn: true,
			pod:   pod(preStop(corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sh", "-c", "nginx -s quit; sleep 3"}}})),
			want:  map[string][]string{"app": append(slices.Clone(offline60), "--then-exec", "--", "/bin/sh", "-c", "nginx -s quit; sleep 3")},
			grace: 110,
		},
		{
			name: "httpGet preStop with a named port, a query and headers is chained to the pod IP", nsOptedIn: true,
			pod: pod(
				func(p *corev1.Pod) {
					p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "admin", ContainerPort: 8081}}
				},
				preStop(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/shutdown?graceful=1", Port: intstr.FromString("admin"), Scheme: corev1.URISchemeHTTPS,
					HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Token", Value: "a b"}},
				}})),
			want: map[string][]string{"app": append(slices.Clone(offline60),
				"--then-http-get=https://:8081/shutdown?graceful=1", "--then-http-header=X-Token: a b")},
			grace: 110,
			check: func(t *testing.T, p *corev1.Pod) {
				if e := env(p, "app", PodIPEnv); e == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
					t.Errorf("%s: %+v, want status.podIP", PodIPEnv, e)
				}
			},
		},
		{
			name: "httpGet preStop with a host and a numeric port", nsOptedIn: true,
			pod:   pod(preStop(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Host: "fd00::5", Path: "/q", Port: intstr.FromInt32(80)}})),
			want:  map[string][]string{"app": append(slices.Clone(offline60), "--then-http-get=http://[fd00::5]:80/q")},
			grace: 110,
			check: func(t *testing.T, p *corev1.Pod) {
				if e := env(p, "app", PodIPEnv); e != nil {
					t.Errorf("%s added though the httpGet names its host", PodIPEnv)
				}
			},
		},
		{
			name: "httpGet preStop with an unknown port name is left alone", nsOptedIn: true,
			pod:     pod(preStop(corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("nope")}})),
			warning: `port "nope"`, skipped: "no container",
		},
		{
			name: "sleep preStop is chained", nsOptedIn: true,
			pod:   pod(preStop(corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 5}})),
			want:  map[string][]string{"app": append(slices.Clone(offline60), "--then-sleep=5s")},
			grace: 110,
		},
		{
			name: "tcpSocket preStop is left alone", nsOptedIn: true,
			pod:     pod(preStop(corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(80)}})),
			warning: "neither exec", skipped: "no container",
		},
		{
			name: "postStart is kept", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"warm"}}}}
			}),
			want: map[string][]string{"app": offline60}, grace: 110,
			check: func(t *testing.T, p *corev1.Pod) {
				if ps := p.Spec.Containers[0].Lifecycle.PostStart; ps == nil || ps.Exec.Command[0] != "warm" {
					t.Errorf("postStart lost: %+v", ps)
				}
			},
		},
		{
			name: "draind.io/wait overrides the wait and the grace period follows", nsOptedIn: true,
			pod:   pod(annotate(KeyWait, "30s")),
			want:  map[string][]string{"app": {ToolsBinary, "offline", "--wait=30s", "--fallback-sleep=20s"}},
			grace: 80,
		},
		{
			name: "a bad draind.io/wait warns and uses the default", nsOptedIn: true,
			pod:  pod(annotate(KeyWait, "soon")),
			want: map[string][]string{"app": offline60}, grace: 110, warning: "is not a duration",
		},
		{
			name: "the grace period the user set is extended", nsOptedIn: true,
			pod:  pod(func(p *corev1.Pod) { g := int64(5); p.Spec.TerminationGracePeriodSeconds = &g }),
			want: map[string][]string{"app": offline60}, grace: 85,
		},
		{
			name: "draind.io/inject-containers selects", nsOptedIn: true,
			pod: pod(annotate(KeyContainers, "web, ghost"), func(p *corev1.Pod) {
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "web", Image: "nginx"})
			}),
			want: map[string][]string{"web": offline60}, grace: 110, warning: `"ghost"`,
			check: func(t *testing.T, p *corev1.Pod) {
				if hook(p, "app") != nil || env(p, "app", HostIPEnv) != nil || len(p.Spec.Containers[0].VolumeMounts) != 0 {
					t.Errorf("container app was touched: %+v", p.Spec.Containers[0])
				}
			},
		},
		{
			name: "every container by default; native sidecars and init containers are not touched", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				always := corev1.ContainerRestartPolicyAlways
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "web", Image: "nginx"})
				p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "m"}, {Name: "proxy", Image: "p", RestartPolicy: &always}}
			}),
			want: map[string][]string{"app": offline60, "web": offline60}, grace: 110,
			check: func(t *testing.T, p *corev1.Pod) {
				var names []string
				for _, c := range p.Spec.InitContainers {
					names = append(names, c.Name)
					if c.Name != InitContainer && (c.Lifecycle != nil || len(c.Env) > 0 || len(c.VolumeMounts) > 0) {
						t.Errorf("init container %s was touched", c.Name)
					}
				}
				if !slices.Equal(names, []string{InitContainer, "migrate", "proxy"}) {
					t.Errorf("init containers %v, want draind-tools first", names)
				}
			},
		},
		{
			name: "HOST_IP from status.hostIP already there is reused", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "A", Value: "1"}, fieldEnv(HostIPEnv, "status.hostIP")}
			}),
			want: map[string][]string{"app": offline60}, grace: 110,
			check: func(t *testing.T, p *corev1.Pod) {
				if n := len(p.Spec.Containers[0].Env); n != 2 {
					t.Errorf("%d env vars, want the 2 the pod had", n)
				}
			},
		},
		{
			name: "HOST_IP meaning something else leaves the container alone", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].Env = []corev1.EnvVar{{Name: HostIPEnv, Value: "10.0.0.1"}}
			}),
			warning: HostIPEnv, skipped: "no container",
		},
		{
			name: "a volume named draind-tools that is not an emptyDir leaves the pod alone", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{{Name: ToolsVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}}}
			}),
			warning: "not an emptyDir", skipped: "not an emptyDir",
		},
		{
			name: "another volume mounted at /draind-tools leaves the container alone", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "x", MountPath: ToolsDir}}
			}),
			warning: "mounts volume x", skipped: "no container",
		},
		{
			name: "the README's manual recipe is recognised", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{toolsVolume()}
				p.Spec.InitContainers = []corev1.Container{initContainer(testOpts.withDefaults())}
				p.Spec.Containers[0].Env = []corev1.EnvVar{fieldEnv(HostIPEnv, "status.hostIP")}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: ToolsVolume, MountPath: ToolsDir}}
				p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{ToolsBinary, "offline", "--wait=30s"}}}}
			}),
			skipped: "no container",
		},
		{
			name: "the manual recipe in one container, a plain second container", nsOptedIn: true,
			pod: pod(func(p *corev1.Pod) {
				p.Spec.Volumes = []corev1.Volume{toolsVolume()}
				p.Spec.InitContainers = []corev1.Container{initContainer(testOpts.withDefaults())}
				p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: ToolsVolume, MountPath: ToolsDir}}
				p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{ToolsBinary, "offline"}}}}
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "web", Image: "nginx"})
			}),
			want: map[string][]string{"web": offline60}, grace: 110, noInitOp: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.pod)
			if err != nil {
				t.Fatal(err)
			}
			before := tc.pod.DeepCopy()
			r, err := Mutate(tc.pod, tc.nsOptedIn, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(before, tc.pod) {
				t.Fatal("Mutate changed its argument")
			}
			if tc.warning != "" && !slices.ContainsFunc(r.Warnings, func(w string) bool { return strings.Contains(w, tc.warning) }) {
				t.Errorf("warnings %q, want one containing %q", r.Warnings, tc.warning)
			}
			if tc.want == nil {
				if len(r.Patch) != 0 {
					t.Fatalf("patch %+v, want none", r.Patch)
				}
				if !strings.Contains(r.Skipped[""], tc.skipped) {
					t.Errorf("skipped because %q, want %q", r.Skipped[""], tc.skipped)
				}
				return
			}
			if tc.noInitOp && slices.ContainsFunc(r.Patch, func(o Op) bool {
				return strings.HasPrefix(o.Path, "/spec/initContainers") || strings.HasPrefix(o.Path, "/spec/volumes")
			}) {
				t.Errorf("patch adds the init container or volume the pod already has: %+v", r.Patch)
			}
			out, got := apply(t, raw, r)
			for _, c := range got.Spec.Containers {
				want, selected := tc.want[c.Name]
				if !selected {
					continue
				}
				if h := hook(got, c.Name); !slices.Equal(h, want) {
					t.Errorf("container %s preStop\n got %q\nwant %q", c.Name, h, want)
				}
				if e := env(got, c.Name, HostIPEnv); e == nil || !isFieldRef(*e, "status.hostIP") {
					t.Errorf("container %s %s = %+v, want status.hostIP", c.Name, HostIPEnv, e)
				}
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == ToolsVolume && m.MountPath == ToolsDir }) {
					t.Errorf("container %s does not mount %s at %s", c.Name, ToolsVolume, ToolsDir)
				}
			}
			if g := got.Spec.TerminationGracePeriodSeconds; g == nil || *g != tc.grace {
				t.Errorf("terminationGracePeriodSeconds %v, want %d", g, tc.grace)
			}
			ic := got.Spec.InitContainers[0]
			if ic.Name != InitContainer || ic.Image != testOpts.Image || !slices.Equal(ic.Command, []string{DefaultImageBinary, "copy-self", ToolsBinary}) {
				t.Errorf("first init container %s %s %q", ic.Name, ic.Image, ic.Command)
			}
			vols := 0
			for _, v := range got.Spec.Volumes {
				if v.Name == ToolsVolume {
					vols++
					if v.EmptyDir == nil {
						t.Errorf("volume %s is not an emptyDir", ToolsVolume)
					}
				}
			}
			if vols != 1 {
				t.Errorf("%d volumes named %s", vols, ToolsVolume)
			}
			if got.Annotations[KeyInjected] == "" {
				t.Errorf("no %s annotation", KeyInjected)
			}
			if tc.check != nil {
				tc.check(t, got)
			}

			// Idempotent: the mutated pod is left as it is.
			again, err := Mutate(got, tc.nsOptedIn, testOpts)
			if err != nil {
				t.Fatal(err)
			}
			if len(again.Patch) != 0 {
				t.Errorf("second mutation patches again: %+v", again.Patch)
			}
			if _, p2 := apply(t, out, again); !reflect.DeepEqual(p2, got) {
				t.Error("second mutation changed the pod")
			}
		})
	}
}

// TestMutatePatch pins the exact patch of the simplest case: only adds,
// nothing replaced wholesale.
func TestMutatePatch(t *testing.T) {
	r, err := Mutate(pod(), true, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, o := range r.Patch {
		if o.Op != "add" {
			t.Errorf("op %s %s: the patch only adds", o.Op, o.Path)
		}
		paths = append(paths, o.Path)
	}
	want := []string{
		"/spec/volumes",
		"/spec/initContainers",
		"/spec/terminationGracePeriodSeconds",
		"/metadata/annotations",
		"/spec/containers/0/env",
		"/spec/containers/0/volumeMounts",
		"/spec/containers/0/lifecycle",
	}
	if !slices.Equal(paths, want) {
		t.Errorf("paths\n got %q\nwant %q", paths, want)
	}
	if !slices.Equal(r.Injected, []string{"app"}) {
		t.Errorf("injected %v", r.Injected)
	}
}

// TestMutateKeepsUnknownFields: a field this package's API types do not
// know (a newer API server's) survives, because the patch never rewrites a
// container or a list.
func TestMutateKeepsUnknownFields(t *testing.T) {
	raw := []byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","annotations":{"a":"b"}},
	"spec":{"terminationGracePeriodSeconds":30,"futurePodField":{"x":1},
	"initContainers":[{"name":"i","image":"i","futureField":true}],
	"volumes":[{"name":"data","emptyDir":{}}],
	"containers":[{"name":"app","image":"a","futureField":"keep","env":[{"name":"A","value":"1"}],
	"volumeMounts":[{"name":"data","mountPath":"/data"}],
	"lifecycle":{"futureHook":{"y":2},"preStop":{"exec":{"command":["stop"]}}}}]}}`)
	var p corev1.Pod
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatal(err)
	}
	r, err := Mutate(&p, true, testOpts)
	if err != nil {
		t.Fatal(err)
	}
	out, got := apply(t, raw, r)
	for _, keep := range []string{`"futurePodField":{"x":1}`, `"futureField":true`, `"futureField":"keep"`, `"futureHook":{"y":2}`, `"a":"b"`} {
		if !strings.Contains(string(out), keep) {
			t.Errorf("patched pod lost %s:\n%s", keep, out)
		}
	}
	if h := hook(got, "app"); !slices.Equal(h, append(slices.Clone(offline60), "--then-exec", "--", "stop")) {
		t.Errorf("preStop %q", h)
	}
	if n := len(got.Spec.Containers[0].Env); n != 2 {
		t.Errorf("%d env vars, want A and HOST_IP", n)
	}
}

func TestOptionsValidate(t *testing.T) {
	if _, err := Mutate(pod(), true, Options{}); err == nil {
		t.Error("no image: no error")
	}
	if _, err := Mutate(pod(), true, Options{Image: "x", Namespace: "draind-system", Wait: 2 * time.Hour}); err == nil {
		t.Error("a two-hour wait: no error")
	}
	if _, err := Mutate(pod(), true, Options{Image: "x", Namespace: "draind-system", FallbackSleep: -time.Second}); err == nil {
		t.Error("a negative fallback sleep: no error")
	}
}

func TestDrainBudgetSeconds(t *testing.T) {
	for _, tc := range []struct {
		wait, fallback time.Duration
		want           int64
	}{
		{60 * time.Second, 20 * time.Second, 80},
		{1500 * time.Millisecond, 0, 2},
		{0, 0, 0},
	} {
		if got := DrainBudgetSeconds(tc.wait, tc.fallback); got != tc.want {
			t.Errorf("DrainBudgetSeconds(%v, %v) = %d, want %d", tc.wait, tc.fallback, got, tc.want)
		}
	}
}

// TestNeverInjectedNamespaces: kube-system and draind's namespace (from
// Options, not a fixed name) are never injected, whatever the pod and its
// namespace say.
func TestNeverInjectedNamespaces(t *testing.T) {
	opts := testOpts
	opts.Namespace = "ops-draind"
	for _, tc := range []struct {
		ns   string
		want bool
	}{{"kube-system", false}, {"ops-draind", false}, {"draind-system", true}, {"shop", true}} {
		p := pod(annotate(Key, "true"), func(p *corev1.Pod) { p.Namespace = tc.ns })
		for _, nsOptedIn := range []bool{true, false} {
			r, err := Mutate(p, nsOptedIn, opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(r.Patch) > 0; got != tc.want {
				t.Errorf("namespace %s (namespace opted in %v): injected %v, want %v (%v)", tc.ns, nsOptedIn, got, tc.want, r.Skipped)
			}
		}
	}
}

// TestInjectedPodSteersOnDelete: an injected pod carries KeySteerOnDelete
// "true" unless it set the annotation itself.
func TestInjectedPodSteersOnDelete(t *testing.T) {
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"no annotations", pod(), "true"},
		{"other annotations", pod(annotate("a", "b")), "true"},
		{"the pod says false", pod(annotate(KeySteerOnDelete, "false")), "false"},
	} {
		raw, _ := json.Marshal(tc.pod)
		r, err := Mutate(tc.pod, true, testOpts)
		if err != nil {
			t.Fatal(err)
		}
		_, got := apply(t, raw, r)
		if v := got.Annotations[KeySteerOnDelete]; v != tc.want {
			t.Errorf("%s: %s=%q, want %q", tc.name, KeySteerOnDelete, v, tc.want)
		}
	}
}
