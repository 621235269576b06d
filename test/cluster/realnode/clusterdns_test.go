package realnode

import (
	"context"
	"slices"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestClusterDNSAnswers checks the bed's cluster DNS against Services as
// the upstream specs create them: a ClusterIP Service, a headless one
// (ready endpoints only, unless it publishes not-ready addresses), an
// ExternalName one, pod names, and names it must not answer.
func TestClusterDNSAnswers(t *testing.T) {
	yes, no := true, false
	svc := func(name string, spec corev1.ServiceSpec) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Spec: spec}
	}
	slice := func(svc string, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4, Endpoints: eps}
	}
	ep := func(ip string, ready *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready}}
	}
	d := &ClusterDNS{client: fake.NewClientset(
		svc("web", corev1.ServiceSpec{ClusterIP: "10.96.3.4", ClusterIPs: []string{"10.96.3.4"}}),
		svc("hl", corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone}),
		slice("hl", ep("10.244.1.5", &yes), ep("10.244.2.6", &no)),
		svc("hlnr", corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, PublishNotReadyAddresses: true}),
		slice("hlnr", ep("10.244.1.7", &no)),
		svc("ext", corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "web.ns.svc.cluster.local"}),
	)}
	for _, tc := range []struct {
		name  string
		qtype uint16
		rcode int
		want  []string
	}{
		{"web.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.96.3.4"}},
		{"WEB.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.96.3.4"}},
		{"web.ns.svc.cluster.local.", dns.TypeAAAA, dns.RcodeSuccess, nil},
		{"hl.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.1.5"}},
		{"hlnr.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.1.7"}},
		{"ext.ns.svc.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"web.ns.svc.cluster.local."}},
		{"10-244-1-9.ns.pod.cluster.local.", dns.TypeA, dns.RcodeSuccess, []string{"10.244.1.9"}},
		{"gone.ns.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"web.ns.svc.cluster.local.ns.svc.cluster.local.", dns.TypeA, dns.RcodeNameError, nil},
		{"example.com.", dns.TypeA, dns.RcodeRefused, nil},
	} {
		rcode, rrs := d.answer(context.Background(), dns.Question{Name: tc.name, Qtype: tc.qtype, Qclass: dns.ClassINET})
		var got []string
		for _, rr := range rrs {
			switch r := rr.(type) {
			case *dns.A:
				got = append(got, r.A.String())
			case *dns.CNAME:
				got = append(got, r.Target)
			}
		}
		if rcode != tc.rcode || !slices.Equal(got, tc.want) {
			t.Errorf("%s %s: rcode %s answers %v, want %s %v", tc.name, dns.TypeToString[tc.qtype],
				dns.RcodeToString[rcode], got, dns.RcodeToString[tc.rcode], tc.want)
		}
	}
}
