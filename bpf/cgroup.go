package bpf

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNoCgroup2 is returned when no cgroup v2 hierarchy is mounted.
var ErrNoCgroup2 = fmt.Errorf("cgroup v2 not found (no cgroup2 mount in /proc/self/mountinfo): %w", ebpf.ErrNotSupported)

// Cgroup2Mount returns where the unified (v2) cgroup hierarchy is mounted:
// /sys/fs/cgroup on pure v2 hosts, /sys/fs/cgroup/unified on hybrid ones.
func Cgroup2Mount() (string, error) {
	return cgroup2MountFrom("/proc/self/mountinfo")
}

func cgroup2MountFrom(mountinfo string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		// 41 23 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
		fields := strings.Fields(s.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fields[sep+1] == "cgroup2" {
			return unescapeMount(fields[4]), nil
		}
	}
	if err := s.Err(); err != nil {
		return "", fmt.Errorf("reading mounts: %w", err)
	}
	return "", ErrNoCgroup2
}

// unescapeMount undoes mountinfo's octal escaping of spaces and friends.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// FindPodsCgroup returns the cgroup the kubelet puts pods under, below the
// cgroup2 root: kubepods.slice (systemd driver) or kubepods (cgroupfs
// driver). Hooking there, not at the root, keeps the kubelet's own probes of
// a draining pod (and everything else on the host) out of steering.
func FindPodsCgroup(root string) (string, error) {
	for _, name := range []string{"kubepods.slice", "kubepods"} {
		p := filepath.Join(root, name)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p, nil
		}
	}
	return "", fmt.Errorf("finding the pods cgroup: neither kubepods.slice nor kubepods under %s (set the cgroup path explicitly)", root)
}

// CgroupID returns the id the kernel reports for a cgroup (its inode).
func CgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat cgroup %s: %w", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err != nil {
		return 0, fmt.Errorf("statfs cgroup %s: %w", path, err)
	}
	if fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("%s is not on a cgroup v2 filesystem: %w", path, errors.ErrUnsupported)
	}
	return st.Ino, nil
}
