package k8s

import (
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Meta is the metadata draind keeps of a cached object: its name,
// namespace, resourceVersion and deletion time, and its UID where draind
// reads it (pods and Leases, not Services and slices; see metaOf).
// metav1.ObjectMeta is some 250 bytes however little it holds, and the
// informers keep one per Service and slice of the cluster.
//
// *Meta is a metav1.Object so that the informers' stores key it like any
// API object. As the interface allows for fields an object does not
// support, the others read as empty and setting them does nothing.
type Meta struct {
	Name, Namespace   string
	UID               types.UID
	ResourceVersion   string
	DeletionTimestamp *metav1.Time
	Receipt
}

// Receipt is when draind received an object from the API server. An
// EndpointSlice a watch delivers (a thousand a second in a busy cluster) is
// stamped before draind decodes it, in the goroutine that reads the stream
// (slicecodec.go); any other object as the reflector takes it decoded,
// before converting it. Event-to-datapath latencies count from it, so that
// they include the time an event spends queued inside the informer, not
// only the pass after its handler.
type Receipt struct {
	received int64 // Unix nanoseconds of the informers' clock; 0: none
}

// Received returns when the object was received (zero if not stamped: an
// object made by hand, as in tests).
func (r Receipt) Received() time.Time {
	if r.received == 0 {
		return time.Time{}
	}
	return time.Unix(0, r.received)
}

// Stamp records t as the receipt (the informers stamp what they receive).
func (r *Receipt) Stamp(t time.Time) { r.received = t.UnixNano() }

// stamped is a slim object that records its receipt.
type stamped interface{ Stamp(time.Time) }

var _ metav1.Object = (*Meta)(nil)

// keeper copies the strings a cached object keeps into one allocation: the
// decoded ones sit among the garbage of the decoding, and a few long-lived
// strings pin whole spans of it.
type keeper struct{ b strings.Builder }

// newKeeper returns a keeper for n bytes of strings (more only costs
// another allocation).
func newKeeper(n int) *keeper {
	k := &keeper{}
	k.b.Grow(n)
	return k
}

func (k *keeper) keep(v string) string { return keepText(k, v) }

// keepText is keep of text as received.
func keepText[T bytestring](k *keeper, v T) string {
	if len(v) == 0 {
		return ""
	}
	start := k.b.Len()
	writeText(&k.b, v)
	return k.b.String()[start:]
}

// metaSize is the length of the strings metaOf keeps.
func metaSize(m *metav1.ObjectMeta, uid bool) int {
	n := len(m.Name) + len(m.Namespace) + len(m.ResourceVersion)
	if uid {
		n += len(m.UID)
	}
	return n
}

// metaOf keeps the identity of an object, its UID only if uid is set:
// draind never reads the UIDs of Services and slices (it reads their pods'),
// only those of pods and Leases.
func metaOf(k *keeper, m *metav1.ObjectMeta, uid bool) Meta {
	out := Meta{Name: k.keep(m.Name), Namespace: k.keep(m.Namespace), ResourceVersion: k.keep(m.ResourceVersion),
		DeletionTimestamp: m.DeletionTimestamp}
	if uid {
		out.UID = types.UID(k.keep(string(m.UID)))
	}
	return out
}

// ObjectMeta returns the metadata as an API object's.
func (m *Meta) ObjectMeta() metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		DeletionTimestamp: m.DeletionTimestamp}
}

func (m *Meta) GetNamespace() string                  { return m.Namespace }
func (m *Meta) SetNamespace(v string)                 { m.Namespace = v }
func (m *Meta) GetName() string                       { return m.Name }
func (m *Meta) SetName(v string)                      { m.Name = v }
func (m *Meta) GetUID() types.UID                     { return m.UID }
func (m *Meta) SetUID(v types.UID)                    { m.UID = v }
func (m *Meta) GetResourceVersion() string            { return m.ResourceVersion }
func (m *Meta) SetResourceVersion(v string)           { m.ResourceVersion = v }
func (m *Meta) GetDeletionTimestamp() *metav1.Time    { return m.DeletionTimestamp }
func (m *Meta) SetDeletionTimestamp(v *metav1.Time)   { m.DeletionTimestamp = v }
func (m *Meta) GetGenerateName() string               { return "" }
func (m *Meta) SetGenerateName(string)                {}
func (m *Meta) GetGeneration() int64                  { return 0 }
func (m *Meta) SetGeneration(int64)                   {}
func (m *Meta) GetSelfLink() string                   { return "" }
func (m *Meta) SetSelfLink(string)                    {}
func (m *Meta) GetCreationTimestamp() metav1.Time     { return metav1.Time{} }
func (m *Meta) SetCreationTimestamp(metav1.Time)      {}
func (m *Meta) GetDeletionGracePeriodSeconds() *int64 { return nil }
func (m *Meta) SetDeletionGracePeriodSeconds(*int64)  {}
func (m *Meta) GetLabels() map[string]string          { return nil }
func (m *Meta) SetLabels(map[string]string)           {}
func (m *Meta) GetAnnotations() map[string]string     { return nil }
func (m *Meta) SetAnnotations(map[string]string)      {}
func (m *Meta) GetFinalizers() []string               { return nil }
func (m *Meta) SetFinalizers([]string)                {}
func (m *Meta) GetOwnerReferences() []metav1.OwnerReference {
	return nil
}
func (m *Meta) SetOwnerReferences([]metav1.OwnerReference) {}
func (m *Meta) GetManagedFields() []metav1.ManagedFieldsEntry {
	return nil
}
func (m *Meta) SetManagedFields([]metav1.ManagedFieldsEntry) {}
