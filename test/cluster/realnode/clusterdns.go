package realnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The bed's cluster DNS: every kubelet names ClusterDNSIP in its pods'
// resolv.conf (ClusterFirst) with ClusterDomain, and ClusterDNS answers
// there once started. It is a stand-in for CoreDNS (which this machine
// cannot build offline) that serves what the upstream Services specs
// resolve: <service>.<namespace>.svc.<domain> (A: the ClusterIP, or a
// headless Service's ready endpoints; CNAME for ExternalName) and
// <a-b-c-d>.<namespace>.pod.<domain>. Other names in the domain are
// NXDOMAIN, names outside it REFUSED: nothing is forwarded off the machine.
const (
	ClusterDNSIP  = "10.96.0.10"
	ClusterDomain = "cluster.local"
)

// ClusterDNS serves the cluster's names for a Multi's pods.
type ClusterDNS struct {
	client  kubernetes.Interface
	servers []*dns.Server
}

// StartClusterDNS serves DNS on the first node's host address, port 53
// (which every node's link guard lets through), and makes it the
// kube-system/kube-dns Service at ClusterDNSIP with a selector-less
// EndpointSlice. It serves until ctx ends or Stop.
func (m *Multi) StartClusterDNS(ctx context.Context) (*ClusterDNS, error) {
	d := &ClusterDNS{client: m.Cluster.Admin}
	addr := netip.AddrPortFrom(m.Nodes[0].HostIP, 53).String()
	for _, network := range []string{"udp", "tcp"} {
		s := &dns.Server{Addr: addr, Net: network, Handler: dns.HandlerFunc(d.serve)}
		started := make(chan error, 1)
		s.NotifyStartedFunc = func() { started <- nil }
		go func() { started <- s.ListenAndServe() }()
		if err := <-started; err != nil {
			return nil, errors.Join(fmt.Errorf("cluster DNS on %s/%s: %w", addr, network, err), d.Stop())
		}
		d.servers = append(d.servers, s)
	}
	go func() { <-ctx.Done(); d.Stop() }()
	if err := d.publish(ctx, m.Nodes[0].HostIP); err != nil {
		return nil, errors.Join(err, d.Stop())
	}
	return d, nil
}

// Stop stops serving.
func (d *ClusterDNS) Stop() error {
	var errs []error
	for _, s := range d.servers {
		errs = append(errs, s.Shutdown())
	}
	d.servers = nil
	return errors.Join(errs...)
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

const dnsTTL = 5

func (d *ClusterDNS) serve(w dns.ResponseWriter, q *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(q)
	resp.Authoritative = true
	if len(q.Question) == 1 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp.Rcode, resp.Answer = d.answer(ctx, q.Question[0])
		cancel()
	} else {
		resp.Rcode = dns.RcodeFormatError
	}
	w.WriteMsg(resp)
}

// answer resolves one question.
func (d *ClusterDNS) answer(ctx context.Context, q dns.Question) (int, []dns.RR) {
	name := strings.ToLower(q.Name)
	rest, ok := strings.CutSuffix(name, "."+ClusterDomain+".")
	if !ok {
		return dns.RcodeRefused, nil
	}
	labels := strings.Split(rest, ".")
	var targets []string // IPv4 addresses, or one name for a CNAME
	cname := false
	switch {
	case len(labels) == 3 && labels[2] == "svc":
		targets, cname = d.service(ctx, labels[1], labels[0])
	case len(labels) == 3 && labels[2] == "pod":
		if a, err := netip.ParseAddr(strings.ReplaceAll(labels[0], "-", ".")); err == nil && a.Is4() {
			targets = []string{a.String()}
		}
	}
	if targets == nil {
		return dns.RcodeNameError, nil
	}
	hdr := dns.RR_Header{Name: q.Name, Class: dns.ClassINET, Ttl: dnsTTL}
	var rrs []dns.RR
	for _, t := range targets {
		switch {
		case cname:
			hdr.Rrtype = dns.TypeCNAME
			rrs = append(rrs, &dns.CNAME{Hdr: hdr, Target: dns.Fqdn(t)})
		case q.Qtype == dns.TypeA || q.Qtype == dns.TypeANY:
			hdr.Rrtype = dns.TypeA
			rrs = append(rrs, &dns.A{Hdr: hdr, A: net.ParseIP(t).To4()})
		}
	}
	return dns.RcodeSuccess, rrs // no AAAA: an empty answer, the name exists
}

// service returns a Service's addresses: its ClusterIPs, a headless
// Service's ready endpoints (empty, not nil, when it has none), or an
// ExternalName Service's name; nil if there is no such Service.
func (d *ClusterDNS) service(ctx context.Context, ns, name string) ([]string, bool) {
	svc, err := d.client.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, false
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		return []string{svc.Spec.ExternalName}, true
	case svc.Spec.ClusterIP != corev1.ClusterIPNone:
		out := []string{}
		for _, ip := range svc.Spec.ClusterIPs {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
				out = append(out, ip)
			}
		}
		return out, false
	}
	slices, err := d.client.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name})
	if err != nil {
		return nil, false
	}
	out := []string{}
	for _, s := range slices.Items {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready || svc.Spec.PublishNotReadyAddresses {
				out = append(out, e.Addresses...)
			}
		}
	}
	return out, false
}
