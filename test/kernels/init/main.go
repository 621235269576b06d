// Command init is PID 1 of the kernel matrix's virtual machines: it mounts
// what the root-only tests need (proc, sys, cgroup2, bpffs, tmpfs), loads
// the kernel modules listed in /modules.list, runs each test binary named
// in /tests/run.list with PRIVILEGED_TESTS=1 and reports on the serial
// console, then powers the machine off. Built static (CGO_ENABLED=0) by
// TestKernelMatrix.
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Markers the host side parses.
const (
	markerResult = "DRAIND-KERNEL-RESULT"
	markerDone   = "DRAIND-KERNEL-DONE"
)

func main() {
	defer powerOff()
	for _, m := range []struct{ src, dst, fs, data string }{
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"devtmpfs", "/dev", "devtmpfs", ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
		{"bpf", "/sys/fs/bpf", "bpf", "mode=0700"},
		{"tmpfs", "/tmp", "tmpfs", ""},
		{"tmpfs", "/run", "tmpfs", ""},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, m.data); err != nil {
			fmt.Printf("mounting %s on %s: %v\n", m.fs, m.dst, err)
		}
	}
	var uts unix.Utsname
	unix.Uname(&uts)
	fmt.Printf("kernel %s\n", unix.ByteSliceToString(uts.Release[:]))
	loadModules("/modules.list")
	runTests("/tests/run.list")
	fmt.Println(markerDone)
}

// loadModules loads each module file listed, in order (dependencies first).
// Compressed modules are handed to the kernel to decompress.
func loadModules(list string) {
	paths := lines(list)
	fmt.Printf("loading %d modules\n", len(paths))
	for _, path := range paths {
		f, err := os.Open(path)
		if err != nil {
			fmt.Printf("module %s: %v\n", path, err)
			continue
		}
		flags := 0
		if strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".zst") {
			flags = unix.MODULE_INIT_COMPRESSED_FILE
		}
		if err := unix.FinitModule(int(f.Fd()), "", flags); err != nil && err != unix.EEXIST {
			fmt.Printf("module %s: %v\n", path, err)
		}
		f.Close()
	}
}

// runTests runs each line of list: a test binary and its arguments.
func runTests(list string) {
	for _, l := range lines(list) {
		args := strings.Fields(l)
		start := time.Now()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = "/tests"
		// Emulated without KVM the guest runs about ten times slower:
		// tests scale their bounds on elapsed time by it.
		cmd.Env = []string{"PRIVILEGED_TESTS=1", "PATH=/bin:/tests", "HOME=/tmp", "TMPDIR=/tmp", "DRAIND_TEST_SLOWDOWN=10"}
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		err := cmd.Run()
		code := 0
		if err != nil {
			code = -1
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			}
			fmt.Printf("%s: %v\n", args[0], err)
		}
		fmt.Printf("%s %s exit=%d seconds=%.1f\n", markerResult, args[0], code, time.Since(start).Seconds())
	}
}

func lines(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func powerOff() {
	os.Stdout.Sync()
	unix.Sync()
	unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
