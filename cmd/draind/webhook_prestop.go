package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/k8s/inject"
)

// thenOptions is the preStop handler a pod had before the webhook injected
// draind: `draind offline` runs it after the drain, so one exec hook does
// both (the kubelet runs exactly one preStop handler per container).
type thenOptions struct {
	exec    bool
	httpGet string
	headers []string
	sleep   time.Duration
}

// withThen gives `draind offline` the --then-* flags and bounds its draind
// part: the drain, its retries and the fallback sleep end at the latest
// --wait + --fallback-sleep after the hook started (the budget the webhook
// adds to the grace period); then the original handler runs, whatever the
// drain's outcome.
func withThen(cmd *cobra.Command) *cobra.Command {
	var o thenOptions
	f := cmd.Flags()
	f.BoolVar(&o.exec, "then-exec", false, "after the drain, replace this process with the command given after -- (an exec preStop handler kept by the webhook)")
	f.StringVar(&o.httpGet, "then-http-get", "", "after the drain, GET this URL as the kubelet runs an httpGet handler; an empty host means $"+inject.PodIPEnv+" (the pod IP)")
	f.StringArrayVar(&o.headers, "then-http-header", nil, `header "Name: value" of --then-http-get (repeatable)`)
	f.DurationVar(&o.sleep, "then-sleep", 0, "after the drain, sleep this long (a sleep preStop handler)")
	cmd.Use = "offline [flags] [--then-exec -- COMMAND [ARG...]]"
	cmd.Args = func(cmd *cobra.Command, args []string) error {
		if o.exec && (len(args) == 0 || cmd.ArgsLenAtDash() != 0) {
			return errors.New("--then-exec needs the command after --")
		}
		if !o.exec && len(args) > 0 {
			return fmt.Errorf("unexpected arguments %q (a command to run after the drain needs --then-exec --)", args)
		}
		return nil
	}
	drain := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		then, err := o.handler(args)
		if err != nil {
			return err
		}
		wait, _ := cmd.Flags().GetDuration("wait")
		fallback, _ := cmd.Flags().GetDuration("fallback-sleep")
		budget := wait + fallback
		parent := cmd.Context()
		ctx, cancel := context.WithTimeout(parent, budget)
		cmd.SetContext(ctx)
		drainErr := drain(cmd, nil)
		if ctx.Err() != nil && parent.Err() == nil {
			drainErr = fmt.Errorf("draining: stopped at the budget of --wait + --fallback-sleep (%s)", budget)
		}
		cancel()
		cmd.SetContext(parent)
		if then == nil {
			return drainErr
		}
		if drainErr != nil {
			// The original handler still runs: it may be what stops the
			// application gracefully.
			fmt.Fprintf(cmd.ErrOrStderr(), "draind: %v; running the pod's own preStop handler now\n", drainErr)
		}
		if err := then(cmd.Context(), cmd.OutOrStdout()); err != nil {
			return errors.Join(drainErr, err)
		}
		return drainErr
	}
	return cmd
}

// execve replaces the process; tests substitute it.
var execve = syscall.Exec

// handler validates the --then-* flags (before anything is drained) and
// returns the handler to run after the drain, or nil.
func (o *thenOptions) handler(args []string) (func(context.Context, io.Writer) error, error) {
	n := 0
	for _, set := range []bool{o.exec, o.httpGet != "", o.sleep > 0} {
		if set {
			n++
		}
	}
	if n > 1 {
		return nil, errors.New("--then-exec, --then-http-get and --then-sleep exclude each other (a preStop has one handler)")
	}
	if len(o.headers) > 0 && o.httpGet == "" {
		return nil, errors.New("--then-http-header needs --then-http-get")
	}
	switch {
	case o.exec:
		return func(context.Context, io.Writer) error {
			path, err := exec.LookPath(args[0])
			if err != nil {
				return fmt.Errorf("running the pod's preStop command %q: %w", args[0], err)
			}
			// Replacing the process: the command's exit status is the
			// hook's, as if the kubelet had run it itself.
			if err := execve(path, args, os.Environ()); err != nil {
				return fmt.Errorf("running the pod's preStop command %s: %w", path, err)
			}
			return nil
		}, nil
	case o.httpGet != "":
		req, err := thenRequest(o.httpGet, o.headers, os.Getenv(inject.PodIPEnv))
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context, w io.Writer) error { return thenGet(ctx, w, req) }, nil
	case o.sleep > 0:
		return func(ctx context.Context, _ io.Writer) error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(o.sleep):
				return nil
			}
		}, nil
	}
	return nil, nil
}

// thenRequest builds the GET the kubelet would send for an httpGet
// handler: to the URL's host, or to the pod IP when it has none.
func thenRequest(raw string, headers []string, podIP string) (*http.Request, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("--then-http-get %q: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("--then-http-get %q: scheme must be http or https", raw)
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("--then-http-get %q: no port", raw)
	}
	if u.Hostname() == "" {
		if podIP == "" {
			return nil, fmt.Errorf("--then-http-get %q has no host and $%s is empty: set it from status.podIP", raw, inject.PodIPEnv)
		}
		u.Host = net.JoinHostPort(podIP, u.Port())
	}
	req, err := http.NewRequest(http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("--then-http-get %q: %w", raw, err)
	}
	req.Header.Set("User-Agent", "draind-offline/"+version)
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return nil, fmt.Errorf("--then-http-header %q: want \"Name: value\"", h)
		}
		value = strings.TrimSpace(value)
		if strings.EqualFold(name, "Host") {
			req.Host = value
			continue
		}
		req.Header.Add(name, value)
	}
	return req, nil
}

// thenGet sends the handler's request as the kubelet does: no proxy, no
// certificate verification for https, and a transport error is the
// handler's failure; the answer's status is printed, not judged (the
// kubelet does not judge it either).
func thenGet(ctx context.Context, w io.Writer, req *http.Request) error {
	client := &http.Client{Transport: &http.Transport{
		Proxy:             nil,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet's httpGet handlers do not verify either
		DisableKeepAlives: true,
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("running the pod's preStop GET %s: %w", req.URL, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	fmt.Fprintf(w, "preStop GET %s: HTTP %d\n", req.URL, resp.StatusCode)
	return nil
}
