package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/draind/draind/k8s/inject/selfcert"
)

// CertSource hands the TLS server its current certificate.
type CertSource interface {
	// Run keeps the certificate current until ctx ends.
	Run(ctx context.Context) error
	// Current is the certificate to serve; nil until one is loaded.
	Current() *tls.Certificate
}

// CertReconciler keeps the self-managed TLS material: it reads the Secret
// and the webhook configuration, lets selfcert.Plan decide, writes the
// Secret (optimistic concurrency: a replica that loses the race reads the
// winner's result next pass), publishes the CA bundle into every entry of
// the webhook configuration, and serves the Secret's certificate. Its RBAC
// is exactly that: get/update of one Secret, get/patch of one
// MutatingWebhookConfiguration.
type CertReconciler struct {
	Client        kubernetes.Interface
	Namespace     string // of the Secret
	Secret        string // holds the CA and the serving certificate; it must exist
	WebhookConfig string // the MutatingWebhookConfiguration whose caBundle is kept
	Config        selfcert.Config
	Interval      time.Duration // between passes
	Now           func() time.Time
	Log           *slog.Logger

	cert   atomic.Pointer[tls.Certificate]
	loaded []byte // PEM of the loaded certificate; only run's goroutine touches it
}

var _ CertSource = (*CertReconciler)(nil)

func (r *CertReconciler) Current() *tls.Certificate { return r.cert.Load() }

// Run reconciles every interval, and after a failure again within a
// second or two (growing to the interval), until ctx ends.
func (r *CertReconciler) Run(ctx context.Context) error {
	retry := time.Second
	for {
		wait := r.Interval
		if err := r.reconcile(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if apierrors.IsConflict(err) {
				r.Log.Info("another replica changed the TLS material first; reading it again", "err", err)
				wait = 0
			} else {
				r.Log.Warn("keeping the webhook's TLS material", "err", err, "retry_in", retry.String())
				wait = retry
				retry = min(2*retry, r.Interval)
			}
		} else {
			retry = time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// reconcile is one pass. The Secret is written before the bundle is
// published, and Plan signs with a new CA only once it is published, so
// the certificate served is always one the API server already trusts
// (except the very first, which nothing trusted before). A configuration
// that cannot be read fails the pass after the certificate is loaded.
func (r *CertReconciler) reconcile(ctx context.Context) error {
	s, err := r.Client.CoreV1().Secrets(r.Namespace).Get(ctx, r.Secret, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("reading Secret %s/%s: it must exist (deploy/webhook creates it empty): %w", r.Namespace, r.Secret, err)
		}
		return fmt.Errorf("reading Secret %s/%s: %w", r.Namespace, r.Secret, err)
	}
	var published [][]byte
	var names []string
	mwc, mwcErr := r.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, r.WebhookConfig, metav1.GetOptions{})
	if mwcErr == nil {
		for _, w := range mwc.Webhooks {
			published = append(published, w.ClientConfig.CABundle)
			names = append(names, w.Name)
		}
	}
	data, changes, err := selfcert.Plan(s.Data, published, r.Now(), r.Config)
	if err != nil {
		return fmt.Errorf("planning the TLS material: %w", err)
	}
	if len(changes) > 0 {
		s.Data = data
		if _, err := r.Client.CoreV1().Secrets(r.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("writing Secret %s/%s: %w", r.Namespace, r.Secret, err)
		}
		r.Log.Info("TLS material updated", "secret", r.Namespace+"/"+r.Secret, "changes", changes)
	}
	if mwcErr == nil {
		if err := r.publish(ctx, mwc.ResourceVersion, names, published, data[selfcert.KeyBundle]); err != nil {
			return err
		}
	}
	if err := r.load(data[selfcert.KeyCert], data[selfcert.KeyKey]); err != nil {
		return err
	}
	if mwcErr != nil {
		// Served all the same: the configuration may be applied after the
		// webhook starts (kubectl applies it last). The error makes Run
		// read it again within seconds, not a whole interval later.
		return fmt.Errorf("reading MutatingWebhookConfiguration %s: its caBundle is not kept until it can be read: %w", r.WebhookConfig, mwcErr)
	}
	return nil
}

// publish writes bundle into the caBundle of every entry that differs, by
// JSON patch: a test of each entry's name at its index guards against a
// concurrent edit of the list (the patch then fails and the next pass
// reads again).
func (r *CertReconciler) publish(ctx context.Context, rv string, names []string, published [][]byte, bundle []byte) error {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	for i, name := range names {
		if bytes.Equal(published[i], bundle) {
			continue
		}
		ops = append(ops,
			op{Op: "test", Path: fmt.Sprintf("/webhooks/%d/name", i), Value: name},
			op{Op: "add", Path: fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), Value: bundle})
	}
	if len(ops) == 0 {
		return nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	if _, err := r.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Patch(ctx, r.WebhookConfig, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publishing the CA bundle in MutatingWebhookConfiguration %s (seen at version %s): %w", r.WebhookConfig, rv, err)
	}
	r.Log.Info("CA bundle published", "webhook_config", r.WebhookConfig, "entries", len(ops)/2, "cas", len(selfcert.Certificates(bundle)))
	return nil
}

func (r *CertReconciler) load(certPEM, keyPEM []byte) error {
	if r.cert.Load() != nil && bytes.Equal(certPEM, r.loaded) {
		return nil
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("loading the serving certificate: %w", err)
	}
	r.cert.Store(&c)
	r.loaded = certPEM
	r.Log.Info("serving certificate loaded", "certificate", selfcert.Describe(certPEM))
	return nil
}

// FileCerts serves tls.crt and tls.key of a directory (a mounted
// cert-manager Secret), reloading them when they change. The kubelet
// replaces a Secret volume's files atomically (a symlink swap).
type FileCerts struct {
	Dir      string // holds tls.crt and tls.key
	Interval time.Duration
	Log      *slog.Logger

	cert   atomic.Pointer[tls.Certificate]
	mu     sync.Mutex
	loaded []byte
}

var _ CertSource = (*FileCerts)(nil)

func (f *FileCerts) Current() *tls.Certificate { return f.cert.Load() }

// Run reloads the files every interval (at most 10 s) until ctx ends.
func (f *FileCerts) Run(ctx context.Context) error {
	interval := min(f.Interval, 10*time.Second)
	for {
		if err := f.reload(); err != nil {
			f.Log.Warn("loading the serving certificate", "dir", f.Dir, "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}

func (f *FileCerts) reload() error {
	certPEM, err := os.ReadFile(filepath.Join(f.Dir, selfcert.KeyCert))
	if err != nil {
		return fmt.Errorf("reading %s: %w", selfcert.KeyCert, err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(f.Dir, selfcert.KeyKey))
	if err != nil {
		return fmt.Errorf("reading %s: %w", selfcert.KeyKey, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cert.Load() != nil && bytes.Equal(certPEM, f.loaded) {
		return nil
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// Between the two reads the files may have been swapped: the next
		// pass reads a matching pair.
		return errors.Join(errors.New("the pair does not load (mid-rotation?)"), err)
	}
	f.cert.Store(&c)
	f.loaded = certPEM
	f.Log.Info("serving certificate loaded", "dir", f.Dir, "certificate", selfcert.Describe(certPEM))
	return nil
}
