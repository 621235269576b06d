package embedded

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/draind/draind/k8s"
	"github.com/draind/draind/test/bed"
	"github.com/draind/draind/test/readme"
	"github.com/draind/draind/test/scenario"
)

// offlineAnswer is the JSON body of /v1/offline as the README documents it.
type offlineAnswer struct {
	Pod     string `json:"pod"`
	State   string `json:"state"`
	Drained bool   `json:"drained"`
}

// TestPrivilegedREADMEPreStopRecipes runs the README's preStop recipes
// exactly as printed (extracted from README.md) from inside a bed pod
// against the real draind offline API on the pod's node: the curl script
// (sh -c, with curl) and the busybox wget one-liner (busybox sh, busybox
// wget). Each must end with the pod drained and its drain Lease published.
// Then, with draind gone from the node, the curl script must fall back to
// its plain sleep at once (curl exit 7, no retries).
func TestPrivilegedREADMEPreStopRecipes(t *testing.T) {
	bed.RequirePrivileged(t)
	if err := Preflight(); err != nil {
		t.Skipf("SKIP: %v", err)
	}
	doc, err := readme.Load()
	if err != nil {
		t.Fatal(err)
	}
	block, err := doc.Block("yaml", "curl", "preStop")
	if err != nil {
		t.Fatal(err)
	}
	curlCmd, err := readme.PreStopCommand(block, "app")
	if err != nil {
		t.Fatal(err)
	}
	wgetLine, err := doc.InlineCode("wget", "/v1/offline")
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"sh", "curl", "busybox"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (test/deps.sh installs it): %v", tool, err)
		}
	}
	busybox, _ := exec.LookPath("busybox")
	// A PATH on which wget is busybox's, as in a busybox-based image.
	bbDir := t.TempDir()
	if err := os.Symlink(busybox, filepath.Join(bbDir, "wget")); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := New(ctx, Config{Log: log})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stop, err := c.Prepare(ctx, scenario.Draind)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { stop() }()
	node := c.ServerNodes()[0]
	d := c.daemons[node]
	env := func(path string) []string {
		return []string{"HOST_IP=" + node.IP4.String(), "PATH=" + path}
	}
	sysPath := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

	startPod := func(name string) *bed.Pod {
		t.Helper()
		bp, err := node.AddPod(c.bed.ID + "-" + name)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.RunPod(ctx, scenario.PodSpec{Namespace: "readme", Name: name, Node: node, Port: 8080,
			IPs: []netip.Addr{bp.IP4, bp.IP6}, Labels: map[string]string{"app": name}}); err != nil {
			t.Fatal(err)
		}
		// Wait until the node's draind knows the pod and its IP, as the pod
		// sees it (the pod is created first and gets its IPs with its
		// status; until then a recipe's call is refused, 403).
		if d != nil {
			waitKnown(t, ctx, bp, env(sysPath))
		}
		return bp
	}

	for _, tc := range []struct {
		name string
		argv []string
		path string
	}{
		{"curl", curlCmd, sysPath},
		{"wget", []string{busybox, "sh", "-c", wgetLine}, bbDir + ":" + sysPath},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bp := startPod("recipe-" + tc.name)
			start := time.Now()
			out, err := bp.Exec(ctx, env(tc.path), tc.argv[0], tc.argv[1:]...)
			t.Logf("%s recipe (%v): %s", tc.name, time.Since(start).Round(time.Millisecond), out)
			if err != nil {
				t.Fatalf("the %s recipe failed: %v\n%s", tc.name, err, out)
			}
			var a offlineAnswer
			if err := json.Unmarshal(bytes.TrimSpace(out), &a); err != nil {
				t.Fatalf("the %s recipe did not print the offline answer: %v\n%s", tc.name, err, out)
			}
			if a.Pod != "readme/recipe-"+tc.name || a.State != "drained" || !a.Drained {
				t.Errorf("offline answer %+v, want the pod drained", a)
			}
			uid := podUID(t, ctx, c, "recipe-"+tc.name)
			l, err := c.api.CoordinationV1().Leases(DraindNamespace).Get(ctx, k8s.LeaseName(uid), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("no drain Lease for the pod: %v", err)
			}
			if l.Annotations[k8s.AnnReason] != k8s.ReasonOffline {
				t.Errorf("drain Lease reason %q, want %s", l.Annotations[k8s.AnnReason], k8s.ReasonOffline)
			}
		})
	}

	t.Run("curl-fallback", func(t *testing.T) {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		d = nil
		bp := startPod("recipe-fallback")
		// sleep records its argument instead of sleeping.
		shim := t.TempDir()
		logf := filepath.Join(shim, "sleeps")
		script := fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\n", logf)
		if err := os.WriteFile(filepath.Join(shim, "sleep"), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		out, err := bp.Exec(ctx, env(shim+":"+sysPath), curlCmd[0], curlCmd[1:]...)
		if err != nil {
			t.Fatalf("the curl recipe without draind failed: %v\n%s", err, out)
		}
		b, _ := os.ReadFile(logf)
		if got := strings.TrimSpace(string(b)); got != "20" {
			t.Errorf("sleeps %q, want only the fallback sleep 20 (curl exit 7 breaks the retry loop)\n%s", got, out)
		}
		if !strings.Contains(string(out), "curl: (7)") {
			t.Errorf("curl did not fail to connect: %s", out)
		}
	})

	// A draind that answers (draind stopped above; a stub on its port):
	// 503 is retried (a draind restarting), a refusal (403) is not, and
	// neither ends the hook before its fallback sleep.
	for _, tc := range []struct {
		code  int
		sleep string
	}{{http.StatusServiceUnavailable, "1\n1\n1\n1\n1\n20"}, {http.StatusForbidden, "20"}} {
		t.Run(fmt.Sprintf("curl-answer-%d", tc.code), func(t *testing.T) {
			var l net.Listener
			if err := node.NS.Do(func() (err error) {
				l, err = net.Listen("tcp", fmt.Sprintf("%s:9460", node.IP4))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.code)
				fmt.Fprint(w, `{"error":"stub"}`)
			})}
			go srv.Serve(l)
			defer srv.Close()
			bp := startPod(fmt.Sprintf("recipe-%d", tc.code))
			shim := t.TempDir()
			logf := filepath.Join(shim, "sleeps")
			if err := os.WriteFile(filepath.Join(shim, "sleep"), []byte(fmt.Sprintf("#!/bin/sh\necho \"$*\" >> %s\n", logf)), 0o755); err != nil {
				t.Fatal(err)
			}
			out, err := bp.Exec(ctx, env(shim+":"+sysPath), curlCmd[0], curlCmd[1:]...)
			if err != nil {
				t.Fatalf("the curl recipe failed: %v\n%s", err, out)
			}
			b, _ := os.ReadFile(logf)
			if got := strings.TrimSpace(string(b)); got != tc.sleep {
				t.Errorf("answered %d: sleeps %q, want %q\n%s", tc.code, got, tc.sleep, out)
			}
		})
	}
}

// waitKnown waits until the node's draind answers the pod's own calls: POST
// /v1/online, which changes nothing for a pod that is not draining, is
// refused (403, not a pod on this node) until the daemon has seen the pod
// with its IP, and answered 200 from then on.
func waitKnown(t *testing.T, ctx context.Context, bp *bed.Pod, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	call := `curl -sS -o /dev/null -w '%{http_code}' -X POST --max-time 5 "http://${HOST_IP}:9460/v1/online"`
	for {
		out, err := bp.Exec(ctx, env, "sh", "-c", call)
		code := strings.TrimSpace(string(out))
		switch {
		case err == nil && code == "200":
			return
		case err == nil && code == "403":
		default:
			t.Fatalf("POST /v1/online from pod %s: %s %v", bp.Name, out, err)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the node's draind still refuses pod %s after 30s: %v", bp.Name, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func podUID(t *testing.T, ctx context.Context, c *Cluster, name string) types.UID {
	t.Helper()
	p, err := c.api.CoreV1().Pods("readme").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p.UID
}
