package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s/inject"
)

// newOfflineCmd is the preStop client for images without curl: copy the
// draind binary into the pod (an init container and an emptyDir) and run
// `draind offline` from the preStop hook.
func newOfflineCmd() *cobra.Command {
	var host string
	var port int
	var wait, quiet, fallback time.Duration
	var retries int
	cmd := &cobra.Command{
		Use:   "offline",
		Short: "From inside a pod: drain this pod and wait until it is drained (a preStop hook)",
		Long: `Call the node's draind (POST http://$HOST_IP:9460/v1/offline) as this pod and
wait until it is drained. If draind cannot be reached at all, sleep
--fallback-sleep instead (the old preStop behaviour), so a pod never stops
faster than it would without draind.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if host == "" {
				host = os.Getenv("HOST_IP")
			}
			if host == "" {
				return errors.New("no node address: set HOST_IP from the downward API (status.hostIP) or pass --host")
			}
			switch {
			case wait <= 0:
				return fmt.Errorf("--wait=%s: must be positive", wait)
			case quiet < 0:
				return fmt.Errorf("--quiet=%s: must not be negative (0: draind's)", quiet)
			case fallback < 0:
				return fmt.Errorf("--fallback-sleep=%s: must not be negative", fallback)
			case retries < 0:
				return fmt.Errorf("--retries=%d: must not be negative", retries)
			case port <= 0 || port > 65535:
				return fmt.Errorf("--port=%d: not a port", port)
			}
			q := url.Values{"wait": {wait.String()}}
			if quiet > 0 {
				q.Set("quiet", quiet.String())
			}
			u := fmt.Sprintf("http://%s/v1/offline?%s", net.JoinHostPort(host, fmt.Sprint(port)), q.Encode())
			return offline(cmd.Context(), cmd.OutOrStdout(), u, wait, retries, fallback)
		},
	}
	f := cmd.Flags()
	f.StringVar(&host, "host", "", "the node's address (default $HOST_IP)")
	f.IntVar(&port, "port", nodeapi.DefaultPort, "draind's offline API port")
	f.DurationVar(&wait, "wait", inject.DefaultWait, "wait at most this long for the pod to be drained")
	f.DurationVar(&quiet, "quiet", 0, "drained = no new connection for this long (default: draind's)")
	f.IntVar(&retries, "retries", 3, "retries when the connection to draind breaks (a draind restart)")
	f.DurationVar(&fallback, "fallback-sleep", inject.DefaultFallbackSleep, "sleep this long if draind cannot be reached")
	return cmd
}

func offline(ctx context.Context, w io.Writer, u string, wait time.Duration, retries int, fallback time.Duration) error {
	client := &http.Client{Timeout: wait + 15*time.Second}
	deadline := time.Now().Add(wait)
	var lastErr error
	for attempt := 0; attempt <= retries && time.Now().Before(deadline.Add(time.Second)); attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			lastErr = err
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		fmt.Fprintf(w, "%s\n", body)
		switch resp.StatusCode {
		case http.StatusOK:
			return nil
		case http.StatusServiceUnavailable:
			// A draind that is stopping answers its waiters 503, and a new
			// one answers 503 until it is ready: a restart mid-wait, like
			// a broken connection. Giving up here would end the preStop
			// hook at once and stop the pod while no draind watches it.
			lastErr = fmt.Errorf("draind answered HTTP 503: %s", bytes.TrimSpace(body))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
			continue
		case http.StatusGatewayTimeout:
			return fmt.Errorf("not drained within %s (HTTP 504)", wait)
		default:
			return fmt.Errorf("draind answered HTTP %d", resp.StatusCode)
		}
	}
	fmt.Fprintf(w, "draind unreachable or not ready (%v): sleeping %s instead\n", lastErr, fallback)
	select {
	case <-ctx.Done():
	case <-time.After(fallback):
	}
	return nil
}
