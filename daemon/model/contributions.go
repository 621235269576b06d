package model

import (
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/bpf"
)

// contributionKind says where a contribution comes from.
type contributionKind uint8

const (
	// fromServicePort: a draining endpoint of an active service-port.
	fromServicePort contributionKind = iota + 1
	// fromPodDrain: a pod drain's all-ports entries (port 0).
	fromPodDrain
	// fromLinger: an endpoint that drained and left every slice.
	fromLinger
)

// contribution is one reason for a drain entry. Several can name the same
// key (an endpoint of several Services, a drained pod's all-ports entry);
// desired.go merges them, the most cautious policy winning.
type contribution struct {
	kind        contributionKind
	uid         types.UID
	pod         string            // namespace/name
	servicePort bpf.ServicePortID // 0: none (a pod drain's all-ports entry)
	policy      bpf.Policy
	reason      string
	since       time.Time
	expires     time.Time // zero: refreshed by EntryTTL
	// frontendOnly: an endpoint no trusted slice identifies; it keeps its
	// service-port's VIP steered but its address gets no entry.
	frontendOnly bool
}

func (m *Model) touch(k bpf.EndpointKey) { m.touched[k] = struct{}{} }

func (m *Model) addContribution(k bpf.EndpointKey, c contribution) {
	m.contributions[k] = append(m.contributions[k], c)
	if c.servicePort != 0 {
		if sp := m.servicePorts[c.servicePort]; sp != nil {
			sp.refs++
		}
	}
	if ips := m.byIP[k.Addr]; !slices.Contains(ips, k) {
		m.byIP[k.Addr] = append(ips, k)
	}
	m.touch(k)
}

// removeContribution drops the contributions of k that match.
func (m *Model) removeContribution(k bpf.EndpointKey, match func(contribution) bool) {
	m.dropContributions(k, match)
	m.forgetIfEmpty(k)
}

// dropContributions drops the contributions of k that match and leaves k,
// emptied, in place (forgetIfEmpty removes it).
func (m *Model) dropContributions(k bpf.EndpointKey, match func(contribution) bool) {
	cs := m.contributions[k]
	out := cs[:0]
	for _, c := range cs {
		if match(c) {
			if c.servicePort != 0 {
				if sp := m.servicePorts[c.servicePort]; sp != nil {
					sp.refs--
				}
			}
			m.touch(k)
			continue
		}
		out = append(out, c)
	}
	if len(out) < len(cs) {
		clear(cs[len(out):]) // the slice's spare room keeps no UID or pod name
		m.contributions[k] = out
	}
}

// forgetIfEmpty removes k if it has no contribution left.
func (m *Model) forgetIfEmpty(k bpf.EndpointKey) {
	if cs, ok := m.contributions[k]; !ok || len(cs) > 0 {
		return
	}
	delete(m.contributions, k)
	dropKey(m.byIP, k.Addr, k)
}

// setListing records whether a Service lists a drained pod.
func (m *Model) setListing(uid types.UID, svc string, on bool) {
	set := m.listings[uid]
	_, was := set[svc]
	if on == was {
		return
	}
	if on {
		if set == nil {
			set = map[string]struct{}{}
			m.listings[uid] = set
		}
		set[svc] = struct{}{}
	} else {
		delete(set, svc)
		if len(set) == 0 {
			delete(m.listings, uid)
		}
	}
	m.notesGen++
	m.updatePodEntries(uid)
}

// updatePodEntries sets the all-ports entries of a drained pod: they refuse
// (or pass) connections to a pod no Service lists (a registry-only
// workload), and on the pod's own node let the observer count every SYN.
func (m *Model) updatePodEntries(uid types.UID) {
	m.withdrawPodEntries(uid)
	d := m.podDrains[uid]
	if d == nil {
		return
	}
	policy := bpf.PolicyOff
	if lp, listed := m.listedPolicy[uid]; len(m.listings[uid]) == 0 && (!listed || lp != bpf.PolicyOff) {
		// No Service lists it (any more): nothing to rewrite to. A pod
		// that a Service with policy off listed stays off.
		policy = m.cfg.RegistryOnlyPolicy
	}
	for _, ip := range d.IPs {
		for _, proto := range []bpf.Protocol{bpf.TCP, bpf.UDP} {
			m.addContribution(bpf.EndpointKey{Addr: ip, Port: 0, Proto: proto}, contribution{kind: fromPodDrain, uid: uid,
				pod: d.Namespace + "/" + d.Name, policy: policy, reason: d.Reason, since: d.Since, expires: d.Expires})
		}
	}
}

// withdrawPodEntries removes a drained pod's all-ports entries, found
// through the IPs of its current drain.
func (m *Model) withdrawPodEntries(uid types.UID) {
	d := m.podDrains[uid]
	if d == nil {
		return
	}
	mine := func(c contribution) bool { return c.kind == fromPodDrain && c.uid == uid }
	var keys []bpf.EndpointKey
	for _, ip := range d.IPs {
		for _, k := range m.byIP[ip] {
			for _, c := range m.contributions[k] {
				if mine(c) {
					keys = append(keys, k)
					break
				}
			}
		}
	}
	for _, k := range keys {
		m.removeContribution(k, mine)
	}
}
