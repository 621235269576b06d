package lease

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/draind/draind/k8s"
)

// listing is what the fake slices record says of one IP.
type listing struct {
	uid   types.UID
	node  string
	until time.Time // an ended listing's end (zero: it has not ended)
}

// sliceRecord is a Record over listings by IP.
type sliceRecord map[netip.Addr]listing

func (r sliceRecord) HostOf(ip netip.Addr, uid types.UID) (string, bool, time.Time) {
	if l, ok := r[ip]; ok && l.uid == uid {
		return l.node, true, l.until
	}
	return "", false, time.Time{}
}

// TestJudgeBelieved: Judge.Believed applies each rule a Lease is believed
// by: expiry; a holder (none: refused); this node's Leases by this node's pods alone; another node's
// by the trusted slices' listings (only the IPs listed on the holder, a
// listing elsewhere or without a node refusing it, an ended listing
// counting until its end); a pod no slice lists by its Pod object (asked
// for once, off the call: on the holder, its own IPs only, refused until
// the recheck otherwise); and, for a pod the API no longer has, the
// inherited addresses.
func TestJudgeBelieved(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	exp, ended, recheck := now.Add(29*time.Second), now.Add(10*time.Second), now.Add(RecheckAfter)
	ip7, ip8, ip99 := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8"), netip.MustParseAddr("10.0.0.99")
	const uid = types.UID("uid-web-1")
	pod := func(node string, uid types.UID, ips ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-1", UID: uid}, Spec: corev1.PodSpec{NodeName: node}}
		for _, ip := range ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		return p
	}
	local := func(u types.UID) map[netip.Addr]*k8s.Pod {
		return map[netip.Addr]*k8s.Pod{ip7: {ObjectMeta: metav1.ObjectMeta{UID: u}, IPs: []netip.Addr{ip7}}}
	}
	for _, tc := range []struct {
		name      string
		holder    string
		renewed   time.Time // zero: a second ago
		local     map[netip.Addr]*k8s.Pod
		slices    sliceRecord
		pod       *corev1.Pod
		inherited map[netip.Addr]bool
		asksPod   bool // the Pod object is read
		want      []netip.Addr
		ok        bool
		until     time.Time
	}{
		{name: "expired", holder: "node-a", renewed: now.Add(-time.Minute), local: local(uid)},
		{name: "own: the local pod's IPs", holder: "node-a", local: local(uid), want: []netip.Addr{ip7}, ok: true, until: exp},
		{name: "own: another pod at the IP", holder: "node-a", local: local("uid-other"), until: exp},
		{name: "own: slices are not read", holder: "node-a", slices: sliceRecord{ip7: {uid, "node-a", time.Time{}}}, until: exp},
		{name: "listed on the holder", holder: "node-b", slices: sliceRecord{ip7: {uid, "node-b", time.Time{}}},
			want: []netip.Addr{ip7}, ok: true, until: exp},
		{name: "listed on another node at one IP", holder: "node-b",
			slices: sliceRecord{ip7: {uid, "node-b", time.Time{}}, ip8: {uid, "node-c", time.Time{}}}, pod: pod("node-b", uid, "10.0.0.7"), until: exp},
		{name: "listed without a node", holder: "node-b", slices: sliceRecord{ip7: {uid, "", time.Time{}}}, until: exp},
		{name: "no holder, listed without a node", holder: "", slices: sliceRecord{ip7: {uid, "", time.Time{}}}, until: exp},
		{name: "no holder, Pod object without a node", holder: "", pod: pod("", uid, "10.0.0.7"), until: exp},
		{name: "another pod listed at the IP", holder: "node-b", slices: sliceRecord{ip7: {"uid-other", "node-b", time.Time{}}},
			pod: pod("node-b", uid, "10.0.0.7"), asksPod: true, want: []netip.Addr{ip7}, ok: true, until: exp},
		{name: "ended listing on the holder", holder: "node-b", slices: sliceRecord{ip7: {uid, "node-b", ended}},
			want: []netip.Addr{ip7}, ok: true, until: ended},
		{name: "ended listing elsewhere", holder: "node-b", slices: sliceRecord{ip7: {uid, "node-c", ended}}, until: ended},
		{name: "Pod object on the holder", holder: "node-b", pod: pod("node-b", uid, "10.0.0.7", "fd00::7"),
			asksPod: true, want: []netip.Addr{ip7}, ok: true, until: exp},
		{name: "Pod object on another node", holder: "node-b", pod: pod("node-c", uid, "10.0.0.7"), asksPod: true, until: recheck},
		{name: "Pod object without the Lease's IPs", holder: "node-b", pod: pod("node-b", uid, "10.0.0.9"), asksPod: true, until: recheck},
		{name: "no Pod object", holder: "node-b", asksPod: true, until: recheck},
		{name: "no Pod object, inherited", holder: "node-b", inherited: map[netip.Addr]bool{ip8: true},
			asksPod: true, want: []netip.Addr{ip8}, ok: true, until: exp},
		{name: "another pod of the name, inherited", holder: "node-b", pod: pod("node-b", "uid-web-2", "10.0.0.7"),
			inherited: map[netip.Addr]bool{ip8: true}, asksPod: true, want: []netip.Addr{ip8}, ok: true, until: exp},
		{name: "Pod object elsewhere, inherited", holder: "node-b", pod: pod("node-c", uid, "10.0.0.7"),
			inherited: map[netip.Addr]bool{ip7: true}, asksPod: true, until: recheck},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.pod != nil {
				if err := client.Tracker().Add(tc.pod); err != nil {
					t.Fatal(err)
				}
			}
			clk := testingclock.NewFakeClock(now)
			tr := NewTrust(client.CoreV1(), clk, quietLog(), nil)
			tr.Inherit(tc.inherited)
			j := &Judge{Node: "node-a", Slices: tc.slices, Pods: tr}
			if tc.slices == nil {
				j.Slices = sliceRecord{}
			}
			renewed := tc.renewed
			if renewed.IsZero() {
				renewed = now.Add(-time.Second)
			}
			l := &k8s.DrainLease{ObjectMeta: metav1.ObjectMeta{Name: k8s.LeaseName(uid)}, PodNamespace: "shop", PodName: "web-1",
				PodUID: uid, Holder: tc.holder, IPs: []netip.Addr{ip7, ip8, ip99}, Renewed: renewed, Duration: 30 * time.Second}

			if _, ok, _ := j.Believed(l, tc.local, nil, now); ok && tc.asksPod {
				t.Fatal("believed by its Pod object before the object was read")
			}
			if asked := tr.Flush(t.Context()); asked != tc.asksPod {
				t.Fatalf("Pod object read: %v, want %v", asked, tc.asksPod)
			}
			buf := []netip.Addr{netip.MustParseAddr("192.0.2.1")}
			ips, ok, until := j.Believed(l, tc.local, buf[:1:1], now)
			if ok != tc.ok || !slices.Equal(ips[1:], tc.want) || ips[0] != buf[0] || !until.Equal(tc.until) {
				t.Fatalf("Believed = %v, %v, %v; want %v appended to %v, %v, %v", ips, ok, until, tc.want, buf, tc.ok, tc.until)
			}
		})
	}
}
