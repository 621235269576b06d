package bpf_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/draind/draind/bpf"
)

const envCapCheck = "DRAIND_BPF_CAPCHECK"

// capCheck is what the reduced-capability child does: the daemon's whole
// datapath life cycle on the pins and cgroup the test prepared.
type capCheck struct {
	PinDir    string
	Cgroup    string
	Backends  []bpf.Backends
	Frontends []bpf.Frontend
	Drains    []bpf.Drain
	// Sockets loads the socket hooks too, and writes GonePeers.
	Sockets   bool
	GonePeers []bpf.GonePeer
	// ReportProbe makes the child print what Probe says of socket
	// iterators instead of running the life cycle.
	ReportProbe bool
}

// capCheckMain runs the check if this process is the child, and exits.
func capCheckMain() {
	v, ok := os.LookupEnv(envCapCheck)
	if !ok {
		return
	}
	if err := runCapCheck(v); err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
	os.Exit(0)
}

func runCapCheck(cfg string) error {
	var c capCheck
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		return err
	}
	f, err := bpf.Probe()
	if err != nil {
		return err
	}
	if c.ReportProbe {
		fmt.Println(f.SocketIterators)
		os.Exit(0)
	}
	want := 7
	if c.Sockets {
		want = 9
	}
	for round := 0; round < 2; round++ { // the second round replaces the programs in place
		dp, err := bpf.Load(bpf.Options{PinDir: c.PinDir, Sockets: c.Sockets})
		if err != nil {
			return err
		}
		if err := dp.Attach(c.Cgroup); err != nil {
			dp.Close()
			return err
		}
		for _, b := range c.Backends {
			err = errors.Join(err, dp.SetBackends(b))
		}
		for _, fe := range c.Frontends {
			err = errors.Join(err, dp.UpsertFrontend(fe))
		}
		for _, d := range c.Drains {
			err = errors.Join(err, dp.UpsertDrain(d))
		}
		for _, g := range c.GonePeers {
			err = errors.Join(err, dp.UpsertGonePeer(g))
		}
		if _, serr := dp.MapStats(); serr != nil {
			err = errors.Join(err, serr)
		}
		if len(dp.Attached()) != want {
			err = errors.Join(err, fmt.Errorf("attached %v", dp.Attached()))
		}
		if err = errors.Join(err, dp.Close()); err != nil {
			return err
		}
	}
	return nil
}

// TestPrivilegedUDPDaemonSetCapabilities proves that the DaemonSet's
// capabilities (CAP_BPF and CAP_NET_ADMIN, nothing else) load and attach
// every program, including the datagram hooks, and replace them in place;
// then that what the child set up steers. The control drops CAP_BPF too and
// must fail.
func TestPrivilegedUDPDaemonSetCapabilities(t *testing.T) {
	f := newUDPFixture(t)
	// Start from nothing: the child loads, pins and attaches.
	must(t, f.dp.Close())
	must(t, bpf.Remove(f.pinDir))
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop capabilities: %v", err)
	}
	exp := time.Now().Add(time.Minute)
	svc := udpService(false)
	cfg := capCheck{
		PinDir: f.pinDir, Cgroup: f.node.Pods.Path,
		Backends:  []bpf.Backends{{Service: svc, Backends: f.backends(false, 1, 2), Expires: exp}},
		Frontends: []bpf.Frontend{{Key: f.udpKey(f.vipKey(false)), Service: svc, Expires: exp}},
		Drains:    []bpf.Drain{{Key: f.udpKey(f.podKey(0, false)), Service: svc, Policy: bpf.PolicyRefuse, Expires: exp}},
	}
	b, err := json.Marshal(cfg)
	must(t, err)
	self, err := os.Executable()
	must(t, err)
	run := func(caps string) (string, error) {
		cmd := exec.Command("setpriv", "--bounding-set=-all,"+caps, "--inh-caps=-all", "--", self)
		cmd.Env = append(os.Environ(), envCapCheck+"="+string(b))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	// The control first: without CAP_BPF nothing loads.
	if out, err := run("+net_admin"); err == nil || !strings.Contains(out, "not permitted") {
		t.Fatalf("with CAP_NET_ADMIN alone loading should be refused: %v %q", err, out)
	}
	if out, err := run("+bpf,+net_admin"); err != nil || out != "ok" {
		t.Fatalf("with CAP_BPF and CAP_NET_ADMIN only: %v %q", err, out)
	}
	links, err := os.ReadDir(filepath.Join(f.pinDir, "links"))
	must(t, err)
	var names []string
	for _, l := range links {
		names = append(names, l.Name())
	}
	if len(names) != 7 {
		t.Errorf("pinned links after the child: %v", names)
	}

	// What the child loaded and wrote steers: datagrams to the VIP reach
	// srv2/srv3 and answer from the VIP; the draining pod IP refuses.
	fam := udpFamilies[0]
	r := f.sendto(t, fam, f.vip[false], 30, true)
	if r.OK != 30 || r.By["srv1"] != 0 {
		t.Errorf("VIP through the child's programs: %v %v", r.By, r.Fails)
	}
	onlySource(t, "VIP through the child's programs", r, f.vip[false])
	r = f.sendto(t, fam, netip.AddrPortFrom(f.pods[0].IP4, podPort), 5, false)
	if r.Fails[refusal(t)] != 5 {
		t.Errorf("refuse through the child's programs: %v %v", r.By, r.Fails)
	}

	// draind bpf remove detaches the datagram hooks too: kube-proxy alone.
	must(t, bpf.Remove(f.pinDir))
	if left, _ := os.ReadDir(filepath.Join(f.pinDir, "links")); len(left) != 0 {
		t.Errorf("links left after Remove: %v", left)
	}
	r = f.sendto(t, fam, netip.AddrPortFrom(f.pods[0].IP4, podPort), 5, false)
	if r.By["srv1"] != 5 {
		t.Errorf("after Remove the pod IP must not be refused: %v %v", r.By, r.Fails)
	}
	r = f.sendto(t, fam, f.vip[false], 60, true)
	if r.OK != 60 || r.By["srv1"] == 0 {
		t.Errorf("after Remove the VIP must be kube-proxy's again (srv1 included): %v %v", r.By, r.Fails)
	}
}

// TestPrivilegedSocketDaemonSetCapabilities proves that the DaemonSet's
// capabilities (CAP_BPF and CAP_NET_ADMIN) load and attach the socket hooks
// too (sock_ops and cgroup_skb egress), and that what the child wrote ends a
// connected UDP socket to a gone pod; and that the socket iterators (where
// bpf_sock_destroy is callable) are refused under them (CAP_PERFMON).
func TestPrivilegedSocketDaemonSetCapabilities(t *testing.T) {
	f := newUDPFixtureWith(t, true)
	srv1 := netip.AddrPortFrom(f.pods[0].IP4, podPort)
	if r := f.sock.call(t, sockReq{Op: "connect", ID: "a", Family: "4", Addr: srv1.String()}); r.OK != 1 {
		t.Fatalf("connect: %+v", r)
	}
	must(t, f.dp.Close())
	must(t, bpf.Remove(f.pinDir))
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatalf("setpriv (util-linux) is needed to drop capabilities: %v", err)
	}
	cfg := capCheck{PinDir: f.pinDir, Cgroup: f.node.Pods.Path, Sockets: true,
		GonePeers: []bpf.GonePeer{{Addr: f.pods[0].IP4, GoneAt: time.Now(), Expires: time.Now().Add(time.Minute)}}}
	self, err := os.Executable()
	must(t, err)
	run := func(c capCheck, caps string) (string, error) {
		b, err := json.Marshal(c)
		must(t, err)
		cmd := exec.Command("setpriv", "--bounding-set=-all,"+caps, "--inh-caps=-all", "--", self)
		cmd.Env = append(os.Environ(), envCapCheck+"="+string(b))
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run(cfg, "+bpf,+net_admin"); err != nil || out != "ok" {
		t.Fatalf("socket hooks with CAP_BPF and CAP_NET_ADMIN only: %v %q", err, out)
	}
	links, err := os.ReadDir(filepath.Join(f.pinDir, "links"))
	must(t, err)
	if len(links) != 9 {
		t.Errorf("pinned links after the child: %d, want 9", len(links))
	}
	if r := f.sock.call(t, sockReq{Op: "exchange", ID: "a"}); r.Fails["eperm"] != 1 {
		t.Errorf("connected UDP to the gone pod through the child's programs: %+v", r)
	}
	out, err := run(capCheck{ReportProbe: true}, "+bpf,+net_admin")
	if err != nil || !strings.Contains(out, "need CAP_PERFMON") {
		t.Errorf("socket iterators with CAP_BPF and CAP_NET_ADMIN: want refused for lack of CAP_PERFMON, got %v %q", err, out)
	}
	t.Logf("socket iterators under the DaemonSet's capabilities: %s", out)
	must(t, bpf.Remove(f.pinDir))
}
