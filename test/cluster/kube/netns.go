package kube

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The bed starts every child process from one OS thread that lives as long as
// the test process. Two reasons:
//   - Pdeathsig fires when the *thread* that forked the child exits. Go threads
//     only exit when a goroutine ends while locked to one (netns helpers do
//     that on purpose), so forking from an arbitrary thread could kill a
//     component in the middle of a test. Our thread never exits.
//   - A child inherits the network namespace of the forking thread, so this
//     thread can enter a node's namespace, start kube-proxy there, and come
//     back — without `ip netns exec`, which remounts /sys and needs a named
//     namespace.
type spawnerThread struct {
	reqs chan func()
}

var (
	spawnerOnce sync.Once
	spawner     *spawnerThread
)

func theSpawner() *spawnerThread {
	spawnerOnce.Do(func() {
		spawner = &spawnerThread{reqs: make(chan func())}
		go func() {
			runtime.LockOSThread() // never unlocked: the thread must outlive every child
			for f := range spawner.reqs {
				f()
			}
		}()
	})
	return spawner
}

func (s *spawnerThread) do(f func()) {
	done := make(chan struct{})
	s.reqs <- func() { defer close(done); f() }
	<-done
}

// inNetns runs f on the spawner thread while that thread is in the network
// namespace at nsPath ("" means the test's own namespace). Sockets created by
// f stay in that namespace; processes started by f run in it.
func inNetns(nsPath string, f func() error) error {
	var err error
	theSpawner().do(func() {
		if nsPath == "" {
			err = f()
			return
		}
		self, e := os.Open("/proc/thread-self/ns/net")
		if e != nil {
			err = fmt.Errorf("opening own network namespace: %w", e)
			return
		}
		defer self.Close()
		target, e := os.Open(nsPath)
		if e != nil {
			err = fmt.Errorf("opening network namespace %s: %w", nsPath, e)
			return
		}
		defer target.Close()
		if e := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); e != nil {
			err = fmt.Errorf("entering network namespace %s: %w", nsPath, e)
			return
		}
		err = f()
		if e := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); e != nil {
			// The thread is stuck in the wrong namespace, and every later child
			// would start there. Nothing sane can continue.
			panic(fmt.Sprintf("returning from network namespace %s: %v", nsPath, e))
		}
	})
	return err
}

// StartCmd starts cmd in the network namespace at nsPath ("" for the test's
// own), from the spawner thread: it is killed with SIGKILL if the test
// process dies, and it sees the host's mounts (unlike `ip netns exec`).
func StartCmd(nsPath string, cmd *exec.Cmd) error { return startCmd(nsPath, cmd) }

func startCmd(nsPath string, cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
	return inNetns(nsPath, cmd.Start)
}

// runCmd runs cmd to completion in the namespace at nsPath and returns its
// standard output.
func runCmd(ctx context.Context, nsPath string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	var errb limitedBuffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if err := startCmd(nsPath, cmd); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("running %s %v in %s: %w: %s", name, args, nsName(nsPath), err, errb.String())
	}
	return out.Bytes(), nil
}

func nsName(nsPath string) string {
	if nsPath == "" {
		return "the host namespace"
	}
	return nsPath
}

// listenInNetns opens a TCP listener inside the namespace at nsPath.
func listenInNetns(nsPath, addr string) (net.Listener, error) {
	var l net.Listener
	err := inNetns(nsPath, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on %s in %s: %w", addr, nsName(nsPath), err)
	}
	return l, nil
}

// dialInNetns opens a TCP connection from inside the namespace at nsPath.
// The dial runs on the spawner thread, so the socket belongs to that
// namespace; use it for loopback targets, where connect completes at once.
func dialInNetns(ctx context.Context, nsPath, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNetns(nsPath, func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dialing %s in %s: %w", addr, nsName(nsPath), err)
	}
	return c, nil
}
