package k8s

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Decoding an EndpointSlice's protobuf encoding straight into what
// SliceFrom reads. Informers decode every slice update of the cluster into
// a whole discoveryv1.EndpointSlice (every field, a pointer per condition,
// node and zone name, hints, managed fields) only for SliceFrom to keep a
// few of them: at 1,000 updates a second that decoding is the largest
// share of draind's CPU and garbage. SliceFromProto reads the fields
// SliceFrom uses and skips the rest, with the generated decoder's
// semantics (last value wins, embedded messages merge, unknown fields are
// skipped). Whatever the generated decoder accepts, it converts the same
// (FuzzSliceFromProto); it refuses malformed framing, but does not check
// the fields it skips, which only the API server writes.

// SliceFromProto decodes b, a discovery/v1 EndpointSlice in protobuf (the
// object inside the API's runtime.Unknown envelope), as SliceFrom would
// convert it once decoded (nodes as SliceFrom takes it).
func SliceFromProto(b []byte, nodes *NodeTable) (*Slice, int, error) {
	p := wirePartsPool.Get().(*wireParts)
	defer releaseParts(p)
	if err := decodeSlice(p, b); err != nil {
		return nil, 0, fmt.Errorf("decoding an EndpointSlice: %w", err)
	}
	sl, skipped := p.build(nodes)
	return sl, skipped, nil
}

// wirePartsPool holds parts to decode into: a slice's are garbage once
// built, a thousand times a second.
var wirePartsPool = sync.Pool{New: func() any { return new(wireParts) }}

// releaseParts returns p to the pool, empty: nothing in it may keep the
// encoding it was decoded from alive.
func releaseParts(p *wireParts) {
	clear(p.endpoints)
	clear(p.ports)
	clear(p.scratch)
	clear(p.hints)
	*p = wireParts{endpoints: p.endpoints[:0], ports: p.ports[:0], scratch: p.scratch[:0], hints: p.hints[:0]}
	wirePartsPool.Put(p)
}

// wireParts are the parts of a slice as they lie in its encoding.
type wireParts = sliceParts[[]byte]

// Wire types.
const (
	wireVarint = 0
	wireI64    = 1
	wireLen    = 2
	wireStart  = 3
	wireEnd    = 4
	wireI32    = 5
)

var (
	errTruncated  = io.ErrUnexpectedEOF
	errOverflow   = errors.New("proto: integer overflow")
	errLength     = errors.New("proto: negative length found during unmarshaling")
	errEndOfGroup = errors.New("proto: unexpected end of group")
)

// wireReader reads one message's fields.
type wireReader struct{ b []byte }

func (r *wireReader) varint() (uint64, error) {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		if shift >= 64 {
			return 0, errOverflow
		}
		if len(r.b) == 0 {
			return 0, errTruncated
		}
		c := r.b[0]
		r.b = r.b[1:]
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return v, nil
		}
	}
}

// tag reads the next field's number and wire type.
func (r *wireReader) tag() (int, int, error) {
	v, err := r.varint()
	if err != nil {
		return 0, 0, err
	}
	field, typ := int32(v>>3), int(v&7)
	if typ == wireEnd {
		return 0, 0, errors.New("proto: wiretype end group for non-group")
	}
	if field <= 0 {
		return 0, 0, fmt.Errorf("proto: illegal tag %d (wire type %d)", field, typ)
	}
	return int(field), typ, nil
}

// bytes reads a length-delimited field's content.
func (r *wireReader) bytes() ([]byte, error) {
	n, err := r.varint()
	if err != nil {
		return nil, err
	}
	if int(n) < 0 {
		return nil, errLength
	}
	if uint64(len(r.b)) < n {
		return nil, errTruncated
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out, nil
}

// skip skips a field of wire type typ (its tag read), groups included.
func (r *wireReader) skip(typ int) error {
	depth := 0
	for {
		switch typ {
		case wireVarint:
			if _, err := r.varint(); err != nil {
				return err
			}
		case wireI64:
			if len(r.b) < 8 {
				return errTruncated
			}
			r.b = r.b[8:]
		case wireLen:
			if _, err := r.bytes(); err != nil {
				return err
			}
		case wireStart:
			depth++
		case wireEnd:
			if depth == 0 {
				return errEndOfGroup
			}
			depth--
		case wireI32:
			if len(r.b) < 4 {
				return errTruncated
			}
			r.b = r.b[4:]
		default:
			return fmt.Errorf("proto: illegal wireType %d", typ)
		}
		if depth == 0 {
			return nil
		}
		v, err := r.varint()
		if err != nil {
			return err
		}
		typ = int(v & 7)
	}
}

// want checks a known field's wire type.
func want(field, typ, w int) error {
	if typ != w {
		return fmt.Errorf("proto: wrong wireType = %d for field %d", typ, field)
	}
	return nil
}

func (r *wireReader) msg(field, typ int) ([]byte, error) {
	if err := want(field, typ, wireLen); err != nil {
		return nil, err
	}
	return r.bytes()
}

// decode reads an EndpointSlice's fields into p, with the generated
// decoder's semantics: a repeated scalar's last value wins, a repeated
// message merges into the one before.
func decodeSlice(p *wireParts, b []byte) error {
	if n := countEndpoints(b); cap(p.endpoints) < n {
		p.endpoints = make([]endpointPart[[]byte], 0, n)
	}
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodeSliceField(p, &r, field, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// countEndpoints counts the endpoints in an EndpointSlice's encoding (as
// far as it can be read: decodeSlice finds what is wrong), so that they
// are decoded into one allocation.
func countEndpoints(b []byte) int {
	n := 0
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = r.skip(typ)
		}
		if err != nil {
			break
		}
		if field == 2 {
			n++
		}
	}
	return n
}

func decodeSliceField(p *wireParts, r *wireReader, field, typ int) error {
	switch field {
	case 1: // metadata
		m, err := r.msg(field, typ)
		if err == nil {
			err = decodeMeta(p, m)
		}
		return err
	case 2: // endpoints
		m, err := r.msg(field, typ)
		if err != nil {
			return err
		}
		p.endpoints = append(p.endpoints, endpointPart[[]byte]{})
		e := &p.endpoints[len(p.endpoints)-1]
		e.hintsFrom = int32(len(p.hints))
		err = decodeEndpoint(e, m, &p.hints)
		e.hintsTo = int32(len(p.hints))
		return err
	case 3: // ports
		m, err := r.msg(field, typ)
		if err != nil {
			return err
		}
		p.ports = append(p.ports, portPart[[]byte]{})
		return decodePort(&p.ports[len(p.ports)-1], m)
	case 4: // addressType
		var err error
		p.addressType, err = r.msg(field, typ)
		return err
	}
	return r.skip(typ)
}

// decodeMeta reads what SliceFrom keeps of an ObjectMeta: name, namespace,
// resourceVersion, deletionTimestamp, two labels and the watch-list
// bookmark's annotation.
func decodeMeta(p *wireParts, b []byte) error {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodeMetaField(p, &r, field, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeMetaField(p *wireParts, r *wireReader, field, typ int) error {
	var err error
	switch field {
	case 1:
		p.name, err = r.msg(field, typ)
	case 3:
		p.namespace, err = r.msg(field, typ)
	case 6:
		p.resourceVersion, err = r.msg(field, typ)
	case 9:
		var t []byte
		if t, err = r.msg(field, typ); err == nil {
			if p.deletion == nil {
				p.deletion = &metav1.Time{}
			}
			err = decodeTime(t, p.deletion)
		}
	case 13: // ownerReferences
		var o []byte
		if o, err = r.msg(field, typ); err == nil {
			err = decodeOwnerRef(p, o)
		}
	case 11, 12: // labels, annotations: map entries
		var e []byte
		if e, err = r.msg(field, typ); err == nil {
			// The entry, and the rest of the metadata after it.
			err = decodeEntry(p, e[:len(e)+len(r.b)], len(e), field == 12)
		}
	default:
		err = r.skip(typ)
	}
	return err
}

// decodeEntry reads one map entry of the labels or annotations, keeping
// the few SliceFrom reads (a map of every label is what the full decoding
// costs). b is the entry (its first n bytes) and the rest of the metadata:
// as the generated decoder reads an entry, a key or value may run past the
// entry's end (up to the metadata's), which ends it; key and value are
// read whatever their wire type; any other field is skipped, and must end
// within the entry.
func decodeEntry(p *wireParts, b []byte, n int, annotation bool) error {
	var k, v []byte
	r := wireReader{b: b}
	for len(b)-len(r.b) < n {
		t, err := r.varint()
		if err == nil {
			switch int32(t >> 3) {
			case 1:
				k, err = r.bytes()
			case 2:
				v, err = r.bytes()
			default:
				if err = r.skip(int(t & 7)); err == nil && len(b)-len(r.b) > n {
					err = errTruncated
				}
			}
		}
		if err != nil {
			return err
		}
	}
	switch {
	case annotation:
		switch string(k) {
		case metav1.InitialEventsAnnotationKey:
			p.initialEventsEnd = string(v) == "true"
		case corev1.EndpointsLastChangeTriggerTime:
			p.triggerTime = ParseTriggerTime(string(v))
		}
	case string(k) == discoveryv1.LabelServiceName:
		p.service = v
	case string(k) == discoveryv1.LabelManagedBy:
		p.managedBy = v
	}
	return nil
}

// decodeTime reads a metav1.Time as its own Unmarshal does: the whole time
// replaced, by its seconds (the nanoseconds must be a varint, and are
// dropped: the API's JSON has none).
func decodeTime(b []byte, t *metav1.Time) error {
	if len(b) == 0 {
		t.Time = time.Time{}
		return nil
	}
	var sec int64
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			switch field {
			case 1, 2:
				var v uint64
				if err = want(field, typ, wireVarint); err == nil {
					v, err = r.varint()
				}
				if field == 1 {
					sec = int64(v)
				}
			default:
				err = r.skip(typ)
			}
		}
		if err != nil {
			return err
		}
	}
	t.Time = time.Unix(sec, 0).Local()
	return nil
}

// decodeEndpoint reads one endpoint into e, its hints onto hints.
func decodeEndpoint(e *endpointPart[[]byte], b []byte, hints *[]hintPart[[]byte]) error {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodeEndpointField(e, &r, field, typ, hints)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeEndpointField(e *endpointPart[[]byte], r *wireReader, field, typ int, hints *[]hintPart[[]byte]) error {
	var err error
	switch field {
	case 1: // addresses: SliceFrom reads the first
		var a []byte
		if a, err = r.msg(field, typ); err == nil && !e.hasAddr {
			e.addr, e.hasAddr = a, true
		}
	case 2: // conditions
		var c []byte
		if c, err = r.msg(field, typ); err == nil {
			err = decodeConditions(e, c)
		}
	case 4: // targetRef
		var t []byte
		if t, err = r.msg(field, typ); err == nil {
			e.hasRef = true
			err = decodeRef(e, t)
		}
	case 6: // nodeName
		e.node, err = r.msg(field, typ)
	case 8: // hints: repeated ones merge
		var h []byte
		if h, err = r.msg(field, typ); err == nil {
			*hints, err = decodeHints(*hints, h)
		}
	default:
		err = r.skip(typ)
	}
	return err
}

// decodeHints appends the forZones (1) and forNodes (2) of an
// EndpointHints to hints, each a ForZone or ForNode whose name is field 1.
func decodeHints(hints []hintPart[[]byte], b []byte) ([]hintPart[[]byte], error) {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err != nil {
			return hints, err
		}
		if field != 1 && field != 2 {
			if err := r.skip(typ); err != nil {
				return hints, err
			}
			continue
		}
		m, err := r.msg(field, typ)
		if err != nil {
			return hints, err
		}
		name, err := hintName(m)
		if err != nil {
			return hints, err
		}
		hints = append(hints, hintPart[[]byte]{name: name, node: field == 2})
	}
	return hints, nil
}

// hintName reads a ForZone's or ForNode's name (the last one given).
func hintName(b []byte) ([]byte, error) {
	var name []byte
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil && field == 1 {
			name, err = r.msg(field, typ)
		} else if err == nil {
			err = r.skip(typ)
		}
		if err != nil {
			return nil, err
		}
	}
	return name, nil
}

func decodeConditions(e *endpointPart[[]byte], b []byte) error {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodeConditionsField(e, &r, field, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeConditionsField(e *endpointPart[[]byte], r *wireReader, field, typ int) error {
	var dst *int8
	switch field {
	case 1:
		dst = &e.ready
	case 2:
		dst = &e.serving
	case 3:
		dst = &e.terminating
	default:
		return r.skip(typ)
	}
	if err := want(field, typ, wireVarint); err != nil {
		return err
	}
	v, err := r.varint()
	*dst = condFalse
	if v != 0 {
		*dst = condTrue
	}
	return err
}

// decodeOwnerRef reads one ownerReference and keeps it if it is a
// controller reference to a v1 Service.
func decodeOwnerRef(p *wireParts, b []byte) error {
	var kind, name, uid, apiVersion []byte
	controller := false
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			switch field {
			case 1:
				kind, err = r.msg(field, typ)
			case 3:
				name, err = r.msg(field, typ)
			case 4:
				uid, err = r.msg(field, typ)
			case 5:
				apiVersion, err = r.msg(field, typ)
			case 6:
				var v uint64
				if typ != 0 {
					return errTruncated
				}
				v, err = r.varint()
				controller = v != 0
			default:
				err = r.skip(typ)
			}
		}
		if err != nil {
			return err
		}
	}
	if controller && string(kind) == "Service" && string(apiVersion) == "v1" {
		p.ownerName, p.ownerUID, p.hasOwner = name, uid, true
	}
	return nil
}

func decodeRef(e *endpointPart[[]byte], b []byte) error {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodeRefField(e, &r, field, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeRefField(e *endpointPart[[]byte], r *wireReader, field, typ int) error {
	var err error
	var v []byte
	switch field {
	case 1:
		if v, err = r.msg(field, typ); err == nil {
			switch string(v) {
			case "":
				e.refKind = refNoKind
			case "Pod":
				e.refKind = refPod
			default:
				e.refKind = refOther
			}
		}
	case 2:
		if v, err = r.msg(field, typ); err == nil {
			e.refNamespace = v
		}
	case 3:
		if v, err = r.msg(field, typ); err == nil {
			e.podName = v
		}
	case 4:
		if v, err = r.msg(field, typ); err == nil {
			e.podUID = v
		}
	default:
		err = r.skip(typ)
	}
	return err
}

// refKindOf classifies a targetRef's kind.
func refKindOf(kind string) refKind {
	switch kind {
	case "":
		return refNoKind
	case "Pod":
		return refPod
	}
	return refOther
}

func decodePort(pp *portPart[[]byte], b []byte) error {
	r := wireReader{b: b}
	for len(r.b) > 0 {
		field, typ, err := r.tag()
		if err == nil {
			err = decodePortField(pp, &r, field, typ)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func decodePortField(pp *portPart[[]byte], r *wireReader, field, typ int) error {
	var err error
	switch field {
	case 1:
		var n []byte
		if n, err = r.msg(field, typ); err == nil {
			pp.name, pp.hasName = n, true
		}
	case 2:
		var s []byte
		if s, err = r.msg(field, typ); err == nil {
			pp.protocol, pp.hasProtocol = s, true
		}
	case 3:
		if err = want(field, typ, wireVarint); err == nil {
			var v uint64
			v, err = r.varint()
			pp.port, pp.hasPort = int32(v), true
		}
	default:
		err = r.skip(typ)
	}
	return err
}

// GetAnnotations returns the only annotation a slice keeps: a watch-list
// bookmark's end of the initial events, which the reflector reads from a
// slice SliceFromProto decoded.
func (s *Slice) GetAnnotations() map[string]string {
	if !s.initialEventsEnd {
		return nil
	}
	return map[string]string{metav1.InitialEventsAnnotationKey: "true"}
}

// A *Slice is a runtime.Object, so that a watch can deliver it as it
// decoded it (see sliceDecoder).
var _ runtime.Object = (*Slice)(nil)

// GetObjectKind: a slim slice carries no type metadata.
func (s *Slice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the slice. Its endpoints are never written once
// built, so the copy shares them.
func (s *Slice) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}
