package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/draind/draind/bpf"
	"github.com/draind/draind/daemon/internal/backendset"
	"github.com/draind/draind/k8s"
)

// checkSelectable checks what no comparison with a fresh model can see of
// the service-ports only lingering entries keep active (a fresh model has
// no linger): every active service-port selects the endpoints its Service
// lists as selectable now (none if it lists none), as a linger rewrites
// to them.
func checkSelectable(m *Model) error {
	for id, sp := range m.servicePorts {
		var want []netip.AddrPort
		if svc := m.state.Service(sp.key.Service); svc != nil {
			cat := categorize(svc, m.state.SlicesOf(sp.key.Service), m.drainsByPod, place{m.cfg.Node, m.cfg.Zone}, nil)
			for _, c := range cat.servicePorts {
				if c.key == sp.key {
					want = c.selectable
				}
			}
		}
		if sp.selectable != backendset.Pack(want) {
			return fmt.Errorf("service-port %d %v selects %v, its Service lists %v selectable",
				id, sp.key, sp.selectable.AppendAddrPorts(nil), want)
		}
	}
	return nil
}

// lingerOnly counts the active service-ports that only lingering entries
// keep active.
func lingerOnly(m *Model) int {
	named := map[bpf.ServicePortID]bool{}
	for _, cs := range m.contributions {
		for _, c := range cs {
			if c.kind != fromLinger {
				named[c.servicePort] = true
			}
		}
	}
	n := 0
	for id := range m.servicePorts {
		if !named[id] && len(m.lingerKeys[id]) > 0 {
			n++
		}
	}
	return n
}

// TestLingeringSelectsNow runs random sequences of a Service's endpoints
// arriving, changing condition and leaving, pods draining and undraining,
// and time passing, and checks after every step that each active
// service-port, those only departed endpoints' lingers keep active
// included, selects what its Service lists as selectable now: a lingering
// entry rewrites a connection to the departed IP to one of them.
func TestLingeringSelectsNow(t *testing.T) {
	conds := []uint8{condReady, condReady, condTerminating, condNotReady, k8s.CondTerminating}
	nodes := []string{testNode, "node-b"}
	seen, broken := 0, 0 // steps with a service-port only lingers keep; corrupted sets caught
	for seed := range uint64(20) {
		t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			st := &fuzzState{svc: catService()}
			cl := NewClaims(clock.RealClock{}, time.Minute)
			m := New(Config{Node: testNode, EntryTTL: time.Minute, Linger: time.Minute, RegistryOnlyPolicy: bpf.PolicyRefuse}, st, cl)
			now := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
			listed := map[int]k8s.Endpoint{} // pod index -> its endpoint
			for step := range 400 {
				switch r := rng.IntN(10); {
				case r < 6: // a pod is listed, changes condition or leaves the slice
					i := rng.IntN(6)
					if _, ok := listed[i]; ok && rng.IntN(3) == 0 {
						delete(listed, i)
					} else {
						listed[i] = catEndpoint("10.0.0."+strconv.Itoa(i+1), "p"+strconv.Itoa(i), nodes[rng.IntN(2)], conds[rng.IntN(len(conds))])
					}
					var eps []k8s.Endpoint
					for i := range 6 {
						if e, ok := listed[i]; ok {
							eps = append(eps, e)
						}
					}
					sl := catSlice(k8s.IPv4, 8080, bpf.TCP, eps...)
					sl.Namespace, sl.Name = "default", "web-1"
					st.slices = []*k8s.Slice{sl}
					cl.SetSlice("default/web-1", sl)
				case r < 8: // pods drain as a Lease or this node says, or stop draining
					drains := map[types.UID]*PodDrain{}
					for i := range 6 {
						if rng.IntN(4) == 0 {
							uid := types.UID("p" + strconv.Itoa(i))
							drains[uid] = &PodDrain{UID: uid, Namespace: "default", Name: "pod-" + string(uid), Reason: k8s.ReasonOffline,
								IPs: []netip.Addr{netip.MustParseAddr("10.0.0." + strconv.Itoa(i+1))}, SteerPodIP: rng.IntN(2) == 0}
						}
					}
					m.SetPodDrains(drains)
				default:
					now = now.Add(time.Duration(rng.IntN(30)) * time.Second)
					m.ExpireLingering(now)
					if err := checkSelectable(m); err != nil { // the state did not change
						t.Fatalf("step %d, lingers expired: %v", step, err)
					}
				}
				m.RecomputeService("default/web", now)
				if err := checkSelectable(m); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				checkContributionIndex(t, m)
				if lingerOnly(m) > 0 {
					seen++
				}
			}
			for _, sp := range m.servicePorts { // the check sees a wrong set
				good := sp.selectable
				sp.selectable = backendset.Pack(aps("192.0.2.1:1"))
				if checkSelectable(m) == nil {
					t.Fatalf("service-port %v selects 192.0.2.1:1, the check found nothing", sp.key)
				}
				sp.selectable = good
				broken++
			}
		})
	}
	t.Logf("%d steps had a service-port only lingers keep active; %d corrupted sets caught", seen, broken)
	if seen == 0 || broken == 0 {
		t.Fatal("the sequences tested no linger-only service-port, or no corrupted set")
	}
}
