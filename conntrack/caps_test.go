package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/draind/draind/test/bed"
)

const envCapCheck = "DRAIND_CT_CAPCHECK"

// capCheckMain opens conntrack the way the DaemonSet does (no NetNS) and
// counts flows, in a process that holds only CAP_NET_ADMIN.
func capCheckMain() {
	v, ok := os.LookupEnv(envCapCheck)
	if !ok {
		return
	}
	n, err := Open(Options{NetNS: v})
	if err == nil {
		_, err = n.Count(context.Background(), netip.MustParseAddr("10.0.0.1"))
		if err == nil {
			// An IPv6 address runs the filter probe too: a flow created
			// and deleted through ti-mo/conntrack.
			_, err = n.Count(context.Background(), netip.MustParseAddr("fd00::1"))
		}
		if err == nil && n.v6Filter == 0 {
			err = errors.New("the IPv6 filter probe did not run")
		}
		n.Close()
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println("ok")
	os.Exit(0)
}

// TestPrivilegedOpenWithNetAdminOnly proves the DaemonSet's capabilities
// suffice: conntrack in the daemon's own namespace needs CAP_NET_ADMIN only,
// while entering another namespace (tests) needs CAP_SYS_ADMIN.
func TestPrivilegedOpenWithNetAdminOnly(t *testing.T) {
	bed.RequirePrivileged(t)
	ns, err := bed.NewNetNS("ct-caps-" + bed.RandSuffix(5))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	run := func(nsArg string) (string, error) {
		cmd := ns.Command("setpriv", "--bounding-set=-all,+net_admin", "--inh-caps=-all", "--", self)
		cmd.Env = append(os.Environ(), envCapCheck+"="+nsArg)
		out, err := cmd.CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := run(""); err != nil || out != "ok" {
		t.Errorf("with CAP_NET_ADMIN only, in its own namespace: %v %q", err, out)
	}
	// The control: naming a namespace means setns, which is refused.
	if out, err := run(ns.Path()); err == nil || !strings.Contains(out, "operation not permitted") {
		t.Errorf("setns without CAP_SYS_ADMIN should be refused: %v %q", err, out)
	}
}
