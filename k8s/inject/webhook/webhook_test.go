package webhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/k8s/inject/selfcert"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

func admissionReview(t *testing.T, op admissionv1.Operation, kind string, pod *corev1.Pod) []byte {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: "uid-1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind}, Operation: op,
			Namespace: "shop", Object: runtime.RawExtension{Raw: raw},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestWebhookReview sends AdmissionReviews to the handler as the API
// server does and applies the patches it answers.
func TestWebhookReview(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := NewHandler(inject.Options{Image: "ghcr.io/draind/draind:v0.2.0", Namespace: "draind-system", FallbackSleep: 20 * time.Second}, quietLog, reg)
	srv := httptest.NewServer(h.Mux())
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	grace := int64(30)
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "cart-", Namespace: "shop"},
		Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{Name: "app", Image: "cart"}}},
	}
	post := func(path string, body []byte, ct string) (*http.Response, admissionv1.AdmissionReview) {
		t.Helper()
		resp, err := hc.Post(srv.URL+path, ct, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out admissionv1.AdmissionReview
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
				t.Fatal(err)
			}
		}
		return resp, out
	}

	resp, out := post(PathNamespace, admissionReview(t, admissionv1.Create, "Pod", pod), "application/json")
	if resp.StatusCode != 200 || out.Response == nil || !out.Response.Allowed || out.Response.UID != "uid-1" {
		t.Fatalf("status %d, response %+v", resp.StatusCode, out.Response)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Errorf("answer is %s %s", out.APIVersion, out.Kind)
	}
	if out.Response.PatchType == nil || *out.Response.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v", out.Response.PatchType)
	}
	patch, err := jsonpatch.DecodePatch(out.Response.Patch)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(pod)
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatal(err)
	}
	var got corev1.Pod
	if err := json.Unmarshal(patched, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Spec.InitContainers) != 1 || got.Spec.Containers[0].Lifecycle == nil || *got.Spec.TerminationGracePeriodSeconds != 110 {
		t.Errorf("patched pod not injected: %s", patched)
	}

	// The same pod through the entry of namespaces without the label: not
	// opted in, allowed unchanged.
	_, out = post(PathPod, admissionReview(t, admissionv1.Create, "Pod", pod), "application/json")
	if !out.Response.Allowed || out.Response.Patch != nil {
		t.Errorf("not opted in: %+v", out.Response)
	}
	// Not a creation, not a pod: allowed unchanged.
	for _, tc := range []struct {
		op   admissionv1.Operation
		kind string
	}{{admissionv1.Update, "Pod"}, {admissionv1.Create, "Service"}} {
		_, out = post(PathNamespace, admissionReview(t, tc.op, tc.kind, pod), "application/json")
		if !out.Response.Allowed || out.Response.Patch != nil {
			t.Errorf("%s %s: %+v", tc.op, tc.kind, out.Response)
		}
	}
	// Warnings reach the client.
	bad := pod.DeepCopy()
	bad.Annotations = map[string]string{inject.KeyWait: "soon"}
	_, out = post(PathNamespace, admissionReview(t, admissionv1.Create, "Pod", bad), "application/json")
	if len(out.Response.Warnings) != 1 || !strings.Contains(out.Response.Warnings[0], "draind.io/wait") || out.Response.Patch == nil {
		t.Errorf("bad wait: warnings %q, patch %v", out.Response.Warnings, out.Response.Patch != nil)
	}
	// Broken requests: errors, never a refusal of the pod.
	if resp, _ := post(PathNamespace, []byte("{"), "application/json"); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("broken JSON: status %d", resp.StatusCode)
	}
	if resp, _ := post(PathNamespace, admissionReview(t, admissionv1.Create, "Pod", pod), "text/plain"); resp.StatusCode != http.StatusUnsupportedMediaType {
		t.Errorf("text/plain: status %d", resp.StatusCode)
	}
	if r, err := hc.Get(srv.URL + PathNamespace); err != nil || r.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %v %v", r, err)
	} else {
		r.Body.Close()
	}
	for result, want := range map[string]float64{admissionInjected: 2, admissionSkipped: 3, admissionError: 2} {
		if got := testutil.ToFloat64(h.admissions.WithLabelValues(result)); got != want {
			t.Errorf("draind_webhook_admissions_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

func webhookConfigObject(bundles ...[]byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "draind-webhook"}}
	for i, n := range []string{"namespace.inject.draind.io", "pod.inject.draind.io"} {
		w := admissionregistrationv1.MutatingWebhook{Name: n}
		if i < len(bundles) {
			w.ClientConfig.CABundle = bundles[i]
		}
		mwc.Webhooks = append(mwc.Webhooks, w)
	}
	return mwc
}

// TestWebhookCertReconciler runs the self-managed TLS loop against a fake
// API: it fills the empty Secret, publishes the bundle in both entries,
// loads a certificate the bundle trusts, writes nothing when nothing is
// due, survives a lost update race, and takes a CA rotation through
// publication before signing with the new CA.
func TestWebhookCertReconciler(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "draind-webhook-tls", Namespace: "draind-system"}},
		webhookConfigObject(),
	)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cc := selfcert.Config{DNSNames: []string{"draind-webhook.draind-system.svc", "draind-webhook.draind-system.svc.cluster.local"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		CAValidity: 30 * 24 * time.Hour, CertValidity: 3 * 24 * time.Hour, PublishDelay: time.Minute}
	r := &CertReconciler{Client: client, Namespace: "draind-system", Secret: "draind-webhook-tls", WebhookConfig: "draind-webhook",
		Config: cc, Interval: time.Minute, Now: func() time.Time { return now }, Log: quietLog}
	state := func() (map[string][]byte, [][]byte) {
		s, err := client.CoreV1().Secrets("draind-system").Get(ctx, "draind-webhook-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "draind-webhook", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var b [][]byte
		for _, w := range m.Webhooks {
			b = append(b, w.ClientConfig.CABundle)
		}
		return s.Data, b
	}
	trusted := func(bundle []byte) error {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bundle) {
			t.Fatal("empty bundle")
		}
		leaf, err := x509.ParseCertificate(r.Current().Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "draind-webhook.draind-system.svc", CurrentTime: now})
		return err
	}
	writes := func() int {
		n := 0
		for _, a := range client.Actions() {
			if a.GetVerb() == "update" || a.GetVerb() == "patch" {
				n++
			}
		}
		return n
	}

	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	data, published := state()
	if len(data[selfcert.KeyCert]) == 0 || len(published) != 2 || !bytes.Equal(published[0], data[selfcert.KeyBundle]) || !bytes.Equal(published[1], data[selfcert.KeyBundle]) {
		t.Fatalf("after the first pass: secret keys %d, bundles published %q", len(data), published)
	}
	if err := trusted(published[0]); err != nil {
		t.Fatalf("the loaded certificate is not trusted by the published bundle: %v", err)
	}
	leaf, _ := x509.ParseCertificate(r.Current().Certificate[0])
	if !slices.ContainsFunc(leaf.IPAddresses, func(ip net.IP) bool { return ip.String() == "127.0.0.1" }) ||
		!slices.Contains(leaf.DNSNames, "draind-webhook.draind-system.svc.cluster.local") {
		t.Errorf("SANs %v %v", leaf.DNSNames, leaf.IPAddresses)
	}
	before := writes()
	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if w := writes() - before; w != 0 {
		t.Errorf("a pass with nothing due wrote %d times", w)
	}

	// Another replica wins the race: Conflict, and the next pass succeeds.
	now = now.Add(2 * 24 * time.Hour) // the serving certificate is due
	conflicts := 1
	client.PrependReactor("update", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		if conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "secrets"}, "draind-webhook-tls", nil)
		}
		return false, nil, nil
	})
	old := r.Current()
	if err := r.reconcile(ctx); !apierrors.IsConflict(err) {
		t.Fatalf("want a conflict, got %v", err)
	}
	if r.Current() != old {
		t.Error("a lost race changed the served certificate")
	}
	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if r.Current() == old {
		t.Error("the due serving certificate was not re-issued")
	}

	// CA rotation: 21 of 30 days. A next CA is published; the served
	// certificate stays the old CA's until the publish delay has passed.
	now = time.Date(2026, 1, 21, 0, 0, 0, 0, time.UTC)
	if err := r.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	data, published = state()
	if data[selfcert.KeyNextCert] == nil || len(selfcert.Certificates(published[0])) != 2 {
		t.Fatalf("no next CA published: %d CAs", len(selfcert.Certificates(published[0])))
	}
	oldCA := data[selfcert.KeyCACert]
	for _, step := range []time.Duration{time.Second, 30 * time.Second, 2 * time.Minute} {
		now = now.Add(step)
		if err := r.reconcile(ctx); err != nil {
			t.Fatal(err)
		}
		if err := trusted(published[0]); err != nil {
			t.Fatalf("served a certificate the published bundle does not trust: %v", err)
		}
	}
	data, _ = state()
	if bytes.Equal(data[selfcert.KeyCACert], oldCA) {
		t.Error("the next CA was never promoted")
	}
	ca, _ := x509.ParseCertificate(r.Current().Certificate[0])
	if !strings.HasPrefix(ca.Issuer.CommonName, "draind-webhook-ca@") {
		t.Errorf("issuer %s", ca.Issuer.CommonName)
	}
}

// TestWebhookCertConfigAppliedLater: a webhook that starts before its
// configuration exists serves a certificate at once and publishes the
// bundle within seconds of the configuration appearing, not an interval
// (here an hour) later: the pass that could not read it failed, so the
// next comes on the short retry.
func TestWebhookCertConfigAppliedLater(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "draind-webhook-tls", Namespace: "draind-system"}})
	cc := selfcert.Config{DNSNames: []string{"draind-webhook.draind-system.svc"},
		CAValidity: 30 * 24 * time.Hour, CertValidity: 3 * 24 * time.Hour, PublishDelay: time.Minute}
	r := &CertReconciler{Client: client, Namespace: "draind-system", Secret: "draind-webhook-tls", WebhookConfig: "draind-webhook",
		Config: cc, Interval: time.Hour, Now: time.Now, Log: quietLog}
	if err := r.reconcile(ctx); !apierrors.IsNotFound(err) || r.Current() == nil {
		t.Fatalf("a pass without the configuration: err %v, serving %v; want not found and a certificate served", err, r.Current() != nil)
	}
	reads := make(chan struct{}, 1)
	client.PrependReactor("get", "mutatingwebhookconfigurations", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case reads <- struct{}{}:
		default:
		}
		return false, nil, nil
	})
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-reads // Run's first pass found no configuration
	mwcs := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := mwcs.Create(ctx, webhookConfigObject(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var published [][]byte
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		m, err := mwcs.Get(ctx, "draind-webhook", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		published = published[:0]
		for _, w := range m.Webhooks {
			if len(w.ClientConfig.CABundle) > 0 {
				published = append(published, w.ClientConfig.CABundle)
			}
		}
		if len(published) == 2 {
			break
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	s, err := client.CoreV1().Secrets("draind-system").Get(context.Background(), "draind-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(published) != 2 || !bytes.Equal(published[0], s.Data[selfcert.KeyBundle]) || !bytes.Equal(published[1], s.Data[selfcert.KeyBundle]) {
		t.Fatalf("30 s after the configuration appeared, %d of its 2 entries carry the Secret's bundle", len(published))
	}
}

// TestWebhookNeverMutatesProtectedNamespaces: with a selector as wide as
// it gets (the namespace entry, the pod opting in), a pod in kube-system or
// in draind's own namespace (--namespace, here not draind-system) is
// allowed unchanged, whether its object names the namespace or only the
// request does; a pod in draind-system, an ordinary namespace here, is
// injected.
func TestWebhookNeverMutatesProtectedNamespaces(t *testing.T) {
	h := NewHandler(inject.Options{Image: "ghcr.io/draind/draind:v0.2.0", Namespace: "ops-draind"}, quietLog, prometheus.NewRegistry())
	for _, tc := range []struct {
		ns, objNS string
		injected  bool
	}{
		{"kube-system", "kube-system", false},
		{"kube-system", "", false},
		{"ops-draind", "ops-draind", false},
		{"ops-draind", "", false},
		{"draind-system", "draind-system", true},
	} {
		pod := &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: tc.objNS, Annotations: map[string]string{inject.Key: "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "x"}}},
		}
		raw, _ := json.Marshal(pod)
		req := &admissionv1.AdmissionRequest{UID: "u", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Operation: admissionv1.Create, Namespace: tc.ns, Object: runtime.RawExtension{Raw: raw}}
		resp, _ := h.review(req, true)
		if !resp.Allowed || (resp.Patch != nil) != tc.injected {
			t.Errorf("pod in %s (object says %q): allowed %v, patched %v, want patched %v", tc.ns, tc.objNS, resp.Allowed, resp.Patch != nil, tc.injected)
		}
	}
}

// TestSteerOnDeleteKeyIsTheDaemons: the webhook writes the annotation the
