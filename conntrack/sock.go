package conntrack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Socket options from linux/netlink.h not named by x/sys/unix on every arch.
const (
	solNetlink    = 270 // SOL_NETLINK
	netlinkCapAck = 10  // NETLINK_CAP_ACK: errors carry the header only
)

// recvBufSize is larger than any datagram the kernel builds for us: dump
// skbs are capped near 32 KiB (netlink_recvmsg's max_recvmsg_len), errors and
// acks are tiny.
const recvBufSize = 64 << 10

// nlSock is a NETLINK_NETFILTER socket bound to the network namespace it was
// created in. It is non-blocking and registered with Go's poller, so a read
// can be interrupted by a deadline (context cancellation) without a thread
// stuck in recvmsg.
type nlSock struct {
	f   *os.File
	rc  syscall.RawConn
	seq uint32
	rb  []byte // receive buffer, reused
	wb  []byte // send buffer, reused
}

// openSock creates the socket in the calling thread's network namespace.
func openSock() (*nlSock, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("creating netfilter netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("binding netfilter netlink socket: %w", err)
	}
	// Errors for a delete batch then cost 36 bytes each instead of echoing
	// the whole request; best effort (old kernels lack it).
	_ = unix.SetsockoptInt(fd, solNetlink, netlinkCapAck, 1)
	// A batch can draw one error per message (ENOENT when flows vanished on
	// their own); make room so none is dropped. SO_RCVBUFFORCE needs
	// CAP_NET_ADMIN, which every caller of this package has.
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20); err != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	f := os.NewFile(uintptr(fd), "netfilter-netlink")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("wrapping netfilter netlink socket: %w", err)
	}
	return &nlSock{f: f, rc: rc, seq: uint32(time.Now().UnixNano()), rb: make([]byte, recvBufSize)}, nil
}

func (s *nlSock) close() error { return s.f.Close() }

func (s *nlSock) nextSeq() uint32 {
	s.seq++
	return s.seq
}

// send writes b (one or more netlink messages) in a single sendmsg. The
// kernel processes every message of the datagram before sendmsg returns.
func (s *nlSock) send(b []byte) error {
	var serr error
	err := s.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// recv reads one datagram into the socket's buffer and returns it; the
// slice is valid until the next recv. It waits until data arrives or ctx
// is done.
func (s *nlSock) recv(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = s.f.SetReadDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() {
			// The deadline was (or is being) set: clear it for the next call.
			_ = s.f.SetReadDeadline(time.Time{})
		}
	}()
	var (
		n     int
		flags int
		rerr  error
	)
	err := s.rc.Read(func(fd uintptr) bool {
		n, _, flags, _, rerr = unix.Recvmsg(int(fd), s.rb, nil, 0)
		return rerr != unix.EAGAIN
	})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("netlink datagram truncated at %d bytes", n)
	}
	return s.rb[:n], nil
}

// inNetNS runs fn on a dedicated OS thread that has joined the network
// namespace ns. Sockets fn creates stay in ns after the thread leaves it.
// If the thread cannot return to its original namespace it is left locked,
// so the runtime discards it instead of running other goroutines there.
//
// A nil ns means the calling thread's namespace: fn runs right there.
func inNetNS(ns *os.File, fn func() error) error {
	if ns == nil {
		return fn()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("opening current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering network namespace %s: %w", ns.Name(), err)
			return
		}
		ferr := fn()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			done <- errors.Join(ferr, fmt.Errorf("returning from network namespace %s: %w", ns.Name(), err))
			return // thread stays locked and dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- ferr
	}()
	return <-done
}

// request sends one message that carries NLM_F_ACK and waits for the
// kernel's answer to seq, returning its error code (0 = success).
func (s *nlSock) request(ctx context.Context, b []byte, seq uint32) (unix.Errno, error) {
	if err := s.send(b); err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, replyTimeout)
	defer cancel()
	for {
		buf, err := s.recv(ctx)
		if err != nil {
			return 0, err
		}
		it := msgIter{b: buf}
		for it.next() {
			if it.m.typ == unix.NLMSG_ERROR && it.m.seq == seq {
				return errnoOf(it.m.payload)
			}
		}
		if it.err != nil {
			return 0, it.err
		}
	}
}
