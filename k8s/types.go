// Package k8s is draind's view of the Kubernetes API: informers that cache
// slim objects (only what the drain model reads, so that a node watching
// every EndpointSlice of a 100,000-endpoint cluster stays small), and the
// drain Lease protocol by which any node tells every other node that a pod
// is going offline.
package k8s

import (
	"net/netip"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// ManagedByController is the managed-by label value of the slices the
// EndpointSlice controller writes for Services with a selector.
const ManagedByController = "endpointslice-controller.k8s.io"

// AnnotationPodIPSteering selects a Service's pod-IP policy.
const AnnotationPodIPSteering = "draind.io/pod-ip-steering"

// AnnotationEndDeadConnections set to "false" on a Service keeps draind from
// ending client sockets to its pods once they are gone.
const AnnotationEndDeadConnections = "draind.io/end-dead-connections"

// Family is an IP family.
type Family uint8

// Families of EndpointSlices; FQDN slices are ignored by draind.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// protocolOf maps a port's protocol to the datapath's (SCTP is left alone).
func protocolOf(p corev1.Protocol) (bpf.Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return bpf.TCP, true
	case corev1.ProtocolUDP:
		return bpf.UDP, true
	}
	return 0, false
}

// Service is the slim form of a core/v1 Service.
type Service struct {
	metav1.ObjectMeta
	// ClusterIPs of a ClusterIP, NodePort or LoadBalancer Service; empty
	// for headless and ExternalName Services.
	ClusterIPs []netip.Addr
	Headless   bool
	Ports      []ServicePort
	// AffinityClientIP: sessionAffinity ClientIP (the VIP is never steered).
	AffinityClientIP bool
	// InternalLocal: internalTrafficPolicy Local (only this node's
	// endpoints are selectable).
	InternalLocal bool
	// PodIPSteering is the raw annotation value ("" if absent).
	PodIPSteering string
	// HasSelector: the EndpointSlice controller lists its pods.
	HasSelector bool
	// EndDeadConnections is the raw draind.io/end-dead-connections value.
	EndDeadConnections string
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name     string
	Port     uint16
	Protocol bpf.Protocol
}

// Endpoint condition bits.
const (
	CondReady uint8 = 1 << iota
	CondServing
	CondTerminating
)

// Slice is the slim form of a discovery/v1 EndpointSlice.
type Slice struct {
	metav1.ObjectMeta
	Service string // the kubernetes.io/service-name label
	// Controller: the EndpointSlice controller manages it (its managed-by
	// label). Together with a selector on the Service this is the
	// cluster's own record that the endpoints are the Service's pods; the
	// label alone can be forged (see the README's trust model).
	Controller bool
	Family     Family
	Ports      []SlicePort
	Endpoints  []Endpoint
}

// Trusted reports whether the slice is the cluster's own record of svc's
// pods: the EndpointSlice controller's, for a Service with a selector (the
// controller lists only pods the selector picks, in the Service's
// namespace, with their real addresses and nodes).
func (s *Slice) Trusted(svc *Service) bool {
	return s.Controller && svc != nil && svc.HasSelector
}

// SlicePort is one port of a slice (the resolved target port).
type SlicePort struct {
	Name     string
	Port     uint16
	Protocol bpf.Protocol
}

// Endpoint is one endpoint of a slice: kube-proxy reads only the first
// address, and so does draind.
type Endpoint struct {
	Addr    netip.Addr
	Conds   uint8
	Node    string    // interned
	PodUID  types.UID // "" when the endpoint has no Pod targetRef
	PodName string
}

// Ready is kube-proxy's "ready": ready and not terminating.
func (e *Endpoint) Ready() bool {
	return e.Conds&CondReady != 0 && e.Conds&CondTerminating == 0
}

// Serving reports the serving condition.
func (e *Endpoint) Serving() bool { return e.Conds&CondServing != 0 }

// Terminating reports the terminating condition.
func (e *Endpoint) Terminating() bool { return e.Conds&CondTerminating != 0 }

// Pod is the slim form of a Pod on this node.
type Pod struct {
	metav1.ObjectMeta
	Node        string
	IPs         []netip.Addr
	HostNetwork bool
	Ready       bool
	Phase       corev1.PodPhase
}

// Finished reports whether all its containers ended for good: its IP may
// already be another pod's.
func (p *Pod) Finished() bool {
	return p.Phase == corev1.PodSucceeded || p.Phase == corev1.PodFailed
}

// Deleting reports whether the pod has been asked to stop.
func (p *Pod) Deleting() bool { return p.DeletionTimestamp != nil }

// KilledWithoutGrace reports whether the pod is being deleted with a grace
// period of 0: its containers are killed at once, no preStop runs.
func (p *Pod) KilledWithoutGrace() bool {
	return p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds == 0
}

// slimMeta keeps the identity of an object and nothing else.
func slimMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              m.Name,
		Namespace:         m.Namespace,
		UID:               m.UID,
		ResourceVersion:   m.ResourceVersion,
		DeletionTimestamp: m.DeletionTimestamp,
	}
}

// SliceFrom converts an EndpointSlice. ok is false for slices draind ignores
// (FQDN, no service label). Malformed addresses are skipped, never fatal.
func SliceFrom(s *discoveryv1.EndpointSlice) (sl *Slice, skipped int) {
	out := &Slice{ObjectMeta: slimMeta(&s.ObjectMeta), Service: s.Labels[discoveryv1.LabelServiceName],
		Controller: s.Labels[discoveryv1.LabelManagedBy] == ManagedByController}
	switch s.AddressType {
	case discoveryv1.AddressTypeIPv4:
		out.Family = IPv4
	case discoveryv1.AddressTypeIPv6:
		out.Family = IPv6
	default:
		return out, 0 // FQDN: no family, no endpoints
	}
	for _, p := range s.Ports {
		if p.Port == nil || *p.Port <= 0 || *p.Port > 65535 {
			skipped++
			continue
		}
		proto := corev1.ProtocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		pr, ok := protocolOf(proto)
		if !ok {
			continue
		}
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		out.Ports = append(out.Ports, SlicePort{Name: name, Port: uint16(*p.Port), Protocol: pr})
	}
	out.Endpoints = make([]Endpoint, 0, len(s.Endpoints))
	for i := range s.Endpoints {
		e := &s.Endpoints[i]
		if len(e.Addresses) == 0 {
			skipped++
			continue
		}
		a, err := netip.ParseAddr(e.Addresses[0])
		if err != nil || (a.Is4() != (out.Family == IPv4)) {
			skipped++
			continue
		}
		ep := Endpoint{Addr: a}
		// API semantics: nil ready means ready; nil serving means the same
		// as ready; nil terminating means not terminating.
		ready := e.Conditions.Ready == nil || *e.Conditions.Ready
		serving := ready
		if e.Conditions.Serving != nil {
			serving = *e.Conditions.Serving
		}
		if ready {
			ep.Conds |= CondReady
		}
		if serving {
			ep.Conds |= CondServing
		}
		if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
			ep.Conds |= CondTerminating
		}
		if e.NodeName != nil {
			// A cluster has hundreds of nodes and its slices repeat
			// them 100,000 times: share one copy of each name.
			ep.Node = unique.Make(*e.NodeName).Value()
		}
		// A Pod of another namespace is no pod of this slice's Service:
		// the endpoint is kept (kube-proxy routes to it), its identity
		// is not.
		if r := e.TargetRef; r != nil && (r.Kind == "Pod" || r.Kind == "") && (r.Namespace == "" || r.Namespace == s.Namespace) {
			ep.PodUID = r.UID
			ep.PodName = r.Name
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out, skipped
}

// ServiceFrom converts a Service. Unparseable cluster IPs are skipped.
func ServiceFrom(s *corev1.Service) (*Service, int) {
	out := &Service{
		ObjectMeta:         slimMeta(&s.ObjectMeta),
		AffinityClientIP:   s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP,
		InternalLocal:      s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		PodIPSteering:      s.Annotations[AnnotationPodIPSteering],
		HasSelector:        len(s.Spec.Selector) > 0,
		EndDeadConnections: s.Annotations[AnnotationEndDeadConnections],
	}
	skipped := 0
	if s.Spec.Type != corev1.ServiceTypeExternalName {
		ips := s.Spec.ClusterIPs
		if len(ips) == 0 && s.Spec.ClusterIP != "" {
			ips = []string{s.Spec.ClusterIP}
		}
		for _, ip := range ips {
			if ip == corev1.ClusterIPNone {
				out.Headless = true
				continue
			}
			a, err := netip.ParseAddr(ip)
			if err != nil {
				skipped++
				continue
			}
			out.ClusterIPs = append(out.ClusterIPs, a)
		}
	}
	for _, p := range s.Spec.Ports {
		pr, ok := protocolOf(p.Protocol)
		if !ok || p.Port <= 0 || p.Port > 65535 {
			continue
		}
		out.Ports = append(out.Ports, ServicePort{Name: p.Name, Port: uint16(p.Port), Protocol: pr})
	}
	return out, skipped
}

// PodFrom converts a Pod.
func PodFrom(p *corev1.Pod) *Pod {
	out := &Pod{
		ObjectMeta:  slimMeta(&p.ObjectMeta),
		Node:        p.Spec.NodeName,
		HostNetwork: p.Spec.HostNetwork,
		Phase:       p.Status.Phase,
	}
	// When the pod was created: its connections were all seen by draind's
	// socket counting if that started earlier.
	out.CreationTimestamp = p.CreationTimestamp
	// A deletion with no grace (0 s): the pod is killed now, gone.
	out.DeletionGracePeriodSeconds = p.DeletionGracePeriodSeconds
	ips := p.Status.PodIPs
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: p.Status.PodIP}}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out.IPs = append(out.IPs, a)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			out.Ready = true
		}
	}
	return out
}
