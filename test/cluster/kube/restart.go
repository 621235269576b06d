package kube

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/draind/draind/test/cluster/kubebin"
)

// An API server outage, for fault tests: StopAPIServer kills kube-apiserver
// and StartAPIServer runs it again with the same flags — the same port,
// certificates and etcd (which stays up, so every object survives) — the
// way a control-plane node reboots under a cluster's feet. Clients (the
// admin client, every kube-proxy and draind behind their relays) see their
// connections reset and must reconnect by themselves.
//
// Neither may run concurrently with Healthy, LogTails or a wait that checks
// the components (WaitRules, WaitProxyQuiet, WaitServiceAccount): they read
// the process being replaced. During the outage Healthy reports the
// apiserver as exited, which is the truth.

// apiserverRestarts numbers the log files of restarted apiservers (the first
// run's log is kept).
var apiserverRestarts atomic.Int64

// StopAPIServer kills kube-apiserver with SIGKILL (an outage, not a
// graceful shutdown: no request is drained, no connection closed politely)
// and returns once it has exited.
func (c *Cluster) StopAPIServer() error {
	p := c.apiserver
	if p == nil {
		return errors.New("stopping kube-apiserver: it was never started")
	}
	if gone, _ := p.exited(); gone {
		return fmt.Errorf("stopping kube-apiserver: it had already exited; last log lines:\n%s", p.tail(20))
	}
	// The process group: kube-apiserver starts no children, but a kill of
	// the group is what stop falls back to as well.
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing kube-apiserver (pid %d): %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("kube-apiserver (pid %d) did not exit within 10s of SIGKILL", p.cmd.Process.Pid)
	}
	p.logFile.Close()
	c.log.Info("kube-apiserver stopped (SIGKILL)", "addr", c.apiserverAddr)
	return nil
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// arguments of the previous run (so on the same address), logging to a new
// file next to the first one. It returns when /readyz first answered ok,
// polled every readyPoll: ready is the time of that answer, late by at most
// one poll interval.
func (c *Cluster) StartAPIServer(ctx context.Context, readyPoll time.Duration) (ready time.Time, err error) {
	old := c.apiserver
	if old == nil {
		return time.Time{}, errors.New("starting kube-apiserver again: it was never started")
	}
	if gone, _ := old.exited(); !gone {
		return time.Time{}, errors.New("starting kube-apiserver again: it is still running (StopAPIServer first)")
	}
	logPath := filepath.Join(c.Dir, "kube-apiserver.restart-"+strconv.FormatInt(apiserverRestarts.Add(1), 10)+".log")
	p, err := startProcess(c.log, kubebin.APIServer, "", logPath, old.cmd.Path, old.cmd.Args[1:]...)
	if err != nil {
		return time.Time{}, err
	}
	c.apiserver = p
	if readyPoll <= 0 {
		readyPoll = 50 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	var last error
	err = Poll(ctx, readyPoll, func() (bool, error) {
		if err := p.deadErr(); err != nil {
			return false, err
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		body, err := c.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		if err != nil {
			last = fmt.Errorf("%w: %s", err, body)
			return false, nil
		}
		if string(body) != "ok" {
			return false, nil
		}
		ready = time.Now()
		return true, nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("waiting for the restarted kube-apiserver's /readyz (last answer: %v): %w", last, err)
	}
	c.log.Info("kube-apiserver ready again", "addr", c.apiserverAddr)
	return ready, nil
}

// RestartControllerManager stops kube-controller-manager and starts it
// again with the same flags (the same secure port), logging to a new file.
// It returns when it is healthy again.
//
// A fault test that restarts the API server calls it once the test is
// over: the bed's controllers are not under test, and they come out of an
// outage slowly. Their client-go reflectors back off (doubling, up to 30 s
// with jitter) while the API server is down, and the EndpointSlice
// controller skips a pod whose Node its cache lacks, retrying the Service
// with a doubling backoff: the next test's Service could wait over a
// minute for its endpoints (CI, 2026-11-30: none in 60 s). A fresh
// controller manager lists everything at once.
func (c *Cluster) RestartControllerManager(ctx context.Context) error {
	old := c.kcm
	if old == nil {
		return errors.New("restarting kube-controller-manager: it was never started")
	}
	if err := old.stop(stopGrace); err != nil {
		return err
	}
	logPath := filepath.Join(c.Dir, "kube-controller-manager.restart-"+strconv.FormatInt(kcmRestarts.Add(1), 10)+".log")
	p, err := startProcess(c.log, kubebin.ControllerManager, "", logPath, old.cmd.Path, old.cmd.Args[1:]...)
	if err != nil {
		return err
	}
	c.kcm = p
	if err := c.waitControllerManager(ctx); err != nil {
		return err
	}
	c.log.Info("kube-controller-manager restarted")
	return nil
}

// kcmRestarts numbers the log files of restarted controller managers.
var kcmRestarts atomic.Int64
