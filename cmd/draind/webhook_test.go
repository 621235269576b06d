package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"

	"github.com/draind/draind/k8s"
	"github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/k8s/inject/selfcert"
	"github.com/draind/draind/k8s/inject/webhook"
)

// TestWebhookServesFiles runs `draind webhook --cert-dir` (cert-manager's
// way): the server answers over TLS with the files' certificate and picks
// up new files without a restart.
func TestWebhookServesFiles(t *testing.T) {
	dir := t.TempDir()
	cc := selfcert.Config{DNSNames: []string{"localhost"}, CAValidity: time.Hour, CertValidity: time.Hour}
	write := func(serial int) []byte {
		data, _, err := selfcert.Plan(nil, nil, time.Now(), cc)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{selfcert.KeyCert, selfcert.KeyKey} {
			if err := os.WriteFile(filepath.Join(dir, k+".tmp"), data[k], 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, k := range []string{selfcert.KeyKey, selfcert.KeyCert} {
			if err := os.Rename(filepath.Join(dir, k+".tmp"), filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
		return data[selfcert.KeyBundle]
	}
	ca1 := write(1)
	port := freeLoopbackPort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	cmd := newRootCmd()
	cmd.SetArgs([]string{"webhook", "--listen=127.0.0.1:" + port, "--health-listen=", "--cert-dir=" + dir, "--cert-check-interval=100ms",
		"--image=ghcr.io/draind/draind:v0.2.0", "--shutdown-delay=0", "--log-format=text", "--log-level=error"})
	go func() { done <- cmd.ExecuteContext(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("webhook: %v", err)
		}
	}()
	review := []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1",
		"kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"shop",
		"object":{"apiVersion":"v1","kind":"Pod","spec":{"containers":[{"name":"a"}]}}}}`)
	call := func(bundle []byte) error {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(bundle)
		c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "localhost"}}}
		defer c.CloseIdleConnections()
		resp, err := c.Post("https://127.0.0.1:"+port+webhook.PathNamespace, "application/json", bytes.NewReader(review))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || out.Response == nil || out.Response.Patch == nil {
			t.Fatalf("answer %+v: %v", out.Response, err)
		}
		return nil
	}
	waitFor(t, func() bool { return call(ca1) == nil })
	ca2 := write(2)
	waitFor(t, func() bool { return call(ca2) == nil })
	if err := call(ca1); err == nil {
		t.Error("still serving the first certificate after the files changed")
	}
}

func freeLoopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p
}

// waitFor polls cond (the signal) for up to 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// daemon reads.
func TestSteerOnDeleteKeyIsTheDaemons(t *testing.T) {
	if inject.KeySteerOnDelete != k8s.AnnotationSteerOnDelete {
		t.Errorf("webhook writes %q, draind reads %q", inject.KeySteerOnDelete, k8s.AnnotationSteerOnDelete)
	}
}
