package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/draind/draind/test/cluster/kube"
)

// Debian 12's packages the node runs (installed by .ci/run).
const (
	containerdBin = "containerd"
	ctrBin        = "ctr"
	cniBinDir     = "/usr/lib/cni"
	// PodCIDR is the node's pod network (the CNI bridge's subnet).
	PodCIDR = "10.244.0.0/24"
	// ServiceCIDR is the cluster's Service range (IPv4 only).
	ServiceCIDR = "10.96.0.0/16"
	// ClusterCIDR is what kube-proxy treats as the pod network.
	ClusterCIDR = "10.244.0.0/16"
)

// Tools returns the host commands a real node needs that are missing.
func Tools() []string {
	var missing []string
	for _, t := range []string{containerdBin, ctrBin, "containerd-shim-runc-v2", "runc", "ip", "iptables"} {
		if _, err := exec.LookPath(t); err != nil {
			missing = append(missing, t)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if _, err := os.Stat(filepath.Join(cniBinDir, p)); err != nil {
			missing = append(missing, filepath.Join(cniBinDir, p))
		}
	}
	return missing
}

// containerdConfig is containerd's configuration: every path inside the
// run's directory, the CRI plugin with runc (cgroupfs, its own state root)
// and the bridge CNI, and the settings this host needs.
func (n *Node) containerdConfig() string {
	d := n.path("containerd")
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[4]q
  # Processes here, root included, lack CAP_SYS_RESOURCE: without this runc
  # cannot lower oom_score_adj and every sandbox fails ("can't get final
  # child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  # Pod network namespaces under the run's directory, not /run/netns.
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %[5]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[6]q
    conf_dir = %[7]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[8]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), n.ContainerdSocket, PauseImage,
		filepath.Join(d, "runc"), cniBinDir, n.path("cni/net.d"), filepath.Join(d, "opt"))
}

// cniConfig is the pod network: a bridge in the node's namespace that is
// the pods' gateway (hairpin on, so a pod reaches itself through a
// Service), host-local addresses from PodCIDR, portmap for hostPorts.
func (n *Node) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "draind-realnode",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": %q
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.PodCIDR(), n.path("cni/ipam"))
}

// PodCIDR is the node's pod network.
func (n *Node) PodCIDR() string {
	if n.podCIDR != "" {
		return n.podCIDR
	}
	return PodCIDR
}

func (n *Node) startContainerd(ctx context.Context) error {
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	if err := os.WriteFile(n.path("containerd/config.toml"), []byte(n.containerdConfig()), 0o644); err != nil {
		return fmt.Errorf("writing containerd's config: %w", err)
	}
	if err := os.WriteFile(n.path("cni/net.d/10-bridge.conflist"), []byte(n.cniConfig()), 0o644); err != nil {
		return fmt.Errorf("writing the CNI config: %w", err)
	}
	var err error
	n.containerd, err = n.startProc("containerd", containerdBin, "--config", n.path("containerd/config.toml"))
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return kube.Poll(wctx, 100*time.Millisecond, func() (bool, error) {
		if err := n.containerd.deadErr(); err != nil {
			return false, err
		}
		_, err := n.Ctr(wctx, "version")
		return err == nil, nil
	})
}

// Ctr runs ctr against the node's containerd, in the CRI's k8s.io
// namespace.
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	return run(ctx, "", ctrBin, append([]string{"--address", n.ContainerdSocket, "--namespace", "k8s.io"}, args...)...)
}

// ImportImages imports an OCI archive into the node's containerd, as the
// kubelet's images (no registry: pods use them with IfNotPresent).
func (n *Node) ImportImages(ctx context.Context, archive string) error {
	if _, err := n.Ctr(ctx, "images", "import", archive); err != nil {
		return fmt.Errorf("importing %s: %w", archive, err)
	}
	return nil
}

// Images lists the image references the node's containerd has.
func (n *Node) Images(ctx context.Context) ([]string, error) {
	out, err := n.Ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// runningTasks lists containerd's tasks (containers and sandboxes that
// still have processes).
func (n *Node) runningTasks(ctx context.Context) ([]string, error) {
	out, err := n.Ctr(ctx, "tasks", "list", "--quiet")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}
