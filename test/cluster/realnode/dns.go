package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The DNS rollout's server: the test app's DNS server on port 53 (UDP and
// TCP) behind a ClusterIP Service on port 53, answering DNSName with the
// answering pod's IP.
const (
	DNSPort      = 53
	DNSReadyPort = 8181
	DNSName      = "dns-test.draind.test."
)

// DNSPodSpec is the DNS server's pod: its container is named "app" so that
// the README's recipes merge into it as printed. Readiness is /ready on
// 8181 every 5 s, as CoreDNS's ready plugin is probed; like the HTTP
// application's probe, its period is longer than draind's quiet period
// (each probe is a SYN to the draining pod). DRAIND_DNS_ANSWER_DELAY (a
// Go duration, e.g. 200ms) makes the server answer every query that much
// later, which keeps answers on their way as drains start
// (docs/multinode.md).
func DNSPodSpec() corev1.PodSpec {
	args := []string{"dns-server", "-port", fmt.Sprint(DNSPort), "-name", DNSName, "-ready", fmt.Sprintf(":%d", DNSReadyPort)}
	if d := os.Getenv("DRAIND_DNS_ANSWER_DELAY"); d != "" {
		args = append(args, "-delay", d)
	}
	return corev1.PodSpec{
		Containers: []corev1.Container{{
			Name:  "app",
			Image: AppImage,
			Args:  args,
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			},
			Ports: []corev1.ContainerPort{
				{Name: "dns", ContainerPort: DNSPort, Protocol: corev1.ProtocolUDP},
				{Name: "dns-tcp", ContainerPort: DNSPort, Protocol: corev1.ProtocolTCP},
				{Name: "ready", ContainerPort: DNSReadyPort, Protocol: corev1.ProtocolTCP},
			},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromInt32(DNSReadyPort)}},
				PeriodSeconds: 5, FailureThreshold: 1,
			},
		}},
	}
}

// DNSSleepPodSpec is the DNS server with a plain preStop sleep: the wait a
// DNS Deployment without draind has before its server stops (CoreDNS's
// `lameduck 5s`, kubeadm's default, is the same wait inside the process).
func DNSSleepPodSpec(seconds int64) corev1.PodSpec {
	s := DNSPodSpec()
	s.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: seconds}}}
	return s
}

// DNSObjects returns the DNS Deployment (replicas pods of spec, the default
// rolling update) and its ClusterIP Service on UDP and TCP 53.
func DNSObjects(namespace, name string, replicas int32, spec corev1.PodSpec) (*appsv1.Deployment, *corev1.Service) {
	dep, svc := AppObjects(namespace, name, replicas, spec)
	svc.Spec.Ports = []corev1.ServicePort{
		{Name: "dns", Port: DNSPort, TargetPort: intstr.FromString("dns"), Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", Port: DNSPort, TargetPort: intstr.FromString("dns-tcp"), Protocol: corev1.ProtocolTCP},
	}
	return dep, svc
}

// DNS client kinds: both look up DNSName 50 times a second, each lookup
// with a 1 s timeout, concurrently.
const (
	// DNSClientGo is Go's resolver (PreferGo), a connected UDP socket per
	// query.
	DNSClientGo = "go-resolver"
	// DNSClientSendto sends every query with sendto() on one long-lived
	// unconnected UDP socket, as glibc's and musl's stub resolvers do, and
	// fails an answer from any address but the Service's.
	DNSClientSendto = "sendto"
)

// DNSTimeout is each lookup's timeout.
const DNSTimeout = time.Second

// DNSClientPod is a DNS client of kind asking server (the Service's
// ClusterIP:53). Its resolv.conf names the server with one attempt and a
// 1 s timeout, so Go's resolver sends one query per lookup as the sendto
// client does (its Dial sends to server whatever resolv.conf says).
func DNSClientPod(namespace, kind string, server netip.AddrPort) *corev1.Pod {
	mode := map[string]string{DNSClientGo: "go", DNSClientSendto: "sendto"}[kind]
	args := []string{"dns-client", "-mode", mode, "-server", server.String(), "-name", DNSName,
		"-interval", "20ms", "-timeout", DNSTimeout.String(), "-stats", fmt.Sprintf(":%d", StatsPort)}
	one, secs := "1", fmt.Sprint(int(DNSTimeout.Seconds()))
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "dns-client-" + kind, Labels: map[string]string{"role": "dns-client"}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{
				Name: "client", Image: AppImage, Args: args,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/stats", Port: intstr.FromInt32(StatsPort)}},
					PeriodSeconds: 1,
				},
			}},
			DNSPolicy: corev1.DNSNone,
			DNSConfig: &corev1.PodDNSConfig{
				Nameservers: []string{server.Addr().String()},
				Options: []corev1.PodDNSConfigOption{
					{Name: "ndots", Value: &one}, {Name: "attempts", Value: &one}, {Name: "timeout", Value: &secs},
				},
			},
			TerminationGracePeriodSeconds: new(int64),
		},
	}
}

// Lookup is one DNS lookup of a client (testapp's /lookups).
type Lookup struct {
	At      int64  `json:"at"`           // sent, Unix nanoseconds
	Took    int64  `json:"took"`         // until the answer or the failure, ns
	Backend string `json:"be,omitempty"` // the address answered: the pod that answered
	Fail    string `json:"fail,omitempty"`
}

// Time is when the lookup was sent.
func (l Lookup) Time() time.Time { return time.Unix(0, l.At) }

// Pending reports a lookup still waiting for its answer.
func (l Lookup) Pending() bool { return l.Backend == "" && l.Fail == "" }

// ReadLookups reads a DNS client pod's lookups from the from-th on.
func (n *Node) ReadLookups(ctx context.Context, podIP string, from int) ([]Lookup, error) {
	body, err := n.HTTPGet(ctx, fmt.Sprintf("http://%s:%d/lookups?from=%d", podIP, StatsPort, from))
	if err != nil {
		return nil, fmt.Errorf("reading lookups at %s: %w", podIP, err)
	}
	var out []Lookup
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decoding lookups at %s: %w", podIP, err)
	}
	return out, nil
}
