package k8s

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"math"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// ManagedByController is the managed-by label value of the slices the
// EndpointSlice controller writes for Services with a selector.
const ManagedByController = "endpointslice-controller.k8s.io"

// AnnotationSteerOnDelete set to "true" on a pod opts its workload in to
// pod-IP steering from the moment the pod is deleted: connections made
// straight to its IP (a caller's stale registry cache) are steered as soon
// as it starts terminating, not only once it asks to go offline or is gone.
// draind's webhook sets it on the pods it injects.
const AnnotationSteerOnDelete = "draind.io/steer-on-delete"

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

// FamilyOf is the family of address a.
func FamilyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

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
	Meta
	// ClusterIPs of a ClusterIP, NodePort or LoadBalancer Service; empty
	// for headless and ExternalName Services.
	ClusterIPs []netip.Addr
	Ports      []ServicePort
	// PodIPSteering is the raw annotation value ("" if absent).
	PodIPSteering string
	// EndDeadConnections is the raw draind.io/end-dead-connections value.
	EndDeadConnections string

	// The flags share one word (the informer keeps a Service per Service
	// of the cluster).
	Headless bool
	// AffinityClientIP: sessionAffinity ClientIP (the VIP is never steered).
	AffinityClientIP bool
	// InternalLocal: internalTrafficPolicy Local (only this node's
	// endpoints are selectable).
	InternalLocal bool
	// HasSelector: the EndpointSlice controller lists its pods.
	HasSelector bool
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
	Meta
	Service string // the kubernetes.io/service-name label
	// Controller: the EndpointSlice controller manages it (its managed-by
	// label). Together with a selector on the Service this is the
	// cluster's own record that the endpoints are the Service's pods; the
	// label alone can be forged (see docs/security.md, the trust model).
	Controller bool
	Family     Family
	wide       bool // some address is not plain IPv4 (with the flags: one word)
	// initialEventsEnd: a watch-list bookmark's k8s.io/initial-events-end
	// annotation (only SliceFromProto keeps it: see GetAnnotations).
	initialEventsEnd bool
	// trigger is the slice's last-change-trigger-time to the millisecond,
	// as the low 32 bits of Unix milliseconds (0: none). TriggerTime reads
	// it back.
	trigger uint32
	// owner is uidHash of the UID of the Service the slice's controller
	// ownerReference names (0: none, or one naming anything but its own
	// Service). The EndpointSlice controller always sets it; a look-alike
	// slice it has not adopted lacks it. A hash, not the text: it fits
	// beside the flags (a Slice is kept per slice of the cluster).
	owner uint32
	Ports []SlicePort

	// The endpoints, packed (Len and Endpoint read them): the informer
	// keeps every endpoint of the cluster, so they hold no pointer (the GC
	// never scans them), their addresses take 4 bytes when the slice is
	// IPv4 only, their pods' UIDs 16 (binary) when they are the UUIDs the
	// API server writes, and their pods' names share one copy of their
	// prefix (a ReplicaSet's or StatefulSet's name) per slice.
	endpoints []packedEndpoint
	addrs     []byte // 4 bytes per endpoint, or 16 when wide
	strs      string // textual UIDs, names' parts and nodes' names the full nodeNames does not know
	// hints are the endpoints' topology hints (nil when none has one, as
	// in every slice of a Service without a trafficDistribution or a
	// topology mode).
	hints *sliceHints
	// nodes numbers the endpoints' node names (nil: the slice keeps every
	// name itself).
	nodes *NodeTable
}

// packedEndpoint is an Endpoint as a Slice stores it (less its address):
// 32 bytes, no pointers.
type packedEndpoint struct {
	uid            [16]byte // a UUID, binary (uuidUID); else the offset and length of its text in strs
	node           uint32   // index in nodeNames (0: none), or the name in strs (ownNode)
	prefix, suffix uint32   // the pod name's two parts: offsets in strs
	prefixLen      uint16
	suffixLen      uint16
	conds          uint8
	flags          uint8
}

// packedEndpoint flags.
const (
	v4InWide uint8 = 1 << iota // an IPv4 address stored as 16 bytes
	uuidUID                    // uid holds a UUID, binary
	textUID                    // uid holds the offset (4 bytes) and length (2) of the UID in strs
)

// Len returns the number of endpoints.
func (s *Slice) Len() int { return len(s.endpoints) }

// Endpoint returns endpoint i (0 <= i < Len). The strings are the slice's
// own when they are stored whole; a UUID or a name in two parts is put
// together in one new string.
func (s *Slice) Endpoint(i int) Endpoint {
	e := s.endpoint(i)
	if s.hints != nil {
		e = s.withHints(i, e)
	}
	return e
}

func (s *Slice) endpoint(i int) Endpoint {
	p := &s.endpoints[i]
	e := Endpoint{Conds: p.conds, Node: s.nodeName(p.node)}
	if s.wide {
		e.Addr = netip.AddrFrom16([16]byte(s.addrs[16*i:]))
		if p.flags&v4InWide != 0 {
			e.Addr = e.Addr.Unmap()
		}
	} else {
		e.Addr = netip.AddrFrom4([4]byte(s.addrs[4*i:]))
	}
	prefix := s.strs[p.prefix : p.prefix+uint32(p.prefixLen)]
	suffix := s.strs[p.suffix : p.suffix+uint32(p.suffixLen)]
	switch {
	case p.flags&textUID != 0:
		off := binary.LittleEndian.Uint32(p.uid[:4])
		e.PodUID = types.UID(s.strs[off : off+uint32(binary.LittleEndian.Uint16(p.uid[4:6]))])
	case p.flags&uuidUID == 0:
	case prefix == "":
		e.PodUID = types.UID(formatUUID(p.uid))
	default:
		// One allocation for both.
		var u [uuidLen]byte
		var b strings.Builder
		b.Grow(uuidLen + len(prefix) + len(suffix))
		b.Write(appendUUID(u[:0], p.uid))
		b.WriteString(prefix)
		b.WriteString(suffix)
		all := b.String()
		e.PodUID, e.PodName = types.UID(all[:uuidLen]), all[uuidLen:]
		return e
	}
	if prefix == "" {
		e.PodName = suffix
	} else {
		e.PodName = prefix + suffix
	}
	return e
}

// withHints adds endpoint i's hints to e.
func (s *Slice) withHints(i int, e Endpoint) Endpoint {
	e.Hints = s.hints.names(i)
	return e
}

// Addr returns endpoint i's address (no allocation, unlike Endpoint).
func (s *Slice) Addr(i int) netip.Addr {
	if s.wide {
		a := netip.AddrFrom16([16]byte(s.addrs[16*i:]))
		if s.endpoints[i].flags&v4InWide != 0 {
			a = a.Unmap()
		}
		return a
	}
	return netip.AddrFrom4([4]byte(s.addrs[4*i:]))
}

// Conds returns endpoint i's condition bits (Endpoint.Conds).
func (s *Slice) Conds(i int) uint8 { return s.endpoints[i].conds }

// Node returns endpoint i's node ("" if none; no allocation).
func (s *Slice) Node(i int) string { return s.nodeName(s.endpoints[i].node) }

func (s *Slice) nodeName(n uint32) string {
	if n&nodeOwn != 0 {
		off := (n &^ nodeOwn) >> 8
		return s.strs[off : off+(n&0xff)]
	}
	return s.nodes.name(n)
}

// ownIndex is where name is in names, or -1.
func ownIndex[T bytestring](names []T, name T) int {
	for k, n := range names {
		if string(n) == string(name) {
			return k
		}
	}
	return -1
}

// ownNode is a packed endpoint's node when the full nodeNames does not know
// its name: the name's offset in strs (23 bits) and length (8; the API
// allows 253). ok is false if they do not fit (never for what the API
// server sends).
func ownNode(off, n int) (uint32, bool) {
	if n > 0xff || off >= 1<<23 {
		return 0, false
	}
	return nodeOwn | uint32(off)<<8 | uint32(n), true
}

// HasPod reports whether endpoint i names a pod (a PodUID).
func (s *Slice) HasPod(i int) bool { return s.endpoints[i].flags&(uuidUID|textUID) != 0 }

// Ready reports whether endpoint i is ready (Endpoint.Ready).
func (s *Slice) Ready(i int) bool {
	c := s.endpoints[i].conds
	return c&CondReady != 0 && c&CondTerminating == 0
}

// PodKey identifies a pod UID as a slice stores it: two keys are equal
// exactly when the UIDs are. Comparing them allocates nothing (reading
// Endpoint's PodUID may).
type PodKey struct {
	uuid [16]byte
	text string
	kind uint8 // 0: no pod, uuidUID or textUID
}

// PodKey returns the key of endpoint i's pod.
func (s *Slice) PodKey(i int) PodKey {
	p := &s.endpoints[i]
	switch {
	case p.flags&uuidUID != 0:
		return PodKey{uuid: p.uid, kind: uuidUID}
	case p.flags&textUID != 0:
		off := binary.LittleEndian.Uint32(p.uid[:4])
		return PodKey{text: s.strs[off : off+uint32(binary.LittleEndian.Uint16(p.uid[4:6]))], kind: textUID}
	}
	return PodKey{}
}

// PodKeyOf returns the key of a pod UID ("": no pod).
func PodKeyOf(uid types.UID) PodKey {
	if u, ok := parseUUID(string(uid)); ok {
		return PodKey{uuid: u, kind: uuidUID}
	}
	if uid == "" {
		return PodKey{}
	}
	return PodKey{text: string(uid), kind: textUID}
}

// Compare orders keys (any total order consistent with equality).
func (k PodKey) Compare(o PodKey) int {
	if c := cmp.Compare(k.kind, o.kind); c != 0 {
		return c
	}
	if c := bytes.Compare(k.uuid[:], o.uuid[:]); c != 0 {
		return c
	}
	return strings.Compare(k.text, o.text)
}

// uuidLen is the length of a UUID's text.
const uuidLen = 36

// parseUUID parses the text form the API server writes (lower-case hex,
// 8-4-4-4-12): only one that formatUUID gives back unchanged.
func parseUUID[T bytestring](s T) (u [16]byte, ok bool) {
	if len(s) != uuidLen {
		return u, false
	}
	j := 0
	for i := 0; i < uuidLen; i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			if s[i] != '-' {
				return u, false
			}
			continue
		}
		hi, ok1 := lowerHex(s[i])
		lo, ok2 := lowerHex(s[i+1])
		if !ok1 || !ok2 {
			return u, false
		}
		u[j] = hi<<4 | lo
		j++
		i++
	}
	return u, true
}

func lowerHex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func formatUUID(u [16]byte) string {
	var b [uuidLen]byte
	return string(appendUUID(b[:0], u))
}

// appendUUID appends u in the API server's form (lowercase, hyphenated).
func appendUUID(b []byte, u [16]byte) []byte {
	const digits = "0123456789abcdef"
	for i, v := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, digits[v>>4], digits[v&15])
	}
	return b
}

// splitPodName splits a pod's name after its last '-': what precedes it
// (its ReplicaSet's or StatefulSet's name) is shared by the slice's pods.
func splitPodName[T bytestring](name T) (prefix, suffix T) {
	i := len(name) - 1
	for i >= 0 && name[i] != '-' {
		i--
	}
	return name[:i+1], name[i+1:]
}

// bytestring is text as received: a string of a decoded object, or bytes
// straight from the wire (SliceFromProto), read without a copy.
type bytestring interface{ ~string | ~[]byte }

// endpointIn is one endpoint as packEndpoints takes it.
type endpointIn[T bytestring] struct {
	addr            netip.Addr
	conds           uint8
	node, uid, name T
	hints           []hintPart[T]
}

// packEndpoints replaces s's endpoints with eps, packed (see Slice), and
// counts those it skips. Addresses with a zone, and pod UIDs or names
// longer than 65,535 bytes, are skipped and counted: the API accepts
// neither. A node name longer than 255 bytes (the API allows 253) is
// dropped and counted; its endpoint is kept. Their text is copied once,
// into one string.
func packEndpoints[T bytestring](s *Slice, eps []endpointIn[T]) (skipped int) {
	s.wide = false
	for i := range eps {
		s.wide = s.wide || !eps[i].addr.Is4()
	}
	stride := 4
	if s.wide {
		stride = 16
	}
	s.endpoints = make([]packedEndpoint, 0, len(eps))
	s.addrs = make([]byte, 0, stride*len(eps))
	// First the layout of the text: the UIDs that are not UUIDs, the
	// names' distinct prefixes (a slice's pods have a few owners) and
	// their suffixes.
	t := textLayout[T]{nodes: s.nodes}
	for i := range eps {
		e := &eps[i]
		if e.dropped() {
			skipped++
			continue
		}
		p := packedEndpoint{conds: e.conds}
		var ok bool
		if p.node, ok = t.node(e.node); !ok {
			skipped++ // kept, without its node
		}
		if s.wide {
			a := e.addr.As16()
			s.addrs = append(s.addrs, a[:]...)
			if e.addr.Is4() {
				p.flags |= v4InWide
			}
		} else {
			a := e.addr.As4()
			s.addrs = append(s.addrs, a[:]...)
		}
		if u, ok := parseUUID(e.uid); ok {
			p.uid, p.flags = u, p.flags|uuidUID
		} else if len(e.uid) > 0 {
			binary.LittleEndian.PutUint32(p.uid[:4], uint32(t.size))
			binary.LittleEndian.PutUint16(p.uid[4:6], uint16(len(e.uid)))
			p.flags |= textUID
			t.size += len(e.uid)
		}
		prefix, suffix := splitPodName(e.name)
		p.prefix, p.prefixLen = t.prefix(prefix), uint16(len(prefix))
		p.suffix, p.suffixLen = uint32(t.size), uint16(len(suffix))
		t.size += len(suffix)
		s.endpoints = append(s.endpoints, p)
	}
	s.strs = endpointText(s.endpoints, eps, t.size)
	s.hints = packHints(eps)
	return skipped
}

// textLayout places a slice's text as packEndpoints lays it out: size is
// its length so far.
type textLayout[T bytestring] struct {
	nodes *NodeTable
	size  int
	// The names' distinct prefixes so far (the first 16).
	prefixes  [16]T
	prefixAt  [16]uint32
	nPrefixes int
	// Node names the full table does not know, kept once per slice (the
	// first 8; a slice names a few nodes).
	ownNames [8]T
	ownAt    [8]uint32
	nOwn     int
}

// node is an endpoint's node: its number in the full table, or its place
// in the slice's text (false: the text has no room; none).
func (t *textLayout[T]) node(name T) (uint32, bool) {
	if n, ok := nodeIndex(t.nodes, name); ok {
		return n, true
	}
	if k := ownIndex(t.ownNames[:t.nOwn], name); k >= 0 {
		return t.ownAt[k], true
	}
	n, ok := ownNode(t.size, len(name))
	if !ok {
		return 0, false
	}
	if t.nOwn < len(t.ownNames) {
		t.ownNames[t.nOwn], t.ownAt[t.nOwn] = name, n
		t.nOwn++
	}
	t.size += len(name)
	return n, true
}

// prefix is where a name's prefix is in the text: where an equal one was
// placed, or at the end.
func (t *textLayout[T]) prefix(prefix T) uint32 {
	for k := range t.nPrefixes {
		if string(t.prefixes[k]) == string(prefix) {
			return t.prefixAt[k]
		}
	}
	at := uint32(t.size)
	t.size += len(prefix)
	if t.nPrefixes < len(t.prefixes) {
		t.prefixes[t.nPrefixes], t.prefixAt[t.nPrefixes] = prefix, at
		t.nPrefixes++
	}
	return at
}

// endpointText writes the text packEndpoints laid out, in the same order:
// each endpoint's node (when the slice keeps it), textual UID, name prefix
// (when not one written before) and suffix.
func endpointText[T bytestring](packed []packedEndpoint, eps []endpointIn[T], size int) string {
	var b strings.Builder
	b.Grow(size)
	kept := 0
	for i := range eps {
		e := &eps[i]
		if e.dropped() {
			continue
		}
		p := &packed[kept]
		kept++
		if p.node&nodeOwn != 0 && int((p.node&^nodeOwn)>>8) == b.Len() { // not one kept before
			writeText(&b, e.node)
		}
		if p.flags&textUID != 0 {
			writeText(&b, e.uid)
		}
		prefix, suffix := splitPodName(e.name)
		if int(p.prefix) == b.Len() && len(prefix) > 0 {
			writeText(&b, prefix)
		}
		writeText(&b, suffix)
	}
	return b.String()
}

// dropped reports whether packEndpoints skips e: the API accepts no
// address with a zone, and no UID or name that long.
func (e *endpointIn[T]) dropped() bool {
	return e.addr.Zone() != "" || len(e.uid) > math.MaxUint16 || len(e.name) > math.MaxUint16
}

// writeText appends v to b without another copy.
func writeText[T bytestring](b *strings.Builder, v T) {
	if x, ok := any(v).([]byte); ok {
		b.Write(x)
		return
	}
	b.WriteString(string(v))
}

// Trusted reports whether the slice is the cluster's own record of svc's
// pods: the EndpointSlice controller's (its managed-by label, and its
// controller ownerReference to svc with svc's UID), for a Service with a
// selector (the controller lists only pods the selector picks, in the Service's
// namespace, with their real addresses and nodes).
func (s *Slice) Trusted(svc *Service) bool {
	return s.Controller && svc != nil && svc.HasSelector && s.owner != 0 && s.owner == uidHash(string(svc.UID))
}

// uidHash is FNV-1a of a UID, never 0 (0 means no owner).
func uidHash[T bytestring](uid T) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(uid); i++ {
		h ^= uint32(uid[i])
		h *= 16777619
	}
	return max(h, 1)
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
	Node    string    // numbered once per process (NodeTable), or the slice's own
	PodUID  types.UID // "" when the endpoint has no Pod targetRef
	PodName string
	// Hints are the endpoint's topology hints (nil: none; hints.go).
	Hints *Hints
}

// Ready is kube-proxy's "ready": ready and not terminating.
func (e *Endpoint) Ready() bool {
	return e.Conds&CondReady != 0 && e.Conds&CondTerminating == 0
}

// Terminating reports the terminating condition.
func (e *Endpoint) Terminating() bool { return e.Conds&CondTerminating != 0 }

// Pod is the slim form of a Pod on this node.
type Pod struct {
	metav1.ObjectMeta
	Receipt
	Node        string
	IPs         []netip.Addr
	HostNetwork bool
	Ready       bool
	Phase       corev1.PodPhase
	// SteerOnDelete: the pod carries AnnotationSteerOnDelete "true".
	SteerOnDelete bool
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

// slimMeta keeps the identity of an object and nothing else (see metaOf).
func slimMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	meta := metaOf(newKeeper(metaSize(m, true)), m, true)
	return meta.ObjectMeta()
}

// NodeTable numbers node names: a cluster has hundreds of nodes, its
// slices name them 100,000 times, and a number (unlike a string) is no
// pointer for the GC to follow. Numbers are never reused; 0 is "". The
// informers keep one for the slices they decode; the zero value is ready.
//
// Anyone allowed to write an EndpointSlice can name any node, so the table
// is bounded: past maxNodeNames names, a name it does not know is kept in
// the slice that names it (ownNode) and goes when the slice goes.
type NodeTable struct {
	mu      sync.Mutex
	numbers map[string]uint32
	names   atomic.Pointer[[]string] // readers load it without the lock
}

// maxNodeNames bounds NodeTable: more than the largest clusters have nodes
// (Kubernetes is tested to 5,000), and at most ~5 MB of names.
const maxNodeNames = 1 << 14

// nodeOwn marks a packed endpoint's node as the slice's own (ownNode).
const nodeOwn uint32 = 1 << 31

func (t *NodeTable) name(i uint32) string {
	if i == 0 || t == nil {
		return ""
	}
	return (*t.names.Load())[i]
}

// index returns name's number, numbering it if it is new and the table is
// not full; ok is false if it is neither known nor numbered. Only a name
// it numbers is copied (name may be bytes being decoded).
func nodeIndex[T bytestring](t *NodeTable, name T) (uint32, bool) {
	if len(name) == 0 {
		return 0, true
	}
	if t == nil {
		return 0, false
	}
	if len(name) > 0xff {
		return 0, false // longer than the API allows, and than ownNode keeps
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.numbers[string(name)]; ok {
		return i, true
	}
	var names []string
	if p := t.names.Load(); p != nil {
		names = *p
	} else {
		names = []string{""}
		t.numbers = map[string]uint32{}
	}
	if len(names) > maxNodeNames {
		return 0, false
	}
	// Readers hold a header of the old length: append writes past it (or
	// into a new array), never under it.
	next := append(names, strings.Clone(string(name)))
	i := uint32(len(next) - 1)
	t.numbers[next[i]] = i
	t.names.Store(&next)
	return i, true
}

// Len is how many names the table numbers (at most 16,384; past that,
// slices keep their own).
func (t *NodeTable) Len() int {
	if p := t.names.Load(); p != nil {
		return len(*p) - 1
	}
	return 0
}

// ParseTriggerTime reads a last-change-trigger-time annotation (RFC 3339
// with nanoseconds, as the controllers write it); zero if it is not one.
func ParseTriggerTime(v string) time.Time {
	if v == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}
	}
	return t
}

func packTrigger(t time.Time) uint32 {
	if t.IsZero() {
		return 0
	}
	return max(uint32(t.UnixMilli()), 1)
}

// TriggerTime is the endpoints.kubernetes.io/last-change-trigger-time
// annotation the EndpointSlice controller writes, to the millisecond: when
// the change this version of the slice carries happened (a pod's deletion,
// its readiness), where network-programming latency starts. Zero when
// absent. It is read back as the instant with the kept low bits nearest
// the slice's receipt (now, if not stamped): exact for trigger times
// within 24 days of it.
func (s *Slice) TriggerTime() time.Time {
	if s.trigger == 0 {
		return time.Time{}
	}
	ref := s.Received()
	if ref.IsZero() {
		ref = time.Now()
	}
	r := ref.UnixMilli()
	return time.UnixMilli(r - int64(int32(uint32(r)-s.trigger)))
}

// SliceFrom converts an EndpointSlice, numbering its node names in nodes
// (nil: the slice keeps them). Malformed addresses are skipped, never
// fatal.
func SliceFrom(s *discoveryv1.EndpointSlice, nodes *NodeTable) (sl *Slice, skipped int) {
	p := sliceParts[string]{name: s.Name, namespace: s.Namespace, resourceVersion: s.ResourceVersion, deletion: s.DeletionTimestamp,
		service: s.Labels[discoveryv1.LabelServiceName], managedBy: s.Labels[discoveryv1.LabelManagedBy],
		triggerTime: ParseTriggerTime(s.Annotations[corev1.EndpointsLastChangeTriggerTime]),
		addressType: string(s.AddressType),
		ports:       make([]portPart[string], len(s.Ports)),
		endpoints:   make([]endpointPart[string], len(s.Endpoints))}
	for i, sp := range s.Ports {
		pp := &p.ports[i]
		if sp.Name != nil {
			pp.name, pp.hasName = *sp.Name, true
		}
		if sp.Protocol != nil {
			pp.protocol, pp.hasProtocol = string(*sp.Protocol), true
		}
		if sp.Port != nil {
			pp.port, pp.hasPort = *sp.Port, true
		}
	}
	for i := range s.Endpoints {
		e, ep := &s.Endpoints[i], &p.endpoints[i]
		if len(e.Addresses) > 0 {
			ep.addr, ep.hasAddr = e.Addresses[0], true
		}
		ep.ready, ep.serving, ep.terminating = condOf(e.Conditions.Ready), condOf(e.Conditions.Serving), condOf(e.Conditions.Terminating)
		if e.NodeName != nil {
			ep.node = *e.NodeName
		}
		if r := e.TargetRef; r != nil {
			ep.hasRef, ep.refKind, ep.refNamespace = true, refKindOf(r.Kind), r.Namespace
			ep.podUID, ep.podName = string(r.UID), r.Name
		}
		ep.hintsFrom = int32(len(p.hints))
		if h := e.Hints; h != nil {
			for _, z := range h.ForZones {
				p.hints = append(p.hints, hintPart[string]{name: z.Name})
			}
			for _, n := range h.ForNodes {
				p.hints = append(p.hints, hintPart[string]{name: n.Name, node: true})
			}
		}
		ep.hintsTo = int32(len(p.hints))
	}
	for _, o := range s.OwnerReferences {
		if o.Controller != nil && *o.Controller && o.Kind == "Service" && o.APIVersion == "v1" {
			p.ownerName, p.ownerUID, p.hasOwner = o.Name, string(o.UID), true
		}
	}
	return p.build(nodes)
}

// sliceParts is what SliceFrom reads of an EndpointSlice, from the API's
// decoded object (T string) or straight from its protobuf (SliceFromProto,
// T []byte: the text is read where it lies and copied once, by build):
// build converts both the same way.
type sliceParts[T bytestring] struct {
	name, namespace, resourceVersion T
	deletion                         *metav1.Time
	service, managedBy               T // the two labels
	// ownerName and ownerUID: the slice's controller ownerReference, when
	// it names a v1 Service (hasOwner).
	ownerName, ownerUID T
	hasOwner            bool
	initialEventsEnd    bool // the watch-list bookmark's annotation
	triggerTime         time.Time
	addressType         T
	ports               []portPart[T]
	endpoints           []endpointPart[T]
	hints               []hintPart[T]   // every endpoint's topology hints, in order
	scratch             []endpointIn[T] // build's, kept for the next build (SliceFromProto's parts are reused)
}

type portPart[T bytestring] struct {
	name, protocol                T
	port                          int32
	hasName, hasProtocol, hasPort bool
}

// An endpoint condition as the API has it: unset, false or true.
const (
	condUnset int8 = iota
	condFalse
	condTrue
)

func condOf(b *bool) int8 {
	switch {
	case b == nil:
		return condUnset
	case *b:
		return condTrue
	}
	return condFalse
}

// refKind is a targetRef's kind, as far as SliceFrom cares.
type refKind uint8

const (
	refNoKind refKind = iota // ""
	refPod
	refOther
)

// endpointPart is one endpoint.
type endpointPart[T bytestring] struct {
	addr                        T // the first address
	hasAddr                     bool
	ready, serving, terminating int8
	node                        T // the node's name
	hasRef                      bool
	refKind                     refKind
	refNamespace                T
	podUID                      T
	podName                     T
	// hintsFrom and hintsTo: the endpoint's hints in sliceParts.hints.
	hintsFrom, hintsTo int32
}

// build converts the parts.
func (p *sliceParts[T]) build(nodes *NodeTable) (sl *Slice, skipped int) {
	size := len(p.name) + len(p.namespace) + len(p.resourceVersion) + len(p.service)
	for i := range p.ports {
		size += len(p.ports[i].name)
	}
	k := newKeeper(size)
	out := &Slice{Meta: Meta{Name: keepText(k, p.name), Namespace: keepText(k, p.namespace), ResourceVersion: keepText(k, p.resourceVersion),
		DeletionTimestamp: p.deletion}, Service: keepText(k, p.service), Controller: string(p.managedBy) == ManagedByController,
		initialEventsEnd: p.initialEventsEnd, trigger: packTrigger(p.triggerTime)}
	if p.hasOwner && len(p.ownerUID) > 0 && string(p.ownerName) == string(p.service) {
		out.owner = uidHash(p.ownerUID)
	}
	switch string(p.addressType) {
	case string(discoveryv1.AddressTypeIPv4):
		out.Family = IPv4
	case string(discoveryv1.AddressTypeIPv6):
		out.Family = IPv6
	default:
		return out, 0 // FQDN: no family, no endpoints
	}
	for i := range p.ports {
		pp := &p.ports[i]
		if !pp.hasPort || pp.port <= 0 || pp.port > 65535 {
			skipped++
			continue
		}
		pr, ok := bpf.TCP, true
		if pp.hasProtocol {
			pr, ok = protocolOfText(pp.protocol)
		}
		if !ok {
			continue
		}
		name := ""
		if pp.hasName {
			name = keepText(k, pp.name)
		}
		out.Ports = append(out.Ports, SlicePort{Name: name, Port: uint16(pp.port), Protocol: pr})
	}
	eps := p.scratch[:0]
	if cap(eps) < len(p.endpoints) {
		eps = make([]endpointIn[T], 0, len(p.endpoints))
	}
	for i := range p.endpoints {
		e := &p.endpoints[i]
		if !e.hasAddr {
			skipped++
			continue
		}
		a, err := parseAddr(e.addr)
		if err != nil || (a.Is4() != (out.Family == IPv4)) {
			skipped++
			continue
		}
		ep := endpointIn[T]{addr: a, node: e.node, hints: p.hints[e.hintsFrom:e.hintsTo:e.hintsTo],
			conds: wireConds(e.ready, e.serving, e.terminating)}
		// A Pod of another namespace is no pod of this slice's Service,
		// and neither is a targetRef without kind or namespace (the
		// controller always writes both): the endpoint is kept
		// (kube-proxy routes to it), its identity is not.
		if e.hasRef && e.refKind == refPod && len(e.refNamespace) > 0 && string(e.refNamespace) == string(p.namespace) {
			ep.uid, ep.name = e.podUID, e.podName
		}
		eps = append(eps, ep)
	}
	out.nodes = nodes
	skipped += packEndpoints(out, eps)
	p.scratch = eps
	return out, skipped
}

// wireConds are an endpoint's conditions as received, with the API's
// semantics: unset ready means ready; unset serving means the same as
// ready; unset terminating means not terminating.
func wireConds(ready, serving, terminating int8) uint8 {
	var c uint8
	isReady := ready != condFalse
	isServing := isReady
	if serving != condUnset {
		isServing = serving == condTrue
	}
	if isReady {
		c |= CondReady
	}
	if isServing {
		c |= CondServing
	}
	if terminating == condTrue {
		c |= CondTerminating
	}
	return c
}

// protocolOfText is protocolOf of a protocol as received.
func protocolOfText[T bytestring](p T) (bpf.Protocol, bool) {
	switch string(p) {
	case string(corev1.ProtocolTCP), "":
		return bpf.TCP, true
	case string(corev1.ProtocolUDP):
		return bpf.UDP, true
	}
	return 0, false
}

// parseAddr parses an endpoint's address as netip.ParseAddr does, a plain
// dotted IPv4 address without copying it first (the API server writes
// every address of a slice in this form).
func parseAddr[T bytestring](v T) (netip.Addr, error) {
	if a, ok := parseIPv4(v); ok {
		return a, nil
	}
	return netip.ParseAddr(string(v))
}

// parseIPv4 parses four decimal octets without leading zeros; anything else
// is not ok (netip.ParseAddr decides it).
func parseIPv4[T bytestring](v T) (netip.Addr, bool) {
	var out [4]byte
	part, digits, val := 0, 0, 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			if digits > 0 && val == 0 {
				return netip.Addr{}, false // a leading zero
			}
			val, digits = val*10+int(c-'0'), digits+1
			if val > 255 {
				return netip.Addr{}, false
			}
		case c == '.' && digits > 0 && part < 3:
			out[part] = byte(val)
			part, val, digits = part+1, 0, 0
		default:
			return netip.Addr{}, false
		}
	}
	if part != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	out[3] = byte(val)
	return netip.AddrFrom4(out), true
}

// ServiceFrom converts a Service. Unparseable cluster IPs are skipped.
func ServiceFrom(s *corev1.Service) (*Service, int) {
	steering, endDead := s.Annotations[AnnotationPodIPSteering], s.Annotations[AnnotationEndDeadConnections]
	// The UID is kept: a slice is trusted only if its ownerReference
	// names it.
	size := metaSize(&s.ObjectMeta, true) + len(steering) + len(endDead)
	for _, p := range s.Spec.Ports {
		size += len(p.Name)
	}
	k := newKeeper(size)
	out := &Service{
		Meta:               metaOf(k, &s.ObjectMeta, true),
		AffinityClientIP:   s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP,
		InternalLocal:      s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal,
		PodIPSteering:      k.keep(steering),
		HasSelector:        len(s.Spec.Selector) > 0,
		EndDeadConnections: k.keep(endDead),
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
		out.Ports = append(out.Ports, ServicePort{Name: k.keep(p.Name), Port: uint16(p.Port), Protocol: pr})
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
		// Annotations are not kept (slimMeta): only this one is read.
		SteerOnDelete: p.Annotations[AnnotationSteerOnDelete] == "true",
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
