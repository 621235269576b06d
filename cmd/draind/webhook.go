package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/draind/draind/daemon/nodeapi"
	"github.com/draind/draind/k8s/inject"
	"github.com/draind/draind/k8s/inject/selfcert"
	"github.com/draind/draind/k8s/inject/webhook"
)

type webhookOptions struct {
	listen, healthListen  string
	kubeconfig, namespace string
	inject                inject.Options

	certDir       string // cert-manager (or any) files: tls.crt, tls.key
	secret        string
	webhookConfig string
	service       string
	extraSANs     []string
	caValidity    time.Duration
	certValidity  time.Duration
	publishDelay  time.Duration
	certInterval  time.Duration
	shutdownDelay time.Duration

	logFormat, logLevel string
}

func newWebhookCmd() *cobra.Command {
	o := &webhookOptions{}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Serve the admission webhook that gives opted-in pods draind's preStop call",
		Long: `Serve a mutating admission webhook for Pods. A pod in a namespace labelled
draind.io/inject=true (unless the pod says draind.io/inject: "false"), or a pod
annotated draind.io/inject: "true", gets in each container a preStop hook that
runs draind offline (copied in by an init container from the draind image),
HOST_IP from status.hostIP, and a grace period extended by --wait +
--fallback-sleep. A container's own preStop handler runs after the drain.

TLS: by default the webhook creates a CA and a serving certificate, keeps them
in --tls-secret, rotates both, and writes the CA bundle into the
MutatingWebhookConfiguration --webhook-config. With --cert-dir it serves the
files there instead (cert-manager), reloading them when they change.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runWebhook(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", ":9443", "HTTPS listen address of the webhook")
	f.StringVar(&o.healthListen, "health-listen", ":9444", "HTTP listen address of /healthz, /readyz and /metrics (empty: off)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster configuration)")
	f.StringVar(&o.namespace, "namespace", "draind-system", "draind's namespace: the webhook's Secret and Service; its pods are never injected")
	f.StringVar(&o.inject.Image, "image", "", "draind image of the injected init container: the one the DaemonSet runs (required)")
	f.StringVar(&o.inject.ImageBinary, "image-binary", inject.DefaultImageBinary, "path of draind inside --image")
	f.DurationVar(&o.inject.Wait, "wait", inject.DefaultWait, "draind offline --wait of injected pods (a pod's draind.io/wait overrides it)")
	f.DurationVar(&o.inject.FallbackSleep, "fallback-sleep", inject.DefaultFallbackSleep, "draind offline --fallback-sleep of injected pods")
	f.StringVar(&o.certDir, "cert-dir", "", "serve tls.crt and tls.key from this directory (cert-manager) instead of managing certificates")
	f.StringVar(&o.secret, "tls-secret", "draind-webhook-tls", "Secret in --namespace holding the self-managed CA and serving certificate (it must exist)")
	f.StringVar(&o.webhookConfig, "webhook-config", "draind-webhook", "MutatingWebhookConfiguration whose caBundle the webhook keeps")
	f.StringVar(&o.service, "service", "draind-webhook", "Service in --namespace the API server calls: the serving certificate's DNS names")
	f.StringSliceVar(&o.extraSANs, "tls-extra-san", nil, "more names or IP addresses for the serving certificate (a webhook reached by URL)")
	f.DurationVar(&o.caValidity, "ca-validity", 2*365*24*time.Hour, "lifetime of a self-managed CA (a next one is published when a third is left)")
	f.DurationVar(&o.certValidity, "cert-validity", 90*24*time.Hour, "lifetime of a serving certificate (re-issued when a third is left)")
	f.DurationVar(&o.publishDelay, "ca-publish-delay", 5*time.Minute, "how long a next CA is published in the caBundle before it signs")
	f.DurationVar(&o.certInterval, "cert-check-interval", time.Minute, "how often the certificates are checked and reloaded")
	f.DurationVar(&o.shutdownDelay, "shutdown-delay", 5*time.Second, "after SIGTERM, keep serving (not ready) this long while the Service drops the pod")
	f.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	f.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	withEnv(cmd)
	return cmd
}

// serviceNames are the DNS names the API server may use for a Service.
func serviceNames(service, namespace string) []string {
	return []string{
		service,
		service + "." + namespace,
		service + "." + namespace + ".svc",
		service + "." + namespace + ".svc.cluster.local",
	}
}

func (o *webhookOptions) certConfig() selfcert.Config {
	c := selfcert.Config{
		DNSNames:     serviceNames(o.service, o.namespace),
		CAValidity:   o.caValidity,
		CertValidity: o.certValidity,
		PublishDelay: o.publishDelay,
	}
	for _, s := range o.extraSANs {
		if ip := net.ParseIP(s); ip != nil {
			c.IPs = append(c.IPs, ip)
		} else {
			c.DNSNames = append(c.DNSNames, s)
		}
	}
	return c
}

// validateDurations refuses the webhook's own durations out of range: a
// check interval of 0 would spin, a negative delay is a typo.
func (o *webhookOptions) validateDurations() error {
	if o.inject.FallbackSleep < 0 {
		return fmt.Errorf("--fallback-sleep=%s: must not be negative", o.inject.FallbackSleep)
	}
	if o.inject.Wait <= 0 {
		return fmt.Errorf("--wait=%s: must be positive (the injected preStop waits for the drain)", o.inject.Wait)
	}
	if o.certInterval <= 0 {
		return fmt.Errorf("--cert-check-interval=%s: must be positive", o.certInterval)
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--ca-publish-delay", o.publishDelay}, {"--shutdown-delay", o.shutdownDelay}} {
		if d.v < 0 {
			return fmt.Errorf("%s=%s: must not be negative", d.flag, d.v)
		}
	}
	return nil
}

func runWebhook(ctx context.Context, o *webhookOptions) error {
	log, err := newLogger(o.logFormat, o.logLevel)
	if err != nil {
		return err
	}
	klog.SetSlogLogger(log.With("component", "client-go"))
	o.inject.Namespace = o.namespace // draind's own: never injected
	if err := o.validateDurations(); err != nil {
		return err
	}
	if err := o.inject.Validate(); err != nil {
		return fmt.Errorf("--image/--wait/--fallback-sleep: %w", err)
	}
	certs, err := o.certSource(log)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	wh := webhook.NewHandler(o.inject, log, reg)

	// Listeners first: a port in use is an error before anything runs.
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.listen, err)
	}
	var hl net.Listener
	if o.healthListen != "" {
		if hl, err = net.Listen("tcp", o.healthListen); err != nil {
			l.Close()
			return fmt.Errorf("listening on %s: %w", o.healthListen, err)
		}
	}
	var stopping atomic.Bool
	srv, hsrv := webhookServers(wh, reg, certs, &stopping, log)

	log.Info("webhook starting", "listen", l.Addr().String(), "health", o.healthListen, "image", o.inject.Image,
		"wait", o.inject.Wait.String(), "fallback_sleep", o.inject.FallbackSleep.String(), "self_managed_tls", o.certDir == "")
	g, gctx := errgroup.WithContext(ctx)
	runCtx, stopCerts := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCerts()
	g.Go(func() error { return certs.Run(runCtx) })
	g.Go(func() error {
		if err := srv.ServeTLS(l, "", ""); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving the webhook: %w", err)
		}
		return nil
	})
	if hl != nil {
		g.Go(func() error {
			if err := hsrv.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("serving health: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		// Not ready at once; keep answering the API server while the
		// Service's endpoints drop this pod, then stop.
		stopping.Store(true)
		if ctx.Err() != nil && o.shutdownDelay > 0 {
			log.Info("stopping: not ready, serving for the shutdown delay", "delay", o.shutdownDelay.String())
			time.Sleep(o.shutdownDelay)
		}
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := srv.Shutdown(sctx)
		hsrv.Shutdown(sctx)
		stopCerts()
		return err
	})
	err = g.Wait()
	if err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("webhook stopped")
	return nil
}

// certSource is where the serving certificate comes from: the files of
// --cert-dir, or the self-managed Secret.
func (o *webhookOptions) certSource(log *slog.Logger) (webhook.CertSource, error) {
	if o.certDir != "" {
		return &webhook.FileCerts{Dir: o.certDir, Interval: o.certInterval, Log: log}, nil
	}
	cc := o.certConfig()
	if err := cc.Validate(); err != nil {
		return nil, fmt.Errorf("certificate flags: %w", err)
	}
	cfg, err := restConfig(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading the API client configuration: %w", err)
	}
	cfg.UserAgent = "draind-webhook/" + version
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the API client: %w", err)
	}
	return &webhook.CertReconciler{
		Client: client, Namespace: o.namespace, Secret: o.secret, WebhookConfig: o.webhookConfig,
		Config: cc, Interval: o.certInterval, Now: time.Now, Log: log,
	}, nil
}

// webhookServers are the TLS server of the admission handler and the plain
// HTTP server of /healthz, /readyz (not ready while stopping or without a
// certificate) and /metrics.
func webhookServers(wh *webhook.Handler, reg *prometheus.Registry, certs webhook.CertSource, stopping *atomic.Bool, log *slog.Logger) (srv, hsrv *http.Server) {
	srv = &http.Server{
		Handler:           wh.Mux(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       15 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxHeaderBytes:    64 << 10,
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				if c := certs.Current(); c != nil {
					return c, nil
				}
				return nil, errors.New("no serving certificate yet")
			},
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case stopping.Load():
			http.Error(w, "stopping", http.StatusServiceUnavailable)
		case certs.Current() == nil:
			http.Error(w, "no serving certificate yet", http.StatusServiceUnavailable)
		default:
			io.WriteString(w, "ok")
		}
	})
	health.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return srv, nodeapi.BoundedServer(health)
}
