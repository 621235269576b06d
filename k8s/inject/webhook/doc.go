// Package webhook serves draind's mutating admission webhook: the HTTP
// handler that answers AdmissionReviews with inject.Mutate's patch, and the
// sources of its serving certificate (self-managed through selfcert, or
// files a cert-manager Secret mounts).
//
// Its files:
//
//   - handler.go: Handler, the AdmissionReview handler and its metrics;
//   - certs.go: CertSource, the serving certificate: CertReconciler (the
//     self-managed Secret and caBundle, as selfcert.Plan decides) and
//     FileCerts (a mounted certificate's files).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package webhook
