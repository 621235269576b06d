// Package selfcert decides the TLS material of the admission webhook when
// it manages its own certificates: a CA it creates, a serving certificate
// that CA signs, and the bundle of CAs the API server must trust (the
// webhook configuration's caBundle). Plan is a pure function of what the
// Secret holds, what the webhook configuration publishes and the time, so
// every rotation step is tested with a fake clock; cmd/draind's webhook
// reads and writes the objects around it.
//
// Rotation without a window in which the API server distrusts the webhook:
//
//   - the serving certificate is re-issued when a third of its lifetime is
//     left, the SANs change, or the signing CA changes; the same CA signs
//     it, so the caBundle does not change;
//   - when a third of the signing CA's lifetime is left, a next CA is
//     created and added to the bundle; it signs nothing until every entry
//     of the webhook configuration has published it for PublishDelay (the
//     API servers' watches have picked it up), and only then becomes the
//     signing CA;
//   - a CA leaves the bundle only when it has expired: a replica still
//     serving a certificate of the previous CA is trusted until then.
//
// Replicas race on the Secret with optimistic concurrency (resourceVersion);
// whatever one writes, Plan run by another on the result changes nothing.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package selfcert

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"
)

// Keys of the Secret's data. tls.crt, tls.key and ca.crt are also what
// cert-manager writes, so one reader serves both ways of running.
const (
	KeyCert      = "tls.crt"
	KeyKey       = "tls.key"
	KeyCACert    = "ca.crt" // the signing CA
	KeyCAKey     = "ca.key"
	KeyNextCert  = "next-ca.crt" // a CA published but not yet signing
	KeyNextKey   = "next-ca.key"
	KeyNextSince = "next-ca.published-since" // RFC 3339: when every entry first published it
	KeyBundle    = "ca-bundle.crt"           // every CA clients must trust, PEM
)

// Config says what to issue.
type Config struct {
	// DNSNames and IPs are the serving certificate's SANs (the Service's
	// names; an address for a webhook reached by URL).
	DNSNames []string
	IPs      []net.IP
	// CAValidity and CertValidity are the lifetimes of new certificates.
	CAValidity   time.Duration
	CertValidity time.Duration
	// PublishDelay is how long a next CA must have been published in
	// every webhook entry's caBundle before it signs.
	PublishDelay time.Duration
	// Rand is the entropy source; nil means crypto/rand.
	Rand io.Reader
}

// Validate reports a configuration that could not produce a certificate.
func (c Config) Validate() error {
	if len(c.DNSNames) == 0 && len(c.IPs) == 0 {
		return errors.New("serving certificate: no DNS name or IP")
	}
	if c.CAValidity <= 0 || c.CertValidity <= 0 {
		return errors.New("certificate validities must be positive")
	}
	if c.CertValidity > c.CAValidity {
		return fmt.Errorf("certificate validity %s exceeds the CA's %s", c.CertValidity, c.CAValidity)
	}
	return nil
}

// backdate is how far before now certificates become valid (clock skew
// between the webhook and the API servers), a tenth of the validity for
// short test lifetimes.
func backdate(validity time.Duration) time.Duration {
	return min(time.Minute, validity/10)
}

type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

// Plan returns the data the Secret should hold at now, and what changed
// (empty: nothing; write nothing). cur is the Secret's data; published
// holds the caBundle of every entry of the webhook configuration (nil if
// it could not be read: then no next CA is promoted).
func Plan(cur map[string][]byte, published [][]byte, now time.Time, cfg Config) (map[string][]byte, []string, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	r := cfg.Rand
	if r == nil {
		r = rand.Reader
	}
	var changes []string
	signing, why := parseCA(cur[KeyCACert], cur[KeyCAKey], now)
	next, _ := parseCA(cur[KeyNextCert], cur[KeyNextKey], now)
	nextSince := cur[KeyNextSince]
	if signing == nil && next != nil {
		// The signing CA is gone or expired, but a next one exists (the
		// webhook was down through the promotion): it is in the bundle.
		signing, next, nextSince = next, nil, nil
		changes = append(changes, "next CA promoted early (the signing CA is "+why+")")
	}
	if signing == nil {
		var err error
		if signing, err = newCA(r, now, cfg.CAValidity); err != nil {
			return nil, nil, err
		}
		next, nextSince = nil, nil
		changes = append(changes, "new signing CA ("+why+")")
	}
	if next == nil && nextSince != nil {
		nextSince = nil
	}
	if next == nil && remainingFraction(signing.cert, now) < 1.0/3 {
		var err error
		if next, err = newCA(r, now, cfg.CAValidity); err != nil {
			return nil, nil, err
		}
		nextSince = nil
		changes = append(changes, "next CA created (the signing CA has a third of its lifetime left)")
	}
	if next != nil {
		var promoted string
		if nextSince, promoted = nextCAPublication(next, nextSince, published, now, cfg); promoted != "" {
			signing, next, nextSince = next, nil, nil
			changes = append(changes, promoted)
		}
	}

	out := map[string][]byte{KeyCACert: signing.pem, KeyCAKey: keyPEM(signing.key)}
	if next != nil {
		out[KeyNextCert], out[KeyNextKey] = next.pem, keyPEM(next.key)
	}
	if nextSince != nil {
		out[KeyNextSince] = nextSince
	}
	out[KeyBundle] = bundle(signing, next, cur[KeyBundle], now)

	certPEM, keyPEMBytes := cur[KeyCert], cur[KeyKey]
	if why := servingProblem(certPEM, keyPEMBytes, signing, now, cfg); why != "" {
		var err error
		if certPEM, keyPEMBytes, err = issue(r, signing, now, cfg); err != nil {
			return nil, nil, err
		}
		changes = append(changes, "new serving certificate ("+why+")")
	}
	out[KeyCert], out[KeyKey] = certPEM, keyPEMBytes

	// Values that changed without a decision above are changes too.
	if len(changes) == 0 && !sameData(cur, out) {
		changes = append(changes, unnotedChange(cur, out))
	}
	return out, changes, nil
}

// nextCAPublication notes since when the next CA is in every webhook
// entry's bundle (nil: not yet everywhere), and says why it is promoted to
// signing CA once it has been there for the publish delay ("": not yet).
func nextCAPublication(next *ca, nextSince []byte, published [][]byte, now time.Time, cfg Config) ([]byte, string) {
	switch {
	case !publishedEverywhere(published, next.cert):
		return nil, ""
	case nextSince == nil:
		return []byte(now.UTC().Format(time.RFC3339)), ""
	}
	since, err := time.Parse(time.RFC3339, string(nextSince))
	if err != nil {
		return []byte(now.UTC().Format(time.RFC3339)), ""
	}
	if now.Before(since.Add(cfg.PublishDelay)) {
		return nextSince, ""
	}
	return nextSince, "next CA promoted to signing CA (published since " + since.UTC().Format(time.RFC3339) + ")"
}

// unnotedChange names a change of the data no step of Plan decided.
func unnotedChange(cur, out map[string][]byte) string {
	switch {
	case !bytes.Equal(cur[KeyNextSince], out[KeyNextSince]):
		return "next CA published in every webhook entry (noted)"
	case !bytes.Equal(cur[KeyBundle], out[KeyBundle]):
		return "CA bundle updated (expired CAs removed)"
	}
	return "unknown keys removed"
}

// parseCA reads a CA that can still sign at now, or says why not.
func parseCA(certPEM, keyPEMBytes []byte, now time.Time) (*ca, string) {
	if len(certPEM) == 0 || len(keyPEMBytes) == 0 {
		return nil, "none yet"
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return nil, "unreadable: " + err.Error()
	}
	key, err := parseKey(keyPEMBytes)
	if err != nil {
		return nil, "unreadable key: " + err.Error()
	}
	if !cert.IsCA || !publicKeyMatches(cert, key) {
		return nil, "not a CA with its key"
	}
	if !now.Before(cert.NotAfter) {
		return nil, "expired " + cert.NotAfter.UTC().Format(time.RFC3339)
	}
	return &ca{cert: cert, key: key, pem: certPEM}, ""
}

// servingProblem says why the serving certificate must be re-issued, or "".
func servingProblem(certPEM, keyPEMBytes []byte, signing *ca, now time.Time, cfg Config) string {
	if len(certPEM) == 0 {
		return "none yet"
	}
	cert, err := parseCert(certPEM)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	key, err := parseKey(keyPEMBytes)
	if err != nil || !publicKeyMatches(cert, key) {
		return "its key is missing or does not match"
	}
	if err := cert.CheckSignatureFrom(signing.cert); err != nil {
		return "not signed by the signing CA"
	}
	if !sameSANs(cert, cfg) {
		return "the names changed"
	}
	if remainingFraction(cert, now) < 1.0/3 {
		return "a third of its lifetime left"
	}
	return ""
}

// remainingFraction is the share of the certificate's lifetime left at now.
func remainingFraction(c *x509.Certificate, now time.Time) float64 {
	life := c.NotAfter.Sub(c.NotBefore)
	if life <= 0 {
		return 0
	}
	return float64(c.NotAfter.Sub(now)) / float64(life)
}

// bundle is the signing CA, the next CA, and every CA of the old bundle
// that has not expired, each once, in that order.
func bundle(signing, next *ca, old []byte, now time.Time) []byte {
	var out bytes.Buffer
	seen := map[string]bool{}
	add := func(c *x509.Certificate) {
		if seen[string(c.Raw)] || !now.Before(c.NotAfter) {
			return
		}
		seen[string(c.Raw)] = true
		_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}) // a bytes.Buffer never fails
	}
	add(signing.cert)
	if next != nil {
		add(next.cert)
	}
	for _, c := range parseBundle(old) {
		if c.IsCA {
			add(c)
		}
	}
	return out.Bytes()
}

// publishedEverywhere: every entry's caBundle holds c (and there is at
// least one entry).
func publishedEverywhere(published [][]byte, c *x509.Certificate) bool {
	if len(published) == 0 {
		return false
	}
	for _, b := range published {
		if !slices.ContainsFunc(parseBundle(b), func(p *x509.Certificate) bool { return p.Equal(c) }) {
			return false
		}
	}
	return true
}

func parseBundle(b []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(blk.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// Certificates parses a PEM bundle; for callers checking what is trusted.
func Certificates(b []byte) []*x509.Certificate { return parseBundle(b) }

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(blk.Bytes)
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		if ek, err2 := x509.ParseECPrivateKey(blk.Bytes); err2 == nil {
			return ek, nil
		}
		return nil, err
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("key of type %T cannot sign", k)
	}
	return s, nil
}

func publicKeyMatches(c *x509.Certificate, k crypto.Signer) bool {
	pub, ok := c.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	return ok && pub.Equal(k.Public())
}

func keyPEM(k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		// An ECDSA P-256 key always marshals.
		panic(fmt.Sprintf("marshalling a private key: %v", err))
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func serial(r io.Reader) (*big.Int, error) {
	n, err := rand.Int(r, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("drawing a certificate serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

func newCA(r io.Reader, now time.Time, validity time.Duration) (*ca, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), r)
	if err != nil {
		return nil, fmt.Errorf("generating a CA key: %w", err)
	}
	sn, err := serial(r)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("draind-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-backdate(validity)),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(r, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &ca{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

func issue(r io.Reader, signing *ca, now time.Time, cfg Config) ([]byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), r)
	if err != nil {
		return nil, nil, fmt.Errorf("generating the serving key: %w", err)
	}
	sn, err := serial(r)
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(cfg.CertValidity)
	if notAfter.After(signing.cert.NotAfter) {
		notAfter = signing.cert.NotAfter
	}
	cn := "draind-webhook"
	if len(cfg.DNSNames) > 0 {
		cn = cfg.DNSNames[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-backdate(cfg.CertValidity)),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     cfg.DNSNames,
		IPAddresses:  cfg.IPs,
	}
	der, err := x509.CreateCertificate(r, tmpl, signing.cert, key.Public(), signing.key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing the serving certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM(key), nil
}

func sameSANs(c *x509.Certificate, cfg Config) bool {
	dns := slices.Clone(c.DNSNames)
	want := slices.Clone(cfg.DNSNames)
	slices.Sort(dns)
	slices.Sort(want)
	if !slices.Equal(dns, want) || len(c.IPAddresses) != len(cfg.IPs) {
		return false
	}
	for _, ip := range cfg.IPs {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

// Describe names a serving certificate for logs: serial, issuer, expiry.
func Describe(certPEM []byte) string {
	c, err := parseCert(certPEM)
	if err != nil {
		return "unreadable certificate: " + err.Error()
	}
	return fmt.Sprintf("serial %s issued by %s, valid until %s (%s)", c.SerialNumber.Text(16), c.Issuer.CommonName,
		c.NotAfter.UTC().Format(time.RFC3339), strings.Join(append(slices.Clone(c.DNSNames), ipStrings(c.IPAddresses)...), ","))
}

func ipStrings(ips []net.IP) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}
