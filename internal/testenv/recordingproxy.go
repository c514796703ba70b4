package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
)

// RecordingProxy is a server a test runs in front of a real coderd: it
// forwards every request to coderd, so a client finds a working coderd at
// URL, and keeps everything it was sent (headers, query, body), to check
// that no credential reached it. It also keeps the session tokens coderd
// answered password logins with, to check that they were logged out.
type RecordingProxy struct {
	// URL is where the proxy listens (http://127.0.0.1:PORT).
	URL *url.URL

	srv *http.Server
	mu  sync.Mutex
	got []RecordedRequest
}

// RecordedRequest is one request a RecordingProxy received.
type RecordedRequest struct {
	Method, Path, RawQuery string
	Header                 http.Header
	Body                   []byte
	// SessionToken is what coderd answered a successful
	// POST /api/v2/users/login with.
	SessionToken string
}

// NewRecordingProxy starts a RecordingProxy forwarding to target and
// stops it when the test ends.
func NewRecordingProxy(t testing.TB, target *url.URL) *RecordingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("recording proxy: listen: %v", err)
	}
	p := &RecordingProxy{URL: &url.URL{Scheme: "http", Host: l.Addr().String()}}
	rp := &httputil.ReverseProxy{
		Rewrite:  func(r *httputil.ProxyRequest) { r.SetURL(target) },
		ErrorLog: log.New(io.Discard, "", 0),
		ModifyResponse: func(res *http.Response) error {
			if res.Request.URL.Path != "/api/v2/users/login" || res.StatusCode != http.StatusCreated {
				return nil
			}
			body, err := io.ReadAll(res.Body)
			if err != nil {
				return err
			}
			res.Body = io.NopCloser(bytes.NewReader(body))
			var login struct {
				SessionToken string `json:"session_token"`
			}
			if err := json.Unmarshal(body, &login); err != nil {
				return err
			}
			idx, _ := res.Request.Context().Value(recordIndex{}).(int)
			p.mu.Lock()
			p.got[idx].SessionToken = login.SessionToken
			p.mu.Unlock()
			return nil
		},
	}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		p.mu.Lock()
		idx := len(p.got)
		p.got = append(p.got, RecordedRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Header: r.Header.Clone(), Body: body})
		p.mu.Unlock()
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), recordIndex{}, idx)))
	})}
	go func() { _ = p.srv.Serve(l) }()
	t.Cleanup(func() { _ = p.srv.Close() })
	return p
}

type recordIndex struct{}

// Requests are the requests received so far, oldest first.
func (p *RecordingProxy) Requests() []RecordedRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]RecordedRequest(nil), p.got...)
}

// SessionTokens are the session tokens coderd handed out through p.
func (p *RecordingProxy) SessionTokens() []string {
	var out []string
	for _, r := range p.Requests() {
		if r.SessionToken != "" {
			out = append(out, r.SessionToken)
		}
	}
	return out
}

// RequireNoCredential fails t when p received nothing (the check would
// show nothing), or when any request carried a Coder-Session-Token or
// Authorization header, a cookie, a session token in its query, or any of
// secrets anywhere in its headers, query or body.
func (p *RecordingProxy) RequireNoCredential(t testing.TB, secrets []string) {
	t.Helper()
	reqs := p.Requests()
	if len(reqs) == 0 {
		t.Fatal("the recording proxy received no request: the check shows nothing")
	}
	for _, r := range reqs {
		what := r.Method + " " + r.Path
		for _, h := range []string{"Coder-Session-Token", "Authorization", "Cookie"} {
			if r.Header.Get(h) != "" {
				t.Errorf("%s carried a %s header", what, h)
			}
		}
		if strings.Contains(strings.ToLower(r.RawQuery), "token") {
			t.Errorf("%s carried a token in its query", what)
		}
		for _, s := range secrets {
			if s == "" {
				continue
			}
			for name, vals := range r.Header {
				for _, v := range vals {
					if strings.Contains(v, s) {
						t.Errorf("%s carried a credential in header %s", what, name)
					}
				}
			}
			if strings.Contains(r.RawQuery, s) || bytes.Contains(r.Body, []byte(s)) {
				t.Errorf("%s carried a credential in its query or body", what)
			}
		}
	}
}
