package testenv

import (
	"net/http"
	"sync"
)

// HeaderTransport is an http.RoundTripper that sets headers on the requests
// it sends through Next: a credential, a request ID, or the X-Remote-*
// headers kube-apiserver's front proxy sends.
//
// Each header in Header replaces whatever the request had under that name
// (all of its values, so a header with several values is sent with exactly
// those). Only requests for Host get them, or every request when Host is
// ""; the others go to Next as they are. The headers are set on a clone, as
// http.RoundTripper requires. LastResponse reads the headers of the last
// response Next returned without an error.
type HeaderTransport struct {
	Next   http.RoundTripper
	Host   string
	Header http.Header

	mu   sync.Mutex
	last http.Header
}

// RoundTrip implements http.RoundTripper.
func (h *HeaderTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if h.Host == "" || r.URL.Host == h.Host {
		r = r.Clone(r.Context())
		for k, vs := range h.Header {
			r.Header.Del(k)
			for _, v := range vs {
				r.Header.Add(k, v)
			}
		}
	}
	res, err := h.Next.RoundTrip(r)
	if err == nil {
		h.mu.Lock()
		h.last = res.Header.Clone()
		h.mu.Unlock()
	}
	return res, err
}

// LastResponse is header key of the last response, "" before any.
func (h *HeaderTransport) LastResponse(key string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last.Get(key)
}
