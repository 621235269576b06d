package headline

import (
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

// forker is one OS thread, locked for the life of the process, that starts
// every draind process. A child started with Pdeathsig is killed when the
// thread that forked it exits, and Go ends threads whose goroutine exits
// locked (namespace switching does that): a thread that never exits keeps
// the daemons alive exactly as long as this process. It also enters a
// node's network namespace for the fork and comes back, so the child starts
// in the node's namespace with the host's mounts (`ip netns exec` would
// remount /sys, hiding the cgroup2 mount draind attaches to).
var forker = sync.OnceValue(func() chan<- func() {
	ch := make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range ch {
			f()
		}
	}()
	return ch
})

// startInNetns starts cmd inside the network namespace at nsPath.
func startInNetns(nsPath string, cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	cmd.SysProcAttr.Setpgid = true
	done := make(chan error, 1)
	forker() <- func() {
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- fmt.Errorf("opening own network namespace: %w", err)
			return
		}
		defer self.Close()
		target, err := os.Open(nsPath)
		if err != nil {
			done <- fmt.Errorf("opening network namespace %s: %w", nsPath, err)
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- fmt.Errorf("entering network namespace %s: %w", nsPath, err)
			return
		}
		err = cmd.Start()
		if serr := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Every later child would start in the wrong namespace.
			panic(fmt.Sprintf("returning from network namespace %s: %v", nsPath, serr))
		}
		done <- err
	}
	return <-done
}

// netnsDialer dials from inside a network namespace (each dial runs on a
// thread switched into it; the socket stays there).
type netnsDialer struct {
	do func(func() error) error
}

func (d netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := d.do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
