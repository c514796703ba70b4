package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CountingProxy is a reverse proxy on loopback in front of one server (for
// example coderd) that counts the requests it forwards: point a client at
// URL instead of the server to see how many calls it makes, and to which
// endpoints. SetDelay makes it a slow server.
type CountingProxy struct {
	// URL is where the proxy listens (http://127.0.0.1:PORT).
	URL *url.URL

	srv *http.Server
	// delay holds each request this long before forwarding it;
	// abandoned counts the requests whose client left during it.
	delay, abandoned atomic.Int64

	mu    sync.Mutex
	stats map[string]EndpointStats
	// onAnswer holds hooks by endpoint (see OnAnswer).
	onAnswer map[string]func()
	// recent holds the last recentSize requests, oldest first once full
	// (from next on).
	recent []Request
	next   int
}

// recentSize bounds the requests CountingProxy.Recent remembers.
const recentSize = 4096

// Request is one forwarded request.
type Request struct {
	// Endpoint is "METHOD endpoint" (see Endpoint).
	Endpoint string
	// Start is when the request arrived; End when its response was done.
	Start, End time.Time
	// Bytes is the size of the response body.
	Bytes int64
	// Status is the response's HTTP status code.
	Status int
}

// EndpointStats is what the proxy saw of one endpoint.
type EndpointStats struct {
	// Requests is the number of requests forwarded, counted when
	// forwarding starts: a client that has its answer finds its request
	// counted (the proxy finishes its own bookkeeping after the client
	// may have read the response).
	Requests int64
	// Time is their summed duration, from the request's arrival at the
	// proxy to the end of the response (streams count until they end),
	// added once a request ends.
	Time time.Duration
	// Bytes is the summed size of their response bodies.
	Bytes int64
}

// StartCountingProxy starts a proxy forwarding every request to target.
// Streaming responses are flushed at once and connection upgrades
// (WebSockets) are passed through.
func StartCountingProxy(target *url.URL) (*CountingProxy, error) {
	if target == nil || target.Host == "" {
		return nil, errors.New("counting proxy: target URL has no host")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("counting proxy: listen: %w", err)
	}
	p := &CountingProxy{
		URL:   &url.URL{Scheme: "http", Host: l.Addr().String()},
		stats: map[string]EndpointStats{},
	}
	rp := &httputil.ReverseProxy{
		// SetURL also sets the Host header to the target's, so the server
		// sees requests as if they came to it directly.
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		FlushInterval: -1,
		// A stopped target is a case tests make on purpose: the client
		// sees 502, the test log need not.
		ErrorLog:       log.New(io.Discard, "", 0),
		ModifyResponse: p.holdAnswer,
	}
	p.srv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			start := time.Now()
			if d := time.Duration(p.delay.Load()); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-r.Context().Done():
					// The client gave up: nothing to forward, and
					// nothing held for it.
					t.Stop()
					p.abandoned.Add(1)
					return
				}
			}
			endpoint := r.Method + " " + Endpoint(r.URL.Path)
			p.count(endpoint)
			cw := &countingWriter{ResponseWriter: w, add: func(n int64) { p.addBytes(endpoint, n) }}
			rp.ServeHTTP(cw, r)
			p.record(Request{Endpoint: endpoint, Start: start, End: time.Now(), Bytes: cw.n, Status: cw.status()})
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// NewCountingProxy starts a CountingProxy for a test and stops it when the
// test ends.
func NewCountingProxy(t testing.TB, target *url.URL) *CountingProxy {
	t.Helper()
	p, err := StartCountingProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// countingWriter counts the body bytes of a response and keeps its
// status code; Unwrap lets the
// reverse proxy flush and hijack (upgrades) through it. It adds each write
// to the proxy's figures before passing it on, so that a client that has
// read a response finds all its bytes in Stats.
type countingWriter struct {
	http.ResponseWriter
	n    int64
	code int
	add  func(n int64)
}

func (w *countingWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// status is the status code sent (200 when the handler wrote a body
// without one, 0 when it wrote nothing).
func (w *countingWriter) status() int {
	if w.code == 0 && w.n > 0 {
		return http.StatusOK
	}
	return w.code
}

func (w *countingWriter) Write(b []byte) (int, error) {
	w.add(int64(len(b)))
	n, err := w.ResponseWriter.Write(b)
	if n < len(b) {
		w.add(int64(n - len(b)))
	}
	w.n += int64(n)
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// count counts a request of endpoint as it starts being forwarded.
func (p *CountingProxy) count(endpoint string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats[endpoint]
	s.Requests++
	p.stats[endpoint] = s
}

// addBytes counts n bytes of a response of endpoint as they are written.
func (p *CountingProxy) addBytes(endpoint string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats[endpoint]
	s.Bytes += n
	p.stats[endpoint] = s
}

// record adds an ended request's time (its bytes were counted as they
// were written).
func (p *CountingProxy) record(r Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats[r.Endpoint]
	s.Time += r.End.Sub(r.Start)
	p.stats[r.Endpoint] = s
	if len(p.recent) < recentSize {
		p.recent = append(p.recent, r)
		return
	}
	p.recent[p.next] = r
	p.next = (p.next + 1) % recentSize
}

// Recent returns the last few thousand requests in the order they ended.
func (p *CountingProxy) Recent() []Request {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Request, 0, len(p.recent))
	out = append(out, p.recent[p.next:]...)
	return append(out, p.recent[:p.next]...)
}

// Stats returns a copy of the figures so far, by "METHOD endpoint" (see
// Endpoint). Subtract two snapshots with Since to look at a window.
func (p *CountingProxy) Stats() ProxyStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(ProxyStats, len(p.stats))
	for k, v := range p.stats {
		out[k] = v
	}
	return out
}

// SetDelay holds every request that arrives from now on for d before
// forwarding it (0 forwards at once): coderd as a slow server. A client
// that gives up during the delay gets no answer and the request is not
// forwarded.
func (p *CountingProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// OnAnswer makes the proxy call f with every answer to endpoint ("METHOD
// endpoint", see Endpoint) once the server has sent all of it, and pass
// the answer on when f returns: what f makes the server do reaches the
// client after an answer that predates it. nil f removes the hook.
func (p *CountingProxy) OnAnswer(endpoint string, f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.onAnswer == nil {
		p.onAnswer = map[string]func(){}
	}
	if f == nil {
		delete(p.onAnswer, endpoint)
		return
	}
	p.onAnswer[endpoint] = f
}

// holdAnswer runs the OnAnswer hook of res's endpoint, if any, with res's
// body read in full.
func (p *CountingProxy) holdAnswer(res *http.Response) error {
	p.mu.Lock()
	f := p.onAnswer[res.Request.Method+" "+Endpoint(res.Request.URL.Path)]
	p.mu.Unlock()
	if f == nil {
		return nil
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		return err
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	f()
	return nil
}

// Abandoned is the number of requests whose client gave up while they were
// delayed; they are not forwarded and not in Stats or Recent.
func (p *CountingProxy) Abandoned() int64 { return p.abandoned.Load() }

// Stop closes the proxy's listener and connections.
func (p *CountingProxy) Stop() { _ = p.srv.Close() }

// ProxyStats maps "METHOD endpoint" to what the proxy saw of it.
type ProxyStats map[string]EndpointStats

// Since returns the requests made after the snapshot before.
func (s ProxyStats) Since(before ProxyStats) ProxyStats {
	out := ProxyStats{}
	for k, v := range s {
		d := EndpointStats{Requests: v.Requests - before[k].Requests, Time: v.Time - before[k].Time, Bytes: v.Bytes - before[k].Bytes}
		if d.Requests != 0 {
			out[k] = d
		}
	}
	return out
}

// Requests is the number of requests of every endpoint.
func (s ProxyStats) Requests() int64 {
	var n int64
	for _, v := range s {
		n += v.Requests
	}
	return n
}

// String lists the endpoints, most requested first, as
// "GET /api/v2/workspaces ×3 (avg 12ms)".
func (s ProxyStats) String() string {
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if s[keys[i]].Requests != s[keys[j]].Requests {
			return s[keys[i]].Requests > s[keys[j]].Requests
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		v := s[k]
		parts[i] = fmt.Sprintf("%s ×%d (avg %s)", k, v.Requests, (v.Time / time.Duration(v.Requests)).Round(100*time.Microsecond))
	}
	if len(parts) == 0 {
		return "(none)"
	}
	return strings.Join(parts, ", ")
}

var uuidSegment = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// Endpoint is path with every UUID segment replaced by "{id}", so that
// requests about different objects count as one endpoint.
func Endpoint(path string) string {
	segs := strings.Split(path, "/")
	for i, s := range segs {
		if uuidSegment.MatchString(s) {
			segs[i] = "{id}"
		}
	}
	return strings.Join(segs, "/")
}
