package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/test/cluster/kube"
)

// The bed's cluster DNS: every kubelet names ClusterDNSIP in its pods'
// resolv.conf (ClusterFirst) with ClusterDomain, and ClusterDNS answers
// there once started. It is CoreDNS (built from source with the e2e suite,
// e2ebin.CoreDNS) with its kubernetes plugin, as a cluster's DNS add-on
// configures it, run beside the control plane rather than as a pod: it
// serves Services (A, SRV, headless Services' endpoints and their
// hostnames, ExternalName CNAMEs), pods (<a-b-c-d>.<namespace>.pod) and
// reverse (PTR) records. It forwards nothing: a name outside the cluster's
// zones gets an error, and nothing leaves the machine.
const (
	ClusterDNSIP  = "10.96.0.10"
	ClusterDomain = "cluster.local"
)

// ClusterDNS is the cluster DNS's CoreDNS process.
type ClusterDNS struct {
	client   kubernetes.Interface
	proc     *proc
	stopOnce sync.Once
	stopErr  error
}

// corefile is the cluster DNS's configuration: the kubernetes plugin as a
// cluster's DNS add-on sets it (pod records without a pod lookup, reverse
// zones falling through), a short TTL and no cache, so that a spec sees a
// changed Service within seconds.
const corefile = `.:53 {
    bind %[1]s
    errors
    ready %[2]s
    kubernetes %[3]s in-addr.arpa ip6.arpa {
        kubeconfig %[4]s
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    loadbalance
}
`

// StartClusterDNS runs CoreDNS (the binary at coredns) on the first node's
// host address, port 53 (which every node's link guard lets through), waits
// until its kubernetes plugin has synced and it answers, and makes it the
// kube-system/kube-dns Service at ClusterDNSIP with a selector-less
// EndpointSlice. It serves until ctx ends, Stop, or the test process exits.
func (m *Multi) StartClusterDNS(ctx context.Context, coredns string) (*ClusterDNS, error) {
	addr := m.Nodes[0].HostIP
	ready, err := kube.FreeAddr()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(m.Dir, "coredns.kubeconfig")
	if err := kube.WriteKubeconfig(kubeconfig, m.Cluster.AdminConfig); err != nil {
		return nil, err
	}
	conf := filepath.Join(m.Dir, "Corefile")
	if err := os.WriteFile(conf, fmt.Appendf(nil, corefile, addr, ready, ClusterDomain, kubeconfig), 0o644); err != nil {
		return nil, fmt.Errorf("writing the cluster DNS's Corefile: %w", err)
	}
	p, err := m.cp.startProcIn("", "coredns", coredns, "-conf", conf)
	if err != nil {
		return nil, err
	}
	d := &ClusterDNS{client: m.Cluster.Admin, proc: p}
	stop := context.AfterFunc(ctx, func() { d.Stop() })
	fail := func(err error) (*ClusterDNS, error) { stop(); return nil, errors.Join(err, d.Stop()) }
	if err := d.waitReady(ctx, "http://"+ready+"/ready", netip.AddrPortFrom(addr, 53)); err != nil {
		return fail(err)
	}
	if err := d.publish(ctx, addr); err != nil {
		return fail(err)
	}
	return d, nil
}

// waitReady polls CoreDNS's readiness endpoint (ready once the kubernetes
// plugin has listed the cluster), then asks it for the kubernetes Service's
// name over UDP and TCP.
func (d *ClusterDNS) waitReady(ctx context.Context, readyURL string, server netip.AddrPort) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	name := "kubernetes.default.svc." + ClusterDomain + "."
	var last error
	err := kube.Poll(ctx, 200*time.Millisecond, func() (bool, error) {
		if err := d.proc.deadErr(); err != nil {
			return false, err
		}
		if last = httpOK(ctx, readyURL); last != nil {
			return false, nil
		}
		for _, network := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: network, Timeout: 2 * time.Second}
			q := new(dns.Msg).SetQuestion(name, dns.TypeA)
			r, _, err := c.ExchangeContext(ctx, q, server.String())
			if err != nil {
				last = err
				return false, nil
			}
			if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
				last = fmt.Errorf("%s over %s: %s, %d answers", name, network, dns.RcodeToString[r.Rcode], len(r.Answer))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the cluster DNS (CoreDNS, log %s) did not become ready: %w (last: %v)", d.proc.logPath, err, last)
	}
	return nil
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// Stop stops CoreDNS; later calls return the first one's result.
func (d *ClusterDNS) Stop() error {
	d.stopOnce.Do(func() { d.stopErr = d.proc.stop(5 * time.Second) })
	return d.stopErr
}

// publish creates the kube-dns Service and its EndpointSlice (if absent).
func (d *ClusterDNS) publish(ctx context.Context, addr netip.Addr) error {
	ports := []corev1.ServicePort{
		{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		{Name: "dns-tcp", Port: 53, Protocol: corev1.ProtocolTCP},
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns", Labels: map[string]string{"k8s-app": "kube-dns"}},
		Spec:       corev1.ServiceSpec{ClusterIP: ClusterDNSIP, Ports: ports},
	}
	if _, err := d.client.CoreV1().Services("kube-system").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns Service: %w", err)
	}
	ready := true
	var sp []discoveryv1.EndpointPort
	for _, p := range ports {
		sp = append(sp, discoveryv1.EndpointPort{Name: &p.Name, Port: &p.Port, Protocol: &p.Protocol})
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-dns-bed", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kube-dns", discoveryv1.LabelManagedBy: "draind.test-bed"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr.String()}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		Ports:       sp,
	}
	if _, err := d.client.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the kube-dns EndpointSlice: %w", err)
	}
	return nil
}
