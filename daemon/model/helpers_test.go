package model

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/k8s"
)

// testNode is the node the model runs on in these tests.
const testNode = "node-a"

// key is the endpoint key of ap ("ip:port").
func key(ap string, proto bpf.Protocol) bpf.EndpointKey {
	a := netip.MustParseAddrPort(ap)
	return bpf.EndpointKey{Addr: a.Addr(), Port: a.Port(), Proto: proto}
}

// aps parses "ip:port" addresses.
func aps(s ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(s))
	for i, x := range s {
		out[i] = netip.MustParseAddrPort(x)
	}
	return out
}

// apiSlice is the slim slice k8s.SliceFrom makes of the EndpointSlice that
// tmpl (its name, namespace, Service, Controller, Family and Ports)
// describes, listing eps, with a controller ownerReference to the Service
// of UID owner ("" for none). It panics if SliceFrom skips anything.
func apiSlice(tmpl *k8s.Slice, owner types.UID, eps ...k8s.Endpoint) *k8s.Slice {
	ns := tmpl.Namespace
	if ns == "" {
		ns = "default"
	}
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: tmpl.Name, Namespace: ns,
		Labels: map[string]string{discoveryv1.LabelServiceName: tmpl.Service}}}
	if tmpl.Controller {
		es.Labels[discoveryv1.LabelManagedBy] = k8s.ManagedByController
	}
	if owner != "" {
		yes := true
		es.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: tmpl.Service, UID: owner, Controller: &yes}}
	}
	switch tmpl.Family {
	case k8s.IPv4:
		es.AddressType = discoveryv1.AddressTypeIPv4
	case k8s.IPv6:
		es.AddressType = discoveryv1.AddressTypeIPv6
	default:
		panic(fmt.Sprintf("slice family %d", tmpl.Family))
	}
	for _, p := range tmpl.Ports {
		name, port, proto := p.Name, int32(p.Port), corev1.ProtocolTCP
		if p.Protocol == bpf.UDP {
			proto = corev1.ProtocolUDP
		}
		es.Ports = append(es.Ports, discoveryv1.EndpointPort{Name: &name, Port: &port, Protocol: &proto})
	}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, apiEndpoint(e, ns))
	}
	sl, skipped := k8s.SliceFrom(es, nil)
	if skipped != 0 {
		panic(fmt.Sprintf("SliceFrom skipped %d of %+v", skipped, es))
	}
	return sl
}

// apiEndpoint is e as an EndpointSlice in namespace ns lists it.
func apiEndpoint(e k8s.Endpoint, ns string) discoveryv1.Endpoint {
	ready, serving, terminating := e.Conds&k8s.CondReady != 0, e.Conds&k8s.CondServing != 0, e.Conds&k8s.CondTerminating != 0
	out := discoveryv1.Endpoint{Addresses: []string{e.Addr.String()},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating}}
	if e.Node != "" {
		out.NodeName = &e.Node
	}
	if e.PodUID != "" || e.PodName != "" {
		out.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.PodName, UID: e.PodUID}
	}
	if h := e.Hints; h != nil {
		out.Hints = &discoveryv1.EndpointHints{}
		for _, z := range h.Zones {
			out.Hints.ForZones = append(out.Hints.ForZones, discoveryv1.ForZone{Name: z})
		}
		for _, n := range h.Nodes {
			out.Hints.ForNodes = append(out.Hints.ForNodes, discoveryv1.ForNode{Name: n})
		}
	}
	return out
}
