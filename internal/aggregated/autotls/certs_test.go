package autotls

import (
	"crypto/tls"
	"crypto/x509"
	"slices"
	"testing"
	"time"
)

func TestDNSNames(t *testing.T) {
	got := DNSNames("coder-k8s", "coder-system")
	want := []string{"coder-k8s", "coder-k8s.coder-system", "coder-k8s.coder-system.svc", "coder-k8s.coder-system.svc.cluster.local"}
	if !slices.Equal(got, want) {
		t.Fatalf("DNSNames = %v, want %v", got, want)
	}
}

func TestCAAndServingCertificate(t *testing.T) {
	now := time.Now()
	ca, err := newCA("coder-k8s-ca", now, DefaultCAValidity)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.cert.IsCA || ca.cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		t.Errorf("CA: IsCA=%v keyUsage=%v", ca.cert.IsCA, ca.cert.KeyUsage)
	}
	if d := ca.cert.NotAfter.Sub(now); d < DefaultCAValidity-time.Second || d > DefaultCAValidity {
		t.Errorf("CA valid for %s after now, want 10 years", d)
	}
	if !ca.cert.NotBefore.Before(now) {
		t.Errorf("CA NotBefore %s is not backdated", ca.cert.NotBefore)
	}
	if _, err := tls.X509KeyPair(ca.certPEM, ca.keyPEM); err != nil {
		t.Errorf("CA key does not match: %v", err)
	}

	names := DNSNames("coder-k8s", "coder-system")
	validity := 30 * 24 * time.Hour
	leaf, err := ca.issueServing(names, now, validity)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(leaf.certPEM, leaf.keyPEM); err != nil {
		t.Errorf("serving key does not match: %v", err)
	}
	if leaf.cert.IsCA {
		t.Error("serving certificate is a CA")
	}
	if !slices.Equal(leaf.cert.DNSNames, names) {
		t.Errorf("DNS names %v, want %v", leaf.cert.DNSNames, names)
	}
	if got := leaf.cert.NotAfter.Sub(now); got < validity-time.Second || got > validity {
		t.Errorf("serving certificate valid for %s after now, want %s", got, validity)
	}
	if got, want := renewAt(leaf.cert), leaf.cert.NotBefore.Add(leaf.cert.NotAfter.Sub(leaf.cert.NotBefore)*2/3); !got.Equal(want) {
		t.Errorf("renewAt = %s, want %s", got, want)
	}
	// kube-apiserver verifies <service>.<namespace>.svc; every name works.
	for _, n := range names {
		if err := verifyServing(leaf.cert, []*x509.Certificate{ca.cert}, n, now); err != nil {
			t.Errorf("verify %s: %v", n, err)
		}
	}
	if err := verifyServing(leaf.cert, []*x509.Certificate{ca.cert}, "other.coder-system.svc", now); err == nil {
		t.Error("verifies for a name it does not carry")
	}
	if err := verifyServing(leaf.cert, []*x509.Certificate{ca.cert}, names[2], now.Add(validity+time.Minute)); err == nil {
		t.Error("verifies after expiry")
	}
	other, err := newCA("other", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := verifyServing(leaf.cert, []*x509.Certificate{other.cert}, names[2], now); err == nil {
		t.Error("verifies against another CA")
	}
	if !bundleContains(encodeCerts([]*x509.Certificate{other.cert, ca.cert}), ca.cert) || bundleContains(other.certPEM, ca.cert) {
		t.Error("bundleContains is wrong")
	}
}

func TestServingCertificateEndsWithItsCA(t *testing.T) {
	now := time.Now()
	ca, err := newCA("ca", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.issueServing(DNSNames("s", "ns"), now, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.cert.NotAfter.Equal(ca.cert.NotAfter) {
		t.Errorf("serving certificate expires %s, after its CA (%s)", leaf.cert.NotAfter, ca.cert.NotAfter)
	}
}

func TestParseKeyPairRejectsMismatch(t *testing.T) {
	now := time.Now()
	a, _ := newCA("a", now, time.Hour)
	b, _ := newCA("b", now, time.Hour)
	if _, err := parseKeyPair(a.certPEM, b.keyPEM); err == nil {
		t.Error("a certificate with another key's private key parsed")
	}
	if _, err := parseKeyPair(nil, a.keyPEM); err == nil {
		t.Error("a missing certificate parsed")
	}
	if kp, err := parseKeyPair(a.certPEM, a.keyPEM); err != nil || !kp.cert.Equal(a.cert) {
		t.Errorf("parse a valid pair: %v", err)
	}
}
