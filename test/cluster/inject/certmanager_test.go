package inject

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	podinject "github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/k8s/inject/selfcert"
)

// TestInjectCertManagerLayout runs the webhook as the cert-manager
// component deploys it (its args, --cert-dir, no API credentials at all)
// on files laid out as cert-manager writes them (tls.crt, tls.key, ca.crt),
// with the caBundle the cainjector would write (the CA): the API server
// calls it and pods are injected; a renewal of the serving certificate
// (same CA, new files) is picked up without a restart and pods are still
// injected.
func TestInjectCertManagerLayout(t *testing.T) {
	cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	objs := render(t, []string{ComponentWebhook, ComponentCertManager}, "")
	dep := decode[appsv1.Deployment](t, objs, "Deployment", "draind-webhook")
	mwc := decode[admissionregistrationv1.MutatingWebhookConfiguration](t, objs, "MutatingWebhookConfiguration", webhookConfig)
	if dep.Spec.Template.Spec.AutomountServiceAccountToken == nil || *dep.Spec.Template.Spec.AutomountServiceAccountToken {
		t.Fatal("the cert-manager layout mounts a ServiceAccount token")
	}

	// cert-manager's files: a CA, and a serving certificate it signs.
	dir := t.TempDir()
	cc := selfcert.Config{DNSNames: []string{"draind-webhook.draind-system.svc"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		CAValidity: 24 * time.Hour, CertValidity: time.Hour}
	data, _, err := selfcert.Plan(nil, nil, time.Now(), cc)
	if err != nil {
		t.Fatal(err)
	}
	write := func(d map[string][]byte) {
		t.Helper()
		for _, k := range []string{selfcert.KeyCACert, selfcert.KeyKey, selfcert.KeyCert} {
			tmp := filepath.Join(dir, "."+k)
			if err := os.WriteFile(tmp, d[k], 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, k)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(data)

	addr, health := freeAddr(t), freeAddr(t)
	var args []string
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--cert-dir=") {
			a = "--cert-dir=" + dir
		}
		args = append(args, a)
	}
	if !slices.Contains(args, "--cert-dir="+dir) {
		t.Fatalf("the cert-manager layout's args %q have no --cert-dir", dep.Spec.Template.Spec.Containers[0].Args)
	}
	args = append(args, "--listen="+addr, "--health-listen="+health, "--cert-check-interval=200ms", "--shutdown-delay=0", "--log-format=text")
	var env []string
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		v := e.Value
		if e.ValueFrom != nil {
			v = dep.Namespace
		}
		env = append(env, e.Name+"="+v)
	}
	// No kubeconfig, no KUBERNETES_SERVICE_HOST: any API call would fail.
	p, err := StartProcess(shared.bin, args, env, addr, health, filepath.Join(logDir(t), "webhook-cert-manager.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stopping the webhook: %v", err)
		}
		if t.Failed() {
			t.Logf("--- webhook log:\n%s", p.Tail(30))
		}
	})
	if err := p.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	// The cainjector's work: the CA into every entry's caBundle.
	for i := range mwc.Webhooks {
		mwc.Webhooks[i].ClientConfig.CABundle = data[selfcert.KeyCACert]
	}
	createWebhookConfig(ctx, t, mwc, "https://"+addr)
	waitInjecting(ctx, t)
	if err := createNamespace(ctx, "certmanager", map[string]string{podinject.Key: "true"}); err != nil {
		t.Fatal(err)
	}
	pods := deploy(ctx, t, deployment("certmanager", "before-renewal", 1, corev1.PodSpec{Containers: []corev1.Container{app("app")}}, nil))
	checkInjected(t, &pods[0], map[string][]string{"app": offlineCmd()}, 30+80)

	// Renewal: a new serving certificate from the same CA.
	served := func() string {
		conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			return ""
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	first := served()
	// cert-manager renews at renewBefore; here a changed name makes Plan
	// re-issue now, from the same CA.
	renewCfg := cc
	renewCfg.DNSNames = append(slices.Clone(cc.DNSNames), "draind-webhook.draind-system.svc.cluster.local")
	renewed, changes, err := selfcert.Plan(data, nil, time.Now(), renewCfg)
	if err != nil || len(changes) == 0 || string(renewed[selfcert.KeyCACert]) != string(data[selfcert.KeyCACert]) {
		t.Fatalf("renewing with the same CA: %v %q", err, changes)
	}
	write(renewed)
	blk, _ := pem.Decode(renewed[selfcert.KeyCert])
	leaf, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return served() == leaf.SerialNumber.String(), nil
	}); err != nil {
		t.Fatalf("the renewed certificate is not served (still %s): %v", first, err)
	}
	pods = deploy(ctx, t, deployment("certmanager", "after-renewal", 1, corev1.PodSpec{Containers: []corev1.Container{app("app")}}, nil))
	checkInjected(t, &pods[0], map[string][]string{"app": offlineCmd()}, 30+80)
}
