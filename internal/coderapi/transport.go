package coderapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/coder/coder-k8s/internal/logging"
	"github.com/coder/coder-k8s/internal/metrics"
)

// Target says which coderd a client talks to and for which component,
// for metrics and logs.
type Target struct {
	// ControlPlane is the control_plane label:
	// metrics.ControlPlane(namespace, name), or metrics.StaticControlPlane.
	ControlPlane string
	// Component is the component label: metrics.ComponentController,
	// ComponentAggregated or ComponentMCP.
	Component string
	// Observe, when set, is told about every request coderd answered
	// (status, err nil) or did not answer (status 0, err), but not about
	// requests whose caller gave up first. It runs on the request's
	// goroutine: keep it short.
	Observe func(operation string, status int, err error)
}

// ForControlPlaneTarget is the Target of a client acting on the control
// plane namespace/name.
func ForControlPlaneTarget(namespace, name, component string) Target {
	return Target{ControlPlane: metrics.ControlPlane(namespace, name), Component: component}
}

// instrumented counts and times every request to coderd, and logs it with
// the logger of the request's context (if any).
//
// It sends requests through a client of its own that holds the timeout:
// http.Client enforces its Timeout with the request's context, and reports
// it as "Client.Timeout exceeded", only for transports it knows, which a
// wrapper is not. The caller's client has no timeout, so the context a
// request arrives with is the caller's own.
type instrumented struct {
	transport *http.Transport
	client    *http.Client // transport with the timeout
	base      string       // the client URL's path, left out of operations
	target    Target
}

func newInstrumented(u *url.URL, transport *http.Transport, timeout time.Duration, target Target) *instrumented {
	return &instrumented{
		transport: transport,
		// Redirects come back as responses: roundTrip refuses them.
		client: &http.Client{Transport: transport, Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}},
		base:   strings.TrimSuffix(u.Path, "/"),
		target: target,
	}
}

func (t *instrumented) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	var resp *http.Response
	var err error
	if req.Header.Get("Upgrade") != "" {
		// A websocket (build logs) needs the connection itself as the
		// response body, which a client with a timeout would wrap; it
		// bounds its dial with its context.
		resp, err = t.transport.RoundTrip(req)
	} else {
		resp, err = t.client.Do(req) //nolint:bodyclose // returned to the caller
		if ue, ok := err.(*url.Error); ok {
			// The caller's client wraps it in the same again.
			err = ue.Err
		}
	}
	if err == nil {
		resp, err = checkResponse(req, resp)
	}
	d := time.Since(start)

	ctx := req.Context()
	op := Operation(req.Method, t.routePath(req.URL.Path))
	status, code := 0, ""
	var redirect *RedirectError
	switch {
	case err == nil:
		status = resp.StatusCode
		code = statusClass(status)
	case errors.As(err, &redirect):
		// coderd answered, but with nothing a caller may use.
		code = statusClass(redirect.Status)
	case errors.Is(ctx.Err(), context.Canceled):
		code = metrics.CodeCanceled
	default:
		code = metrics.CodeError
	}
	metrics.ObserveCoderRequest(op, t.target.ControlPlane, t.target.Component, code, d)
	if t.target.Observe != nil && code != metrics.CodeCanceled {
		t.target.Observe(op, status, err)
	}
	t.log(ctx, op, status, code, d, err)
	return resp, err
}

// MaxResponseBytes bounds the body of every response from coderd, so a
// misbehaving coderd cannot make coder-k8s hold unbounded memory. It is
// above real answers: coderd accepts uploads (template source archives,
// read back by downloads) of at most 100 MiB (coderd.HTTPFileMaxBytes),
// and the list of all workspaces, read in one answer, holds 10,000
// workspaces of up to 26 KiB each (measured: 2.7 KiB for a workspace
// without agents; agents, apps and scripts add a few KiB each).
const MaxResponseBytes int64 = 256 << 20

// ResponseTooLargeError is a coderd response body beyond MaxResponseBytes:
// it is cut off there with this error, never decoded as a shorter answer.
type ResponseTooLargeError struct {
	Operation string
	Limit     int64
}

func (e *ResponseTooLargeError) Error() string {
	return fmt.Sprintf("coderd's response to %s is larger than %d MiB, the most coder-k8s reads from coderd", e.Operation, e.Limit>>20)
}

// RedirectError is a redirect from coderd. Redirects are never followed:
// Go's client would send the Coder-Session-Token header (it drops only
// Authorization and cookies) to wherever coderd points, another host
// included.
type RedirectError struct {
	Operation string
	Status    int
	// Location is where coderd pointed, without query or user
	// information.
	Location string
}

func (e *RedirectError) Error() string {
	return fmt.Sprintf("coderd answered %s with a redirect (%d) to %s; coder-k8s does not follow redirects, so no credentials are sent there: configure coderd's final URL (the one it serves from without redirecting)",
		e.Operation, e.Status, e.Location)
}

// checkResponse turns a redirect into a RedirectError and bounds the body
// of every other response but a protocol switch (a websocket's body is the
// connection).
func checkResponse(req *http.Request, resp *http.Response) (*http.Response, error) {
	op := req.Method + " " + req.URL.Path
	switch resp.StatusCode {
	case http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect:
		_ = resp.Body.Close()
		return nil, &RedirectError{Operation: op, Status: resp.StatusCode, Location: redirectTarget(req.URL, resp.Header.Get("Location"))}
	case http.StatusSwitchingProtocols:
		return resp, nil
	}
	tooLarge := &ResponseTooLargeError{Operation: op, Limit: MaxResponseBytes}
	if resp.ContentLength > MaxResponseBytes {
		_ = resp.Body.Close()
		return nil, tooLarge
	}
	resp.Body = &limitedBody{body: resp.Body, left: MaxResponseBytes, err: tooLarge}
	return resp, nil
}

// redirectTarget is the absolute form of a Location header without its
// query, fragment and user information, which may hold more than a place.
func redirectTarget(base *url.URL, location string) string {
	if location == "" {
		return "(no Location header)"
	}
	u, err := base.Parse(location)
	if err != nil {
		return fmt.Sprintf("an unparsable location (%v)", err)
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// limitedBody reads at most left bytes and fails with err beyond them.
type limitedBody struct {
	body io.ReadCloser
	left int64
	err  error
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left < 0 {
		return 0, b.err
	}
	// Read one byte past the limit to tell a body of exactly the limit
	// from a longer one.
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.body.Read(p)
	b.left -= int64(n)
	if b.left < 0 {
		return n + int(b.left), b.err
	}
	return n, err
}

func (b *limitedBody) Close() error { return b.body.Close() }

// log writes one line per request at debug level, and failures that
// concern a user's request (the context carries a request ID) at info
// level: coderd unreachable, 5xx, a rejected token (401), throttling.
// The URL is left out: its query may hold more than the route says.
func (t *instrumented) log(ctx context.Context, op string, status int, code string, d time.Duration, err error) {
	log, lerr := logr.FromContext(ctx)
	if lerr != nil {
		return
	}
	kv := []any{"operation", op, "controlPlane", t.target.ControlPlane, "code", code, "duration", d}
	if status != 0 {
		kv = append(kv, "status", status)
	}
	if err != nil {
		kv = append(kv, "error", TransportError(err))
	}
	failed := code == metrics.CodeError || status >= 500 || status == http.StatusUnauthorized || status == http.StatusTooManyRequests
	if failed && logging.RequestID(ctx) != "" {
		log.Info("coderd request failed", kv...)
		return
	}
	log.V(1).Info("coderd request", kv...)
}

// routePath strips the client URL's path (coderd served below a prefix).
func (t *instrumented) routePath(p string) string {
	if t.base != "" && strings.HasPrefix(p, t.base+"/") {
		return p[len(t.base):]
	}
	return p
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (t *instrumented) CloseIdleConnections() { t.transport.CloseIdleConnections() }

func statusClass(status int) string {
	if status < 100 || status > 599 {
		return "other"
	}
	return strconv.Itoa(status/100) + "xx"
}

// TransportError is the text of a request error without the request URL,
// whose query may hold more than the route says.
func TransportError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Op + ": " + ue.Err.Error()
	}
	return err.Error()
}
