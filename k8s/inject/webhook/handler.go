package webhook

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/draind/draind/k8s/inject"
)

// Paths of the two entries of the MutatingWebhookConfiguration: the API
// server cannot tell the webhook the namespace's labels, so each entry
// selects namespaces one way and calls its own path.
const (
	PathNamespace = "/inject/namespace" // the namespace carries draind.io/inject=true
	PathPod       = "/inject/pod"       // the namespace has no draind.io/inject label
)

// Handler answers AdmissionReviews with inject.Mutate's patch. It
// never refuses a pod: whatever goes wrong, the answer is "allowed" (and
// the configuration's failurePolicy is Ignore for the cases where no
// answer comes at all).
type Handler struct {
	opts       inject.Options
	log        *slog.Logger
	admissions *prometheus.CounterVec
	duration   prometheus.Histogram
}

// Results of an admission, the values of the result label.
const (
	admissionInjected = "injected"
	admissionSkipped  = "skipped"
	admissionError    = "error"
)

// NewHandler returns a handler that registers its metrics in reg.
func NewHandler(opts inject.Options, log *slog.Logger, reg *prometheus.Registry) *Handler {
	h := &Handler{
		opts: opts, log: log,
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "draind_webhook_admissions_total",
			Help: "Pod admissions the webhook answered, by result: injected, skipped (not opted in, host network, already injected, nothing injectable) or error (an unreadable request: allowed unchanged).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "draind_webhook_admission_duration_seconds",
			Help:    "Time to answer one admission request.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
		}),
	}
	for _, r := range []string{admissionInjected, admissionSkipped, admissionError} {
		h.admissions.WithLabelValues(r)
	}
	reg.MustRegister(h.admissions, h.duration)
	return h
}

// Mux routes the configuration's two entries to the handler.
func (h *Handler) Mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("POST "+PathNamespace, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, true) })
	m.HandleFunc("POST "+PathPod, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, false) })
	return m
}

// maxReviewBytes bounds a request body: the API server's own request limit
// is 3 MiB, and a review carries the object once more.
const maxReviewBytes = 8 << 20

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, namespaceOptedIn bool) {
	start := time.Now()
	defer func() { h.duration.Observe(time.Since(start).Seconds()) }()
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		h.admissions.WithLabelValues(admissionError).Inc()
		http.Error(w, "content type must be application/json", http.StatusUnsupportedMediaType)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReviewBytes+1))
	if err != nil || len(body) > maxReviewBytes {
		h.admissions.WithLabelValues(admissionError).Inc()
		http.Error(w, "reading the review: too large or broken", http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		h.admissions.WithLabelValues(admissionError).Inc()
		http.Error(w, fmt.Sprintf("decoding the AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp, result := h.review(review.Request, namespaceOptedIn)
	h.admissions.WithLabelValues(result).Inc()
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		h.log.Warn("writing the admission response", "err", err)
	}
}

// review decides one request. Anything but the creation of a pod is
// allowed unchanged.
func (h *Handler) review(req *admissionv1.AdmissionRequest, namespaceOptedIn bool) (*admissionv1.AdmissionResponse, string) {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	if req.Kind.Kind != "Pod" || req.Kind.Group != "" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return resp, admissionSkipped
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		h.log.Warn("decoding a pod under admission: allowed unchanged", "namespace", req.Namespace, "err", err)
		return resp, admissionError
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace // a pod being created may not say
	}
	name := pod.Name
	if name == "" {
		name = pod.GenerateName + "*"
	}
	res, err := inject.Mutate(&pod, namespaceOptedIn, h.opts)
	if err != nil {
		h.log.Error("computing the injection: allowed unchanged", "pod", req.Namespace+"/"+name, "err", err)
		return resp, admissionError
	}
	resp.Warnings = res.Warnings
	if len(res.Patch) == 0 {
		h.log.Debug("not injected", "pod", req.Namespace+"/"+name, "reason", res.Skipped[""], "containers", res.Skipped, "warnings", res.Warnings)
		return resp, admissionSkipped
	}
	patch, err := res.PatchJSON()
	if err != nil {
		h.log.Error("encoding the patch: allowed unchanged", "pod", req.Namespace+"/"+name, "err", err)
		return resp, admissionError
	}
	pt := admissionv1.PatchTypeJSONPatch
	resp.Patch, resp.PatchType = patch, &pt
	h.log.Info("injected", "pod", req.Namespace+"/"+name, "containers", res.Injected, "dry_run", req.DryRun != nil && *req.DryRun, "warnings", res.Warnings)
	return resp, admissionInjected
}
