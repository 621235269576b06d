package inject

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	podinject "github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/k8s/inject/selfcert"
)

func app(name string) corev1.Container {
	return corev1.Container{Name: name, Image: "registry.example/" + name + ":1"}
}

// TestInjectDeployments: pods the ReplicaSet controller creates for
// Deployments in a namespace labelled draind.io/inject=true come out
// mutated as specified (init container, HOST_IP, preStop, grace
// period), with a container's own preStop (exec, httpGet on a named port,
// sleep) chained after draind's; a pod annotated draind.io/inject: "true"
// in a namespace without the label too; a pod the webhook already mutated
// goes through it unchanged; its warnings reach the client.
func TestInjectDeployments(t *testing.T) {
	c := cluster(t)
	startWebhooks(t, 1, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := createNamespace(ctx, "shop", map[string]string{podinject.Key: "true"}); err != nil {
		t.Fatal(err)
	}

	t.Run("no preStop, default grace period", func(t *testing.T) {
		pods := deploy(ctx, t, deployment("shop", "cart", 2, corev1.PodSpec{Containers: []corev1.Container{app("cart")}}, nil))
		for i := range pods {
			checkInjected(t, &pods[i], map[string][]string{"cart": offlineCmd()}, 30+80)
			if got := pods[i].Spec.Containers[0].Image; got != "registry.example/cart:1" {
				t.Errorf("the container's image became %s", got)
			}
		}
	})

	t.Run("own preStop handlers are chained", func(t *testing.T) {
		web := app("web")
		web.Ports = []corev1.ContainerPort{{Name: "admin", ContainerPort: 8081}}
		web.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/quitquitquit", Port: intstr.FromString("admin"), HTTPHeaders: []corev1.HTTPHeader{{Name: "X-Drain", Value: "1"}}}}}
		nginx := app("nginx")
		nginx.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/usr/sbin/nginx", "-s", "quit"}}}}
		worker := app("worker")
		worker.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 3}}}
		spec := corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](45), Containers: []corev1.Container{web, nginx, worker}}
		pods := deploy(ctx, t, deployment("shop", "frontend", 1, spec, nil))
		checkInjected(t, &pods[0], map[string][]string{
			"web":    offlineCmd("--then-http-get=http://:8081/quitquitquit", "--then-http-header=X-Drain: 1"),
			"nginx":  offlineCmd("--then-exec", "--", "/usr/sbin/nginx", "-s", "quit"),
			"worker": offlineCmd("--then-sleep=3s"),
		}, 45+80)
		var podIP *corev1.EnvVar
		for _, e := range pods[0].Spec.Containers[0].Env {
			if e.Name == podinject.PodIPEnv {
				podIP = &e
			}
		}
		if podIP == nil || podIP.ValueFrom.FieldRef.FieldPath != "status.podIP" {
			t.Errorf("container web: %s = %+v, want status.podIP (its httpGet names no host)", podinject.PodIPEnv, podIP)
		}
	})

	t.Run("pod annotation in a namespace without the label", func(t *testing.T) {
		if err := createNamespace(ctx, "blog", nil); err != nil {
			t.Fatal(err)
		}
		pods := deploy(ctx, t, deployment("blog", "api", 1, corev1.PodSpec{Containers: []corev1.Container{app("api")}},
			map[string]string{podinject.Key: "true", podinject.KeyWait: "30s"}))
		checkInjected(t, &pods[0], map[string][]string{"api": {podinject.ToolsBinary, "offline", "--wait=30s", "--fallback-sleep=20s"}}, 30+50)
	})

	t.Run("a mutated pod is unchanged the second time", func(t *testing.T) {
		pods, err := c.Admin.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{LabelSelector: "app=frontend"})
		if err != nil || len(pods.Items) != 1 {
			t.Fatalf("frontend pods: %v %d", err, len(pods.Items))
		}
		first := pods.Items[0]
		again := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "frontend-again", Namespace: "shop", Annotations: first.Annotations, Labels: map[string]string{"copy": "1"}},
			Spec:       *first.Spec.DeepCopy(),
		}
		again.Spec.NodeName = ""
		got, err := c.Admin.CoreV1().Pods("shop").Create(ctx, again, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := first.Spec.DeepCopy()
		want.NodeName = ""
		if !equalSpecs(want, &got.Spec) {
			t.Errorf("the webhook changed an injected pod again:\nfirst  %+v\nsecond %+v", want, got.Spec)
		}
		if got.Annotations[podinject.KeyInjected] != first.Annotations[podinject.KeyInjected] {
			t.Errorf("annotation %s %q, was %q", podinject.KeyInjected, got.Annotations[podinject.KeyInjected], first.Annotations[podinject.KeyInjected])
		}
	})

	t.Run("warnings reach the client", func(t *testing.T) {
		w := &warnings{}
		cfg := rest.CopyConfig(c.AdminConfig)
		cfg.WarningHandler = w
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		p := probePod("bad-wait")
		p.Namespace = "shop"
		p.Annotations = map[string]string{podinject.KeyWait: "soon"}
		got, err := cs.CoreV1().Pods("shop").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		checkInjected(t, got, map[string][]string{"app": offlineCmd()}, 30+80)
		if msgs := w.list(); !slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, `draind.io/wait="soon"`) }) {
			t.Errorf("warnings %q, want the bad draind.io/wait named", msgs)
		}
	})
}

// equalSpecs compares what the webhook could have changed.
func equalSpecs(a, b *corev1.PodSpec) bool {
	if len(a.InitContainers) != len(b.InitContainers) || len(a.Containers) != len(b.Containers) || len(a.Volumes) != len(b.Volumes) ||
		ptr.Deref(a.TerminationGracePeriodSeconds, -1) != ptr.Deref(b.TerminationGracePeriodSeconds, -1) {
		return false
	}
	for i := range a.Containers {
		ca, cb := a.Containers[i], b.Containers[i]
		if len(ca.Env) != len(cb.Env) || len(ca.VolumeMounts) != len(cb.VolumeMounts) {
			return false
		}
		if (ca.Lifecycle == nil) != (cb.Lifecycle == nil) || (ca.Lifecycle != nil && ca.Lifecycle.PreStop.String() != cb.Lifecycle.PreStop.String()) {
			return false
		}
	}
	return true
}

type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, msg string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, msg)
}

func (w *warnings) list() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.msgs)
}

// TestInjectOptOuts: pods that must not be injected are not — a pod
// annotated draind.io/inject: "false" in an opted-in namespace, a
// host-network pod, a pod in a namespace without the label and without the
// annotation, a pod annotated "true" in a namespace labelled "false", and
// pods annotated "true" in kube-system and draind-system even when those
// are labelled draind.io/inject=true. The API server's matchConditions
// and selectors keep every one of them from even reaching the webhook (its
// admission counter does not move); a control pod created after them is
// injected, so the webhook was up throughout.
func TestInjectOptOuts(t *testing.T) {
	c := cluster(t)
	w := startWebhooks(t, 1, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := createNamespace(ctx, "optin", map[string]string{podinject.Key: "true"}); err != nil {
		t.Fatal(err)
	}
	if err := createNamespace(ctx, "plain", nil); err != nil {
		t.Fatal(err)
	}
	if err := createNamespace(ctx, "optout", map[string]string{podinject.Key: "false"}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"kube-system", systemNS} {
		n, err := c.Admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[podinject.Key] = "true"
		if _, err := c.Admin.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			n, err := c.Admin.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
			if err == nil {
				delete(n.Labels, podinject.Key)
				_, err = c.Admin.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Errorf("removing the label from %s: %v", ns, err)
			}
		}()
	}
	if err := c.WaitServiceAccount(ctx, "kube-system", "default"); err != nil {
		t.Fatal(err)
	}
	before, err := w.procs[0].Admissions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	optIn := map[string]string{podinject.Key: "true"}
	cases := []struct {
		name, ns    string
		annotations map[string]string
		hostNetwork bool
	}{
		{"pod opts out in an opted-in namespace", "optin", map[string]string{podinject.Key: "false"}, false},
		{"host network in an opted-in namespace", "optin", optIn, true},
		{"neither the namespace nor the pod opts in", "plain", nil, false},
		{"pod opts in, namespace opts out", "optout", optIn, false},
		{"kube-system", "kube-system", optIn, false},
		{"draind-system", systemNS, optIn, false},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := corev1.PodSpec{HostNetwork: tc.hostNetwork, Containers: []corev1.Container{app("app")}}
			pods := deploy(ctx, t, deployment(tc.ns, fmt.Sprintf("skip-%d", i), 1, spec, tc.annotations))
			checkUntouched(t, &pods[0], 30)
		})
	}
	after, err := w.procs[0].Admissions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"injected", "skipped", "error"} {
		if after[r] != before[r] {
			t.Errorf("the webhook answered %v admissions (%s) for pods it should never see: the configuration's selectors or matchConditions let them through", after[r]-before[r], r)
		}
	}
	t.Run("control: an opted-in pod is injected", func(t *testing.T) {
		pods := deploy(ctx, t, deployment("optin", "control", 1, corev1.PodSpec{Containers: []corev1.Container{app("app")}}, nil))
		checkInjected(t, &pods[0], map[string][]string{"app": offlineCmd()}, 30+80)
	})
}

// TestInjectWebhookDown: with the webhook down (its process stopped:
// connections refused) and with a webhook that accepts connections but
// never answers, pods of an opted-in namespace are still created
// (failurePolicy Ignore, a short timeout), uninjected; once the webhook is
// back, pods are injected again.
func TestInjectWebhookDown(t *testing.T) {
	c := cluster(t)
	w := startWebhooks(t, 1, false)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := createNamespace(ctx, "down", map[string]string{podinject.Key: "true"}); err != nil {
		t.Fatal(err)
	}
	if err := w.procs[0].Stop(); err != nil {
		t.Fatal(err)
	}
	t.Run("stopped", func(t *testing.T) {
		pods := deploy(ctx, t, deployment("down", "while-stopped", 2, corev1.PodSpec{Containers: []corev1.Container{app("app")}}, nil))
		for i := range pods {
			checkUntouched(t, &pods[i], 30)
		}
	})
	t.Run("hanging", func(t *testing.T) {
		// Accepts on the webhook's address and never answers.
		l, err := net.Listen("tcp", w.procs[0].Addr)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var conns []net.Conn
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, conn)
				mu.Unlock()
			}
		}()
		defer func() {
			l.Close()
			mu.Lock()
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
		}()
		start := time.Now()
		hanging := probePod("while-hanging")
		hanging.Namespace = "down"
		p, err := c.Admin.CoreV1().Pods("down").Create(ctx, hanging, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating a pod while the webhook hangs: %v", err)
		}
		took := time.Since(start)
		checkUntouched(t, p, 30)
		mu.Lock()
		n := len(conns)
		mu.Unlock()
		if n == 0 {
			t.Error("the API server never called the hanging webhook: the test did not test the timeout")
		}
		t.Logf("pod created uninjected %v after the call (timeoutSeconds: 3)", took.Round(time.Millisecond))
	})
	t.Run("back", func(t *testing.T) {
		startWebhooks(t, 1, false)
		pods := deploy(ctx, t, deployment("down", "after", 1, corev1.PodSpec{Containers: []corev1.Container{app("app")}}, nil))
		checkInjected(t, &pods[0], map[string][]string{"app": offlineCmd()}, 30+80)
	})
}

// TestInjectCertRotation runs two webhook replicas behind a round-robin
// relay (the Service) with lifetimes short enough that the CA is replaced
// several times and the serving certificate many times, and creates pods
// all the while: every pod is injected (the API server never distrusted a
// certificate it was served, or a TLS failure would have left a pod
// uninjected under failurePolicy Ignore), both replicas answered, and a
// TLS client that trusts only the configuration's current caBundle
// verifies every certificate it is served.
func TestInjectCertRotation(t *testing.T) {
	c := cluster(t)
	const (
		caValidity   = 30 * time.Second
		certValidity = 9 * time.Second
		duration     = 75 * time.Second
	)
	w := startWebhooks(t, 2, true,
		"--ca-validity="+caValidity.String(), "--cert-validity="+certValidity.String(),
		"--ca-publish-delay=2s", "--cert-check-interval=500ms")
	ctx, cancel := context.WithTimeout(context.Background(), duration+2*time.Minute)
	defer cancel()
	if err := createNamespace(ctx, "rotate", map[string]string{podinject.Key: "true"}); err != nil {
		t.Fatal(err)
	}

	cas := map[string]bool{}
	serials := map[string]bool{}
	var probeErrs, stalls []string
	const stallLimit = 2 * time.Second
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		// Observe: the signing CA in the Secret, and the certificate a TLS
		// client is served, verified against the published caBundle.
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			if s, err := c.Admin.CoreV1().Secrets(systemNS).Get(ctx, tlsSecret, metav1.GetOptions{}); err == nil {
				cas[string(s.Data[selfcert.KeyCACert])] = true
			}
			mwc, err := c.Admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhookConfig, metav1.GetOptions{})
			if err != nil {
				continue
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(mwc.Webhooks[0].ClientConfig.CABundle)
			for _, p := range w.procs {
				var leaf *x509.Certificate
				// Verified by hand, as crypto/tls would, to keep the leaf
				// for the report when it fails.
				began := time.Now()
				conn, err := tls.DialWithDialer(&net.Dialer{Timeout: stallLimit}, "tcp", p.Addr, &tls.Config{InsecureSkipVerify: true,
					VerifyConnection: func(cs tls.ConnectionState) error {
						leaf = cs.PeerCertificates[0]
						_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "127.0.0.1"})
						return err
					}})
				if took := time.Since(began); took > stallLimit {
					// The replica (or the whole machine) did not run for
					// that long: with lifetimes of seconds, the
					// certificate it serves when it resumes, before its
					// next check, may have expired meanwhile. Not what
					// this test is about (a real stall also fails the
					// pods the API server sent meanwhile).
					stalls = append(stalls, fmt.Sprintf("%s: handshake took %v (%v)", p.Addr, took.Round(time.Millisecond), err))
					if conn != nil {
						conn.Close()
					}
					continue
				}
				if err != nil {
					what := err.Error()
					if leaf != nil {
						what = fmt.Sprintf("%s: %v (serial %x from %s, valid %s to %s)", p.Addr, err, leaf.SerialNumber, leaf.Issuer.CommonName,
							leaf.NotBefore.Format("15:04:05.000"), leaf.NotAfter.Format("15:04:05.000"))
					}
					probeErrs = append(probeErrs, what)
					continue
				}
				serials[conn.ConnectionState().PeerCertificates[0].SerialNumber.String()] = true
				conn.Close()
			}
		}
	}()

	var created, injected int
	var missed []string
	deadline := time.Now().Add(duration)
	for i := 0; time.Now().Before(deadline); i++ {
		p := probePod(fmt.Sprintf("pod-%d", i))
		p.Namespace = "rotate"
		got, err := c.Admin.CoreV1().Pods("rotate").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("creating pod %d: %v", i, err)
		}
		created++
		if got.Annotations[podinject.KeyInjected] != "" {
			injected++
		} else {
			missed = append(missed, fmt.Sprintf("%s at %s", got.Name, time.Now().Format("15:04:05.000")))
		}
		time.Sleep(150 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	counts := w.relay.Counts()
	t.Logf("%d pods created, %d injected; %d signing CAs and %d serving certificates seen; connections per replica %v",
		created, injected, len(cas), len(serials), counts)
	if injected != created {
		t.Errorf("%d of %d pods created during the rotations were not injected: %q", created-injected, created, missed)
	}
	if len(stalls) > 0 {
		t.Logf("probe handshakes slower than %v (a stalled process, not counted): %q", stallLimit, stalls)
	}
	if len(probeErrs) > 0 {
		t.Errorf("%d TLS handshakes failed against the published caBundle: %q", len(probeErrs), probeErrs)
	}
	if len(cas) < 3 || len(serials) < 6 {
		t.Errorf("only %d signing CAs and %d serving certificates in %v: the rotation this test is about did not happen", len(cas), len(serials), duration)
	}
	if len(counts) != 2 {
		t.Errorf("connections per replica %v: want both replicas to answer", counts)
	}
}

// TestInjectRBAC: the webhook ran in the tests above with exactly the
// component's RBAC (its ServiceAccount's token); here SubjectAccessReviews
// show that is all it may do: its own Secret and webhook configuration,
// nothing else.
func TestInjectRBAC(t *testing.T) {
	c := cluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	user := "system:serviceaccount:" + systemNS + ":" + webhookSA
	type ra = authorizationv1.ResourceAttributes
	adm := "admissionregistration.k8s.io"
	allowed := []ra{
		{Verb: "get", Resource: "secrets", Namespace: systemNS, Name: tlsSecret},
		{Verb: "update", Resource: "secrets", Namespace: systemNS, Name: tlsSecret},
		{Verb: "get", Group: adm, Resource: "mutatingwebhookconfigurations", Name: webhookConfig},
		{Verb: "patch", Group: adm, Resource: "mutatingwebhookconfigurations", Name: webhookConfig},
	}
	denied := []ra{
		{Verb: "get", Resource: "secrets", Namespace: systemNS, Name: "other"},
		{Verb: "list", Resource: "secrets", Namespace: systemNS},
		{Verb: "watch", Resource: "secrets", Namespace: systemNS},
		{Verb: "create", Resource: "secrets", Namespace: systemNS},
		{Verb: "delete", Resource: "secrets", Namespace: systemNS, Name: tlsSecret},
		{Verb: "patch", Resource: "secrets", Namespace: systemNS, Name: tlsSecret},
		{Verb: "get", Resource: "secrets", Namespace: "shop", Name: tlsSecret},
		{Verb: "patch", Group: adm, Resource: "mutatingwebhookconfigurations", Name: "someone-elses"},
		{Verb: "update", Group: adm, Resource: "mutatingwebhookconfigurations", Name: webhookConfig},
		{Verb: "delete", Group: adm, Resource: "mutatingwebhookconfigurations", Name: webhookConfig},
		{Verb: "list", Group: adm, Resource: "mutatingwebhookconfigurations"},
		{Verb: "create", Group: adm, Resource: "mutatingwebhookconfigurations"},
		{Verb: "patch", Group: adm, Resource: "validatingwebhookconfigurations", Name: webhookConfig},
		{Verb: "get", Resource: "pods", Namespace: "shop"},
		{Verb: "get", Resource: "namespaces", Name: "shop"},
		{Verb: "get", Resource: "configmaps", Namespace: systemNS},
	}
	for _, set := range []struct {
		attrs []ra
		want  bool
	}{{allowed, true}, {denied, false}} {
		for _, a := range set.attrs {
			sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &a}}
			got, err := c.Admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got.Status.Allowed != set.want {
				t.Errorf("%s may %s %s %q in %q: %v, want %v", user, a.Verb, a.Resource, a.Name, a.Namespace, got.Status.Allowed, set.want)
			}
		}
	}
}
