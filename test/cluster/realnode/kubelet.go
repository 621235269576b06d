package realnode

import (
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/draind/draind/test/cluster/kube"
	"github.com/draind/draind/test/cluster/kubebin"
)

// kubeletConfig is the KubeletConfiguration. Checked on this kind of host
// (cgroup v1 "hybrid", no systemd, containerd 1.6): cgroup v1 must be
// allowed, the driver is cgroupfs (containerd 1.x cannot tell the kubelet
// its own), the kernel defaults are not enforced, and everything the kubelet
// writes lives in the run's directory. Eviction and image GC are off in
// effect: a test machine's disk must not evict the test. Pods' resolv.conf
// names ClusterDNSIP, which answers once a test starts ClusterDNS.
func (n *Node) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: %[2]s
tlsPrivateKeyFile: %[3]s
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[4]s
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix://%[5]s
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
protectKernelDefaults: false
podLogsDir: %[6]s
volumePluginDir: %[7]s
resolvConf: ""
clusterDNS: [%[9]s]
clusterDomain: %[10]s
enforceNodeAllocatable: [pods]
evictionHard:
  memory.available: 1Mi
  nodefs.available: 1%%
  nodefs.inodesFree: 1%%
  imagefs.available: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
shutdownGracePeriod: 0s
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
cgroupRoot: %[8]s
`, n.NodeIP, n.path("pki/kubelet.crt"), n.path("pki/kubelet.key"), n.Cluster.Path("pki/ca.crt"),
		n.ContainerdSocket, n.path("pod-logs"), n.path("volume-plugins"), n.CgroupRoot(), ClusterDNSIP, ClusterDomain)
}

// CgroupRoot is the kubelet's cgroup root: the pods' cgroups are in
// <hierarchy><CgroupRoot>/kubepods.
func (n *Node) CgroupRoot() string {
	if n.cgroupRoot != "" {
		return n.cgroupRoot
	}
	return "/"
}

func (n *Node) startKubelet(ctx context.Context) error {
	c := n.Cluster
	for _, d := range []string{"pki", "kubelet", "pod-logs", "volume-plugins"} {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return fmt.Errorf("creating %s: %w", d, err)
		}
	}
	// The kubelet's serving certificate, signed by the cluster CA, for the
	// apiserver's exec/logs/port-forward connections to it.
	serving, err := c.CA.Issue("system:node:"+n.Name, []string{"system:nodes"}, x509.ExtKeyUsageServerAuth, []string{n.NodeIP.String(), n.Name})
	if err != nil {
		return err
	}
	if _, _, err := serving.WriteFiles(n.path("pki"), "kubelet"); err != nil {
		return err
	}
	// The node's identity: the Node authorizer gives it exactly a kubelet's
	// rights. It reaches the apiserver over the node's link.
	cfg, err := c.UserConfig("system:node:"+n.Name, "system:nodes")
	if err != nil {
		return err
	}
	cfg.Host = n.APIServerURL()
	if err := kube.WriteKubeconfig(n.path("kubelet.kubeconfig"), cfg); err != nil {
		return err
	}
	if err := os.WriteFile(n.path("kubelet-config.yaml"), []byte(n.kubeletConfig()), 0o644); err != nil {
		return fmt.Errorf("writing the kubelet's config: %w", err)
	}
	n.kubelet, err = n.startProc("kubelet", c.Binaries().Path(kubebin.Kubelet),
		"--config="+n.path("kubelet-config.yaml"),
		"--kubeconfig="+n.path("kubelet.kubeconfig"),
		"--root-dir="+n.path("kubelet"),
		"--cert-dir="+n.path("pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.NodeIP.String(),
		"--v=2",
	)
	if err != nil {
		return err
	}
	// Ready: registered, and the nodelifecycle controller has removed the
	// not-ready taint (pods are scheduled only then).
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = kube.Poll(wctx, 200*time.Millisecond, func() (bool, error) {
		if err := n.kubelet.deadErr(); err != nil {
			return false, err
		}
		node, err := c.Admin.CoreV1().Nodes().Get(wctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, t := range node.Spec.Taints {
			if t.Key == corev1.TaintNodeNotReady {
				return false, nil
			}
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for node %s to be Ready and untainted (kubelet log: %s): %w", n.Name, n.kubelet.logPath, err)
	}
	return nil
}
