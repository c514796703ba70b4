package autotls

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"time"
)

// The keys of the Secret. tls.crt and tls.key are those of a
// kubernetes.io/tls Secret (corev1.TLSCertKey, corev1.TLSPrivateKeyKey).
const (
	// CACertKey is the CA certificate that signs the serving certificate.
	CACertKey = "ca.crt"
	// CAKeyKey is the CA's private key.
	CAKeyKey = "ca.key"
	// CABundleKey is what the APIService's caBundle holds: the current CA
	// first, then earlier CAs that have not expired, so that a serving
	// certificate signed by the previous CA stays trusted during a CA
	// rotation.
	CABundleKey = "ca-bundle.crt"
	// TLSCertKey is the serving certificate.
	TLSCertKey = "tls.crt"
	// TLSKeyKey is the serving certificate's private key.
	TLSKeyKey = "tls.key"
)

// DefaultCAValidity is how long a CA is valid. It is renewed, like the
// serving certificate, when a third of that is left.
const DefaultCAValidity = 10 * 365 * 24 * time.Hour

// maxBundle bounds how many CA certificates the bundle keeps.
const maxBundle = 3

// DNSNames returns the names a serving certificate for service in
// namespace carries. kube-apiserver's aggregator checks
// <service>.<namespace>.svc.
func DNSNames(service, namespace string) []string {
	svc := service + "." + namespace + ".svc"
	return []string{service, service + "." + namespace, svc, svc + ".cluster.local"}
}

// keyPair is a parsed certificate with its private key and their PEM.
type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
	keyPEM  []byte
}

// backdate is how far NotBefore lies in the past, so that a clock behind
// ours still accepts a new certificate.
func backdate(validity time.Duration) time.Duration {
	return min(5*time.Minute, validity/10)
}

// renewAt is when a third of c's lifetime is left.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) * 2 / 3)
}

// newCA creates a self-signed CA valid for validity from now.
func newCA(commonName string, now time.Time, validity time.Duration) (*keyPair, error) {
	if validity <= 0 {
		return nil, fmt.Errorf("CA validity %s is not positive", validity)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", commonName, now.Unix())},
		NotBefore:             now.Add(-backdate(validity)),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	return sign(tmpl, tmpl, key, key)
}

// issueServing issues a serving certificate for dnsNames valid for
// validity from now, but not beyond ca's own expiry.
func (ca *keyPair) issueServing(dnsNames []string, now time.Time, validity time.Duration) (*keyPair, error) {
	if validity <= 0 {
		return nil, fmt.Errorf("certificate validity %s is not positive", validity)
	}
	if len(dnsNames) == 0 {
		return nil, errors.New("a serving certificate needs at least one DNS name")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate serving key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	notBefore := now.Add(-backdate(validity))
	if notBefore.Before(ca.cert.NotBefore) {
		notBefore = ca.cert.NotBefore
	}
	cn := dnsNames[0]
	if len(dnsNames) > 2 {
		cn = dnsNames[2] // <service>.<namespace>.svc
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		DNSNames:     slices.Clone(dnsNames),
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return sign(tmpl, ca.cert, key, ca.key)
}

func sign(tmpl, parent *x509.Certificate, key *ecdsa.PrivateKey, parentKey crypto.Signer) (*keyPair, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		return nil, fmt.Errorf("create certificate %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parse new certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return &keyPair{
		cert:    cert,
		key:     key,
		certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// parseKeyPair parses a PEM certificate (the first one) and its matching
// private key.
func parseKeyPair(certPEM, keyPEM []byte) (*keyPair, error) {
	if len(certPEM) == 0 || len(keyPEM) == 0 {
		return nil, errors.New("missing")
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("private key cannot sign")
	}
	return &keyPair{cert: pair.Leaf, key: signer, certPEM: certPEM, keyPEM: keyPEM}, nil
}

// parseCerts returns every certificate in PEM data, skipping blocks that
// are not certificates or do not parse.
func parseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// encodeCerts is certs as concatenated PEM.
func encodeCerts(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// bundleContains reports whether PEM bundle holds cert.
func bundleContains(bundle []byte, cert *x509.Certificate) bool {
	return slices.ContainsFunc(parseCerts(bundle), cert.Equal)
}

// verifyServing checks that leaf is a serving certificate for dnsName
// issued by one of roots and valid at now.
func verifyServing(leaf *x509.Certificate, roots []*x509.Certificate, dnsName string, now time.Time) error {
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		DNSName:     dnsName,
		Roots:       pool,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	return err
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate serial number: %w", err)
	}
	return n, nil
}
