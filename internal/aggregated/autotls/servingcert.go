package autotls

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"sync"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
)

// ServingCert is the serving certificate and key the Rotator keeps in the
// Secret, as a dynamiccertificates.CertKeyContentProvider: the aggregated
// API server's TLS configuration reloads when it changes, without a
// restart.
type ServingCert struct {
	name string

	mu        sync.RWMutex
	cert, key []byte
	listeners []dynamiccertificates.Listener
	ready     chan struct{}
}

var _ dynamiccertificates.CertKeyContentProvider = (*ServingCert)(nil)

// NewServingCert returns an empty provider called name.
func NewServingCert(name string) *ServingCert {
	return &ServingCert{name: name, ready: make(chan struct{})}
}

// Name identifies the certificate in the API server's logs.
func (s *ServingCert) Name() string { return s.name }

// CurrentCertKeyContent returns the PEM certificate and key, or nils
// before the first Set.
func (s *ServingCert) CurrentCertKeyContent() ([]byte, []byte) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.cert, s.key
}

// AddListener registers l to be told when the certificate changes.
func (s *ServingCert) AddListener(l dynamiccertificates.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listeners = append(s.listeners, l)
}

// Set replaces the certificate and key after checking that they form a
// pair, and tells the listeners. It reports whether anything changed.
func (s *ServingCert) Set(cert, key []byte) (bool, error) {
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		return false, fmt.Errorf("serving certificate: %w", err)
	}
	s.mu.Lock()
	if bytes.Equal(cert, s.cert) && bytes.Equal(key, s.key) {
		s.mu.Unlock()
		return false, nil
	}
	first := s.cert == nil
	s.cert, s.key = bytes.Clone(cert), bytes.Clone(key)
	listeners := append([]dynamiccertificates.Listener(nil), s.listeners...)
	s.mu.Unlock()
	if first {
		close(s.ready)
	}
	for _, l := range listeners {
		l.Enqueue()
	}
	return true, nil
}

// WaitForContent returns once a certificate has been Set, or with ctx's
// error.
func (s *ServingCert) WaitForContent(ctx context.Context) error {
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
