package realnode

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/yaml"

	"github.com/draind/draind/k8s"
)

// The rollout's application: the test app's HTTP server, port 8080, behind
// a ClusterIP Service on port 80.
const (
	AppPort     = 8080
	ServicePort = 80
	StatsPort   = 9000
)

// READMEBlock returns the first ```yaml block that follows the line
// containing marker in a README: tests run the recipes exactly as the
// README prints them.
func READMEBlock(readme []byte, marker string) ([]byte, error) {
	i := bytes.Index(readme, []byte(marker))
	if i < 0 {
		return nil, fmt.Errorf("README has no %q", marker)
	}
	rest := readme[i:]
	const open, closing = "```yaml\n", "\n```"
	j := bytes.Index(rest, []byte(open))
	if j < 0 {
		return nil, fmt.Errorf("README has no yaml block after %q", marker)
	}
	rest = rest[j+len(open):]
	k := bytes.Index(rest, []byte(closing))
	if k < 0 {
		return nil, fmt.Errorf("README's yaml block after %q is not closed", marker)
	}
	return rest[:k+1], nil
}

// appPodSpec is the application's own pod: the server, its name in the
// environment (answers say who served), readiness on /healthz of the
// serving port every 5 s. The kubelet keeps probing readiness while a pod
// terminates, from the node: those SYNs reach the pod like any other and
// draind counts them, so a probe period shorter than draind's quiet period
// (2 s) would keep the pod from ever counting as drained.
func appPodSpec() corev1.PodSpec {
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:  "app",
			Image: AppImage,
			Args:  []string{"server", "-port", fmt.Sprint(AppPort)},
			Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: AppPort}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(AppPort)}},
				PeriodSeconds: 5, FailureThreshold: 1,
			},
		}},
	}
}

// WithRecipe merges a README recipe (a partial pod manifest, `spec:` at
// the top) into the application's pod spec the way kubectl merges a patch:
// containers by name, env by name, volumes by name.
func WithRecipe(recipe []byte) (corev1.PodSpec, error) {
	return MergeRecipe(appPodSpec(), recipe)
}

// MergeRecipe merges a README recipe into base as WithRecipe does; the
// recipe names the container "app", so base's container must be named so.
func MergeRecipe(base corev1.PodSpec, recipe []byte) (corev1.PodSpec, error) {
	var doc struct {
		Spec json.RawMessage `json:"spec"`
	}
	js, err := yaml.YAMLToJSONStrict(recipe)
	if err != nil {
		return corev1.PodSpec{}, fmt.Errorf("reading the recipe: %w", err)
	}
	if err := json.Unmarshal(js, &doc); err != nil || len(doc.Spec) == 0 {
		return corev1.PodSpec{}, fmt.Errorf("reading the recipe: want a spec: at the top (%v)", err)
	}
	baseJSON, err := json.Marshal(base)
	if err != nil {
		return corev1.PodSpec{}, err
	}
	merged, err := strategicpatch.StrategicMergePatch(baseJSON, doc.Spec, corev1.PodSpec{})
	if err != nil {
		return corev1.PodSpec{}, fmt.Errorf("merging the recipe into the pod: %w", err)
	}
	var out corev1.PodSpec
	dec := json.NewDecoder(bytes.NewReader(merged))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return corev1.PodSpec{}, fmt.Errorf("decoding the merged pod: %w", err)
	}
	return out, nil
}

// SleepPodSpec is the application with the usual preStop: sleep.
func SleepPodSpec(seconds int64) corev1.PodSpec {
	s := appPodSpec()
	s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}}
	return s
}

// AppObjects returns the application's Deployment (replicas pods of spec,
// the default rolling update: one surge pod, none unavailable) and its
// ClusterIP Service.
func AppObjects(namespace, name string, replicas int32, spec corev1.PodSpec) (*appsv1.Deployment, *corev1.Service) {
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			// Opted in to pod-IP steering from the deletion on, as draind's
			// webhook does for the pods it injects: the stale client is
			// steered before the preStop's offline call reaches draind.
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels,
				Annotations: map[string]string{k8s.AnnotationSteerOnDelete: "true"}}, Spec: spec},
		},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: ServicePort, TargetPort: intstr.FromInt32(AppPort)}},
		},
	}
	return dep, svc
}

// Client kinds of the rollout.
const (
	ClientClusterIP = "clusterip"  // a new connection every 20 ms to the ClusterIP
	ClientStale     = "stale-ip"   // a new connection every 20 ms to an old pod's IP
	ClientKeepAlive = "keep-alive" // one connection, a request every 20 ms, renewed every second
)

// ClientPod is a client of kind sending to target (host:port).
func ClientPod(namespace, kind, target string) *corev1.Pod {
	args := []string{"client", "-target", target, "-interval", "20ms", "-stats", fmt.Sprintf(":%d", StatsPort)}
	if kind == ClientKeepAlive {
		args = append(args, "-keepalive", "-max-age", "1s")
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "client-" + kind, Labels: map[string]string{"role": "client"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "client", Image: AppImage, Args: args,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/stats", Port: intstr.FromInt32(StatsPort)}},
					PeriodSeconds: 1,
				},
			}},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
}

// ClientStats is what a client pod counted (testapp's /stats).
type ClientStats struct {
	Target string         `json:"target"`
	OK     int            `json:"ok"`
	Fails  map[string]int `json:"fails"`
	By     map[string]int `json:"by"`
	Errors []string       `json:"errors"`
}

// Failed is the number of failed requests.
func (s ClientStats) Failed() int {
	n := 0
	for _, v := range s.Fails {
		n += v
	}
	return n
}

// Sub returns what happened between earlier and s.
func (s ClientStats) Sub(earlier ClientStats) ClientStats {
	out := ClientStats{Target: s.Target, OK: s.OK - earlier.OK, Fails: map[string]int{}, By: map[string]int{}}
	for k, v := range s.Fails {
		if d := v - earlier.Fails[k]; d != 0 {
			out.Fails[k] = d
		}
	}
	for k, v := range s.By {
		if d := v - earlier.By[k]; d != 0 {
			out.By[k] = d
		}
	}
	seen := map[string]bool{}
	for _, e := range earlier.Errors {
		seen[e] = true
	}
	for _, e := range s.Errors {
		if !seen[e] {
			out.Errors = append(out.Errors, e)
		}
	}
	return out
}

// FailKinds formats failures by class: "refused=3 timeout=1", or "-".
func (s ClientStats) FailKinds() string {
	if len(s.Fails) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(s.Fails))
	for k := range s.Fails {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, s.Fails[k])
	}
	return strings.Join(parts, " ")
}

// httpClient makes requests from inside the node's namespace.
func (n *Node) httpClient() *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: n.DialContext, DisableKeepAlives: true}}
}

// HTTPGet fetches url from inside the node's namespace (pods, the node's
// own ports).
func (n *Node) HTTPGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := n.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return body, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// ReadClientStats reads a client pod's counters.
func (n *Node) ReadClientStats(ctx context.Context, podIP string) (ClientStats, error) {
	var st ClientStats
	body, err := n.HTTPGet(ctx, fmt.Sprintf("http://%s:%d/stats", podIP, StatsPort))
	if err != nil {
		return st, fmt.Errorf("reading client stats at %s: %w", podIP, err)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("decoding client stats at %s: %w", podIP, err)
	}
	return st, nil
}

// KubeletEvent is one line of the kubelet's log about a pod, with the
// kubelet's own timestamp.
type KubeletEvent struct {
	Time time.Time
	Msg  string // the structured message, e.g. "SyncLoop DELETE"
	Line string
}

// klogLine matches klog's header and its structured message:
// I1130 20:01:02.123456    1234 kubelet.go:2471] "SyncLoop DELETE" ...
var klogLine = regexp.MustCompile(`^[IWE](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d{6})\s+\d+ [^\]]+\] "([^"]*)"`)

// KubeletLog returns the kubelet's log lines that mention every one of
// needles, in order, with their timestamps (klog writes the local time
// without a year: the current year and local zone are assumed).
func (n *Node) KubeletLog(needles ...string) ([]KubeletEvent, error) {
	f, err := os.Open(n.LogPath("kubelet"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	year := time.Now().Year()
	var out []KubeletEvent
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 16<<20)
lines:
	for s.Scan() {
		line := s.Text()
		for _, nd := range needles {
			if !strings.Contains(line, nd) {
				continue lines
			}
		}
		m := klogLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		t, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s%s %s", year, m[1], m[2], m[3]), time.Local)
		if err != nil {
			continue
		}
		out = append(out, KubeletEvent{Time: t, Msg: m[4], Line: line})
	}
	return out, s.Err()
}
