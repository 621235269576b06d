package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/draind/draind/daemon/nodeapi"
)

// ServeStatus serves GET /status on a unix socket that only root can use
// (mode 0600 in a 0700 directory): status shows every draining pod of the
// cluster, and the socket must not become a side door into it.
func ServeStatus(ctx context.Context, path string, status func() Status) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("creating status socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing stale status socket: %w", err)
	}
	// Bound under a temporary name and renamed once restricted: the
	// socket is never reachable at path with the umask's mode.
	tmp := fmt.Sprintf("%s.%d.tmp", path, os.Getpid())
	os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return fmt.Errorf("listening on status socket %s: %w", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false) // path is removed below
	if err := os.Chmod(tmp, 0o600); err != nil {
		l.Close()
		os.Remove(tmp)
		return fmt.Errorf("restricting status socket: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		os.Remove(tmp)
		return fmt.Errorf("placing status socket at %s: %w", path, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(status()) // the reader hung up
	})
	srv := nodeapi.BoundedServer(mux)
	defer os.Remove(path)
	return nodeapi.Serve(ctx, srv, l)
}

// FetchStatus asks a daemon for its status over its unix socket.
func FetchStatus(ctx context.Context, path string) (*Status, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
	}, Timeout: 10 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://draind/status", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking draind at %s (is it running, and are you root?): %w", path, err)
	}
	defer resp.Body.Close()
	var st Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("decoding status: %w", err)
	}
	return &st, nil
}
