package selfcert

import (
	"bytes"
	"crypto/x509"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"
)

var cfg = Config{
	DNSNames:     []string{"draind-webhook.draind-system.svc"},
	IPs:          []net.IP{net.ParseIP("127.0.0.1")},
	CAValidity:   300 * 24 * time.Hour,
	CertValidity: 30 * 24 * time.Hour,
	PublishDelay: 5 * time.Minute,
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// verifies: the serving certificate of data chains to a CA of trusted and
// names the Service at now.
func verifies(data map[string][]byte, trusted []byte, now time.Time) error {
	cert, err := parseCert(data[KeyCert])
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	for _, c := range Certificates(trusted) {
		pool.AddCert(c)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: cfg.DNSNames[0], CurrentTime: now})
	return err
}

func plan(t *testing.T, cur map[string][]byte, published [][]byte, now time.Time) (map[string][]byte, []string) {
	t.Helper()
	out, changes, err := Plan(cur, published, now, cfg)
	if err != nil {
		t.Fatal(err)
	}
	again, more, err := Plan(out, published, now, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(more) != 0 || !sameData(out, again) {
		t.Fatalf("Plan is not a fixed point: planning its own result again changes %q", more)
	}
	return out, changes
}

func hasChange(changes []string, s string) bool {
	for _, c := range changes {
		if strings.Contains(c, s) {
			return true
		}
	}
	return false
}

func TestPlanSteps(t *testing.T) {
	// An empty Secret: a CA and a certificate it signs.
	d, ch := plan(t, nil, nil, t0)
	if !hasChange(ch, "new signing CA") || !hasChange(ch, "new serving certificate") {
		t.Fatalf("changes %q", ch)
	}
	if err := verifies(d, d[KeyBundle], t0); err != nil {
		t.Fatalf("fresh certificate does not verify against the bundle: %v", err)
	}
	if n := len(Certificates(d[KeyBundle])); n != 1 {
		t.Fatalf("bundle of %d CAs", n)
	}
	cert, _ := parseCert(d[KeyCert])
	if !cert.IPAddresses[0].Equal(cfg.IPs[0]) {
		t.Errorf("IP SANs %v", cert.IPAddresses)
	}
	ca1 := d[KeyCACert]
	published := [][]byte{d[KeyBundle], d[KeyBundle]}

	// Nothing to do a day later.
	if _, ch := plan(t, d, published, t0.Add(24*time.Hour)); len(ch) != 0 {
		t.Errorf("a day later: changes %q", ch)
	}
	// 21 of 30 days: a third of the certificate's lifetime is left.
	now := t0.Add(21 * 24 * time.Hour)
	d2, ch := plan(t, d, published, now)
	if !hasChange(ch, "a third of its lifetime") || bytes.Equal(d2[KeyCert], d[KeyCert]) {
		t.Fatalf("changes %q", ch)
	}
	if !bytes.Equal(d2[KeyCACert], ca1) || !bytes.Equal(d2[KeyBundle], d[KeyBundle]) {
		t.Error("re-issuing the serving certificate changed the CA or the bundle")
	}
	// New names: re-issued.
	other := cfg
	other.DNSNames = []string{"x.draind-system.svc"}
	if _, ch, _ := Plan(d2, published, now, other); !hasChange(ch, "names changed") {
		t.Errorf("new names: changes %q", ch)
	}

	// 201 of 300 days: a next CA joins the bundle; the old CA still signs.
	now = t0.Add(201 * 24 * time.Hour)
	d3, ch := plan(t, d2, published, now)
	if !hasChange(ch, "next CA created") {
		t.Fatalf("changes %q", ch)
	}
	if len(Certificates(d3[KeyBundle])) != 2 || !bytes.Equal(d3[KeyCACert], ca1) || d3[KeyNextCert] == nil {
		t.Fatalf("after the next CA: %d CAs in the bundle, signing CA changed %v", len(Certificates(d3[KeyBundle])), !bytes.Equal(d3[KeyCACert], ca1))
	}
	cert3, _ := parseCert(d3[KeyCert])
	ca1c, _ := parseCert(ca1)
	if cert3.CheckSignatureFrom(ca1c) != nil {
		t.Error("the serving certificate is not the old CA's while the next CA is unpublished")
	}
	// Not promoted while any entry lacks it, or before PublishDelay.
	for _, pub := range [][][]byte{nil, {d3[KeyBundle], d2[KeyBundle]}} {
		if d4, ch := plan(t, d3, pub, now.Add(time.Hour)); len(ch) != 0 || d4[KeyNextSince] != nil {
			t.Errorf("published %d entries, not all with the next CA: changes %q, since %s", len(pub), ch, d4[KeyNextSince])
		}
	}
	published = [][]byte{d3[KeyBundle], d3[KeyBundle]}
	d4, ch := plan(t, d3, published, now.Add(time.Minute))
	if !hasChange(ch, "(noted)") || len(ch) != 1 || string(d4[KeyNextSince]) != now.Add(time.Minute).Format(time.RFC3339) ||
		!bytes.Equal(d4[KeyCACert], ca1) || !bytes.Equal(d4[KeyCert], d3[KeyCert]) {
		t.Fatalf("first seen published: changes %q (only the time is noted), since %q", ch, d4[KeyNextSince])
	}
	if d5, ch := plan(t, d4, published, now.Add(5*time.Minute)); len(ch) != 0 || !bytes.Equal(d5[KeyCACert], ca1) {
		t.Errorf("promoted before PublishDelay: %q", ch)
	}
	d6, ch := plan(t, d4, published, now.Add(6*time.Minute))
	if !hasChange(ch, "promoted") || !hasChange(ch, "not signed by the signing CA") {
		t.Fatalf("changes %q", ch)
	}
	if !bytes.Equal(d6[KeyCACert], d3[KeyNextCert]) || d6[KeyNextCert] != nil || d6[KeyNextSince] != nil {
		t.Error("the next CA did not become the signing CA")
	}
	if err := verifies(d6, d3[KeyBundle], now.Add(6*time.Minute)); err != nil {
		t.Errorf("the new serving certificate does not verify against the bundle published before: %v", err)
	}
	if len(Certificates(d6[KeyBundle])) != 2 {
		t.Error("the old CA left the bundle before it expired")
	}
	// The old CA expires: it leaves the bundle.
	d7, ch := plan(t, d6, [][]byte{d6[KeyBundle]}, t0.Add(301*24*time.Hour))
	if len(Certificates(d7[KeyBundle])) != 1 || len(ch) == 0 {
		t.Errorf("after the old CA expired: %d CAs, changes %q", len(Certificates(d7[KeyBundle])), ch)
	}
}

// TestPlanNeverUntrusted runs the webhook's loop over three CA lifetimes
// with irregular check intervals, publishing the bundle after each Secret
// write as the webhook does. At every step the serving certificate the
// Secret holds verifies against the bundle the API server had *before*
// this step's publication: a certificate is never served that the API
// server could not yet trust.
func TestPlanNeverUntrusted(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var data map[string][]byte
	var published []byte
	now := t0
	cas := map[string]bool{}
	certs := 0
	var lastCert []byte
	for now.Before(t0.Add(3 * cfg.CAValidity)) {
		next, _, err := Plan(data, [][]byte{published}, now, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if published != nil {
			if err := verifies(next, published, now); err != nil {
				t.Fatalf("at %s the serving certificate is not trusted by the published bundle: %v", now, err)
			}
		}
		data, published = next, next[KeyBundle]
		cas[string(data[KeyCACert])] = true
		if !bytes.Equal(lastCert, data[KeyCert]) {
			certs++
			lastCert = data[KeyCert]
		}
		now = now.Add(time.Duration(rng.Int64N(int64(36 * time.Hour))))
	}
	if len(cas) < 3 || certs < 20 {
		t.Errorf("%d CAs and %d serving certificates over three CA lifetimes: the rotation did not run", len(cas), certs)
	}
}

func TestPlanRepairs(t *testing.T) {
	d, _ := plan(t, nil, nil, t0)
	for name, mod := range map[string]func(map[string][]byte){
		"garbage certificate": func(m map[string][]byte) { m[KeyCert] = []byte("x") },
		"key of another pair": func(m map[string][]byte) { m[KeyKey] = m[KeyCAKey] },
		"garbage CA":          func(m map[string][]byte) { m[KeyCACert] = []byte("y") },
	} {
		t.Run(name, func(t *testing.T) {
			m := map[string][]byte{}
			for k, v := range d {
				m[k] = v
			}
			mod(m)
			out, ch := plan(t, m, nil, t0)
			if len(ch) == 0 {
				t.Fatal("no change")
			}
			if err := verifies(out, out[KeyBundle], t0); err != nil {
				t.Error(err)
			}
		})
	}
	// The signing CA expired while the webhook was down, the next CA is
	// there: the next CA takes over.
	d3, _ := plan(t, d, nil, t0.Add(250*24*time.Hour))
	if d3[KeyNextCert] == nil {
		t.Fatal("no next CA")
	}
	late := t0.Add(301 * 24 * time.Hour)
	d4, ch := plan(t, d3, nil, late)
	if !hasChange(ch, "promoted early") || !bytes.Equal(d4[KeyCACert], d3[KeyNextCert]) {
		t.Errorf("changes %q", ch)
	}
	if err := verifies(d4, d3[KeyBundle], late); err != nil {
		t.Errorf("not trusted by the bundle that held the next CA: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{CAValidity: time.Hour, CertValidity: time.Minute},
		{DNSNames: []string{"a"}, CAValidity: time.Hour},
		{DNSNames: []string{"a"}, CAValidity: time.Hour, CertValidity: 2 * time.Hour},
	} {
		if _, _, err := Plan(nil, nil, t0, c); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}
