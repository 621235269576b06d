// Command testapp is the one static binary inside the real-node bed's test
// images: the pod sandbox's pause process, the HTTP and DNS servers the
// rollouts replace, and the clients that measure them. One binary keeps the
// images small and the build to a single link.
//
//	testapp pause
//	testapp server -port 8080
//	testapp client -target 10.96.0.10:80 -interval 20ms [-keepalive -max-age 1s] -stats :9000
//	testapp dns-server -port 53 -name dns-test.draind.test -ready :8181
//	testapp dns-client -mode go|sendto -server 10.96.0.10:53 -name dns-test.draind.test -interval 20ms -timeout 1s -stats :9000
//
// Words are defined in the repository's docs/glossary.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testapp pause|server|client|dns-server|dns-client [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "pause":
		<-ctx.Done()
	case "server":
		err = server(ctx, os.Args[2:])
	case "client":
		err = client(ctx, os.Args[2:])
	case "dns-server":
		err = dnsServer(ctx, os.Args[2:])
	case "dns-client":
		err = dnsClient(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "testapp:", err)
		os.Exit(1)
	}
}

// server answers every request with the pod's name. On SIGTERM it stops
// accepting, lets requests in flight finish and closes idle keep-alive
// connections (http.Server.Shutdown), as a well-behaved server does.
func server(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	port := fs.Int("port", 8080, "listen port")
	if err := fs.Parse(args); err != nil {
		return err
	}
	name := os.Getenv("POD_NAME")
	if name == "" {
		name, _ = os.Hostname()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name+"\n") })
	srv := &http.Server{Addr: fmt.Sprintf(":%d", *port), Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	fmt.Printf("%s serving on :%d\n", time.Now().UTC().Format(time.RFC3339Nano), *port)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	fmt.Printf("%s SIGTERM: shutting down\n", time.Now().UTC().Format(time.RFC3339Nano))
	sctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	fmt.Printf("%s stopped\n", time.Now().UTC().Format(time.RFC3339Nano))
	return err
}

// Stats is what a client serves on /stats.
type Stats struct {
	Target string         `json:"target"`
	OK     int            `json:"ok"`
	Fails  map[string]int `json:"fails"`  // by error class
	By     map[string]int `json:"by"`     // successes by answering pod
	Errors []string       `json:"errors"` // the first failures, with their time
}

type counter struct {
	mu sync.Mutex
	st Stats
}

func (c *counter) ok(server string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.OK++
	c.st.By[server]++
}

func (c *counter) fail(class string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.Fails[class]++
	if len(c.st.Errors) < 50 {
		c.st.Errors = append(c.st.Errors, time.Now().UTC().Format(time.RFC3339Nano)+" "+class+": "+err.Error())
	}
}

func (c *counter) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	b, _ := json.Marshal(c.st)
	var out Stats
	json.Unmarshal(b, &out)
	return out
}

// client sends GET / to target every interval and counts the answers: with
// a new connection per request, or (-keepalive) over one connection it
// replaces after -max-age, the way servers cap keep-alive connections
// (nginx keepalive_requests, gRPC MaxConnectionAge). /stats on -stats
// serves the counts.
func client(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	target := fs.String("target", "", "host:port to send requests to")
	interval := fs.Duration("interval", 20*time.Millisecond, "time between requests")
	timeout := fs.Duration("timeout", 2*time.Second, "per-request timeout (connect included)")
	keepalive := fs.Bool("keepalive", false, "reuse one connection")
	maxAge := fs.Duration("max-age", time.Second, "with -keepalive: replace the connection after this long")
	statsAddr := fs.String("stats", ":9000", "listen address of /stats")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" {
		return errors.New("-target is required")
	}
	c := &counter{st: Stats{Target: *target, Fails: map[string]int{}, By: map[string]int{}}}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(c.snapshot())
	})
	go http.ListenAndServe(*statsAddr, mux)

	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: *timeout}).DialContext,
		DisableKeepAlives:   !*keepalive,
		MaxIdleConns:        1,
		MaxIdleConnsPerHost: 1,
	}
	hc := &http.Client{Transport: tr, Timeout: *timeout}
	url := "http://" + *target + "/"
	var connSince time.Time
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if *keepalive {
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
				GotConn: func(info httptrace.GotConnInfo) {
					if !info.Reused {
						connSince = time.Now()
					}
				},
			}))
			// Ask for the connection to be closed after this answer once
			// it is old enough; the next request opens a new one.
			if !connSince.IsZero() && time.Since(connSince) >= *maxAge {
				req.Close = true
				connSince = time.Time{}
			}
		}
		resp, err := hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.fail(classify(err), err)
			connSince = time.Time{}
			continue
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case err != nil:
			c.fail(classify(err), err)
		case resp.StatusCode != http.StatusOK:
			c.fail(fmt.Sprintf("http_%d", resp.StatusCode), fmt.Errorf("status %s", resp.Status))
		default:
			c.ok(strings.TrimSpace(string(body)))
		}
	}
}

// classify names an error's kind for the tables.
func classify(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	}
	return "other"
}
