package realnode

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/bpf"
)

// What a real node changes on the host, and how the bed undoes it. The
// kubelet and containerd share the host's mount namespace, cgroup trees and
// a few global sysctls with everything else on the machine; a run records
// what it is about to change in its state file before changing it, so Stop
// — or the next Start, after a crash — restores exactly that.

// lockName serialises real nodes on a host: they would share the kubepods
// cgroups, /sys/fs/bpf/draind and /var/lib/kubelet/device-plugins. It is an
// abstract unix socket: it leaves no file behind and the kernel releases it
// when its holder dies.
const lockName = "@draind-realnode-lock"

// dirPrefix names a run's directory under os.TempDir(); stateFile in it
// records what the run changed on the host.
const (
	dirPrefix = "draind-realnode-"
	stateFile = "state.json"
)

// kubeletSysctls are the host-wide sysctls the kubelet sets at start
// (kernel.panic_on_oops 0→1, vm.overcommit_memory 0→1, kernel.panic →10).
var kubeletSysctls = []string{"kernel/panic_on_oops", "vm/overcommit_memory", "kernel/panic"}

// createdCandidates are host paths the kubelet, containerd or the CNI
// plugins create whatever their configuration says; the run removes those
// that did not exist before it.
var createdCandidates = []string{
	"/var/lib/kubelet",    // device-plugins socket (hard-coded)
	"/var/log/containers", // the kubelet's symlinks to container logs (hard-coded)
	"/var/log/pods",
	"/var/lib/cni",    // libcni's result cache
	"/run/containerd", // shim sockets under /run/containerd/s (hard-coded)
	"/var/lib/containerd",
	"/opt/containerd",
	"/etc/cni",
	"/opt/cni",
}

// hostState is the state file: what this run changed on the host.
type hostState struct {
	OwnerPID     int               `json:"owner_pid"`
	Dir          string            `json:"dir"`
	Netns        string            `json:"netns,omitempty"`
	HostVeth     string            `json:"host_veth,omitempty"`
	Sysctls      map[string]string `json:"sysctls,omitempty"` // original values
	BPFFSMounted bool              `json:"bpffs_mounted,omitempty"`
	Created      []string          `json:"created,omitempty"` // paths that did not exist before
	// A multi-node bed's other namespaces (nodes and the fabric), its
	// kubelets' cgroup roots (created in every hierarchy) and draind's
	// per-node pin directories.
	MoreNetns   []string `json:"more_netns,omitempty"`
	CgroupRoots []string `json:"cgroup_roots,omitempty"`
	PinDirs     []string `json:"pin_dirs,omitempty"`
}

func (s *hostState) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the bed's state: %w", err)
	}
	tmp := filepath.Join(s.Dir, stateFile+".tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the bed's state: %w", err)
	}
	return os.Rename(tmp, filepath.Join(s.Dir, stateFile))
}

// takeLock takes the host-wide real-node lock, waiting up to wait for a
// concurrent run to finish.
func takeLock(wait time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := net.Listen("unix", lockName)
		if err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("taking the real-node lock %s (another real node runs on this host?): %w", lockName, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// cleanLeftovers undoes what crashed earlier runs left: their processes
// (containerd shims outlive a killed test), mounts, network namespace,
// pods' cgroups, sysctls, bpffs mount and created paths. Called with the
// lock held, so no live run owns any of it.
func cleanLeftovers(log *slog.Logger) error {
	// The kubepods cgroups below are removed as leftovers: make sure no
	// other kubelet (a real node's own) owns them.
	if pid, cmdline := foreignKubelet(); pid > 0 {
		return fmt.Errorf("a kubelet that is not the bed's runs on this host (pid %d: %s): a real node here would share its kubepods cgroups", pid, cmdline)
	}
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	var errs []error
	for _, d := range dirs {
		var st hostState
		if b, err := os.ReadFile(filepath.Join(d, stateFile)); err == nil {
			if json.Unmarshal(b, &st) != nil {
				st = hostState{}
			}
		}
		if st.OwnerPID > 0 && processAlive(st.OwnerPID) && st.OwnerPID != os.Getpid() {
			continue
		}
		st.Dir = d
		log.Info("removing a crashed real-node run's leftovers", "dir", d, "owner_pid", st.OwnerPID)
		errs = append(errs, st.undo(log))
	}
	// Pods' cgroups can only be the kubelet's of some run of this bed.
	errs = append(errs, removeKubepods(log))
	return errors.Join(errs...)
}

// foreignKubelet finds a running kubelet whose command line does not name
// a directory of this bed.
func foreignKubelet() (int, string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(b) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(argv[0]) == "kubelet" && !strings.Contains(string(b), dirPrefix) {
			return pid, strings.Join(argv, " ")
		}
	}
	return 0, ""
}

func processAlive(pid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
	return err == nil
}

// undo reverses everything st records, in teardown order: processes, pods'
// cgroups, mounts under the run's directory, the network namespace,
// sysctls, bpffs, created paths, the directory.
func (st *hostState) undo(log *slog.Logger) error {
	var errs []error
	if st.Dir != "" {
		killReferencing(log, st.Dir)
	}
	errs = append(errs, removeKubepods(log))
	for _, r := range st.CgroupRoots {
		errs = append(errs, removeCgroupTree(log, r))
	}
	if st.Dir != "" {
		errs = append(errs, unmountUnder(st.Dir))
	}
	for _, ns := range append([]string{st.Netns}, st.MoreNetns...) {
		if ns == "" {
			continue
		}
		if err := deleteNetns(ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, d := range st.PinDirs {
		if _, err := os.Stat(d); err == nil {
			errs = append(errs, bpf.Remove(d))
		}
	}
	names := make([]string, 0, len(st.Sysctls))
	for k := range st.Sysctls {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(st.Sysctls[k]), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restoring sysctl %s: %w", k, err))
		}
	}
	if st.BPFFSMounted {
		if isMountOf("/sys/fs/bpf", "bpf") {
			if err := unix.Unmount("/sys/fs/bpf", unix.MNT_DETACH); err != nil {
				errs = append(errs, fmt.Errorf("unmounting the bpffs the bed mounted at /sys/fs/bpf: %w", err))
			}
		}
	}
	for i := len(st.Created) - 1; i >= 0; i-- {
		p := st.Created[i]
		if err := unmountUnder(p); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	if st.Dir != "" {
		if err := os.RemoveAll(st.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", st.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// killReferencing SIGKILLs every process whose command line or executable
// mentions dir: the run's containerd, its shims (their -address is the
// run's socket) and kubelet. The run's directory name is unique, so no
// other process matches.
func killReferencing(log *slog.Logger, dir string) {
	self := os.Getpid()
	for range 3 {
		ents, _ := os.ReadDir("/proc")
		killed := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == self {
				continue
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil || !strings.Contains(string(b), dir) {
				continue
			}
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				killed++
				log.Debug("killed a leftover process", "pid", pid, "cmdline", strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		if killed == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cgroupMounts returns the mount points of every cgroup hierarchy (v1 and
// v2) from /proc/self/mountinfo.
func cgroupMounts() []string {
	var out []string
	for _, m := range mounts() {
		if m.fstype == "cgroup" || m.fstype == "cgroup2" {
			out = append(out, m.point)
		}
	}
	return out
}

// removeKubepods kills what still runs in the kubelet's "kubepods" cgroup
// of every hierarchy (containers of a crashed run) and removes the tree,
// leaves first: the kubelet leaves it behind in every hierarchy.
func removeKubepods(log *slog.Logger) error { return removeCgroupTree(log, "kubepods") }

// removeCgroupTree removes the cgroup name (relative to each hierarchy's
// root) and everything below it in every hierarchy, leaves first, killing
// what still runs there.
func removeCgroupTree(log *slog.Logger, name string) error {
	var errs []error
	for _, root := range cgroupMounts() {
		top := filepath.Join(root, name)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first.
		sort.Slice(dirs, func(i, j int) bool { return strings.Count(dirs[i], "/") > strings.Count(dirs[j], "/") })
		for _, d := range dirs {
			if err := rmdirCgroup(log, d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func rmdirCgroup(log *slog.Logger, dir string) error {
	var last error
	for range 50 {
		last = unix.Rmdir(dir)
		if last == nil || errors.Is(last, unix.ENOENT) {
			return nil
		}
		// Busy: kill its processes (only the bed's containers live here).
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs")); err == nil {
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	log.Warn("could not remove a pods cgroup", "cgroup", dir, "err", last)
	return fmt.Errorf("removing cgroup %s: %w", dir, last)
}

type mountEntry struct{ point, fstype string }

func mounts() []mountEntry {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []mountEntry
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		for i, fl := range fields {
			if fl == "-" && i+1 < len(fields) && len(fields) > 4 {
				out = append(out, mountEntry{point: unescape(fields[4]), fstype: fields[i+1]})
				break
			}
		}
	}
	return out
}

func unescape(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

func isMountOf(point, fstype string) bool {
	for _, m := range mounts() {
		if m.point == point && m.fstype == fstype {
			return true
		}
	}
	return false
}

// unmountUnder detaches every mount at or below dir, deepest first (pods'
// volumes, containerd's rootfs and shm mounts, sandbox netns files, the
// kubelet's self bind mount of its root directory).
func unmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	var errs []error
	for range 5 {
		var points []string
		for _, m := range mounts() {
			if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
				points = append(points, m.point)
			}
		}
		if len(points) == 0 {
			return nil
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		errs = errs[:0]
		for _, p := range points {
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

// readSysctl returns a sysctl's value as written in /proc/sys.
func readSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// mountBPFFS mounts a bpffs at /sys/fs/bpf if none is there, as systemd
// does on a real node, with shared propagation (systemd's default, and what
// the DaemonSet's HostToContainer mount of it requires). It reports whether
// it mounted one.
func mountBPFFS() (bool, error) {
	if isMountOf("/sys/fs/bpf", "bpf") {
		return false, nil
	}
	if err := unix.Mount("bpffs", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return false, fmt.Errorf("mounting bpffs at /sys/fs/bpf: %w", err)
	}
	if err := unix.Mount("", "/sys/fs/bpf", "", unix.MS_SHARED, ""); err != nil {
		unix.Unmount("/sys/fs/bpf", unix.MNT_DETACH)
		return false, fmt.Errorf("making /sys/fs/bpf a shared mount: %w", err)
	}
	return true, nil
}
