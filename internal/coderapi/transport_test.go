package coderapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/go-logr/logr/funcr"

	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/logging"
	"github.com/coder/coder-k8s/internal/metrics/metricstest"
)

const (
	requestsMetric = "coder_k8s_coder_api_requests_total"
	durationMetric = "coder_k8s_coder_api_request_duration_seconds"
	secretToken    = "s3cr3t-session-token"
)

// statusServer answers GET /api/v2/buildinfo-like paths with the status
// named by the last path segment (/api/v2/status/503), and hangs on
// /api/v2/hang until the client goes away.
func statusServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/hang") {
			<-r.Context().Done()
			return
		}
		code := http.StatusOK
		_, _ = fmt.Sscanf(r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:], "%d", &code)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"message":"answer"}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

type observed struct {
	op     string
	status int
	err    error
}

type observer struct {
	mu  sync.Mutex
	got []observed
}

func (o *observer) observe(op string, status int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, observed{op, status, err})
}

func (o *observer) take() []observed {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.got
	o.got = nil
	return got
}

// TestInstrumentedClient sends requests through a client from NewClient
// and reads back what /metrics would show, what Observe was told and what
// was logged.
func TestInstrumentedClient(t *testing.T) {
	srv := statusServer(t)
	u, _ := url.Parse(srv.URL)
	obs := &observer{}
	cp := "ns/" + t.Name()
	target := coderapi.Target{ControlPlane: cp, Component: "aggregated", Observe: obs.observe}
	c := coderapi.NewClient(u, secretToken, 5*time.Second, target)

	var logMu sync.Mutex
	var logs []string
	log := funcr.New(func(prefix, args string) {
		logMu.Lock()
		defer logMu.Unlock()
		logs = append(logs, args)
	}, funcr.Options{Verbosity: 1})
	takeLogs := func() []string {
		logMu.Lock()
		defer logMu.Unlock()
		out := logs
		logs = nil
		return out
	}
	ctx := logging.WithRequest(context.Background(), log, "req-1")

	count := func(op, code string) float64 {
		return metricstest.Value(t, requestsMetric, map[string]string{"operation": op, "control_plane": cp, "component": "aggregated", "code": code})
	}

	t.Run("answers are counted by status class", func(t *testing.T) {
		for _, code := range []int{200, 204, 404, 401, 503} {
			res, err := c.Request(ctx, http.MethodGet, fmt.Sprintf("/api/v2/status/%d", code), nil)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
		}
		op := "GET /api/v2/status/{id}"
		for code, want := range map[string]float64{"2xx": 2, "4xx": 2, "5xx": 1, "error": 0} {
			if got := count(op, code); got != want {
				t.Errorf("%s code=%s: %v requests, want %v", op, code, got, want)
			}
		}
		if got := metricstest.Value(t, durationMetric, map[string]string{"operation": op, "control_plane": cp, "component": "aggregated"}); got != 5 {
			t.Errorf("duration histogram count %v, want 5", got)
		}
		got := obs.take()
		if len(got) != 5 || got[0].status != 200 || got[4].status != 503 || got[4].err != nil {
			t.Errorf("Observe saw %+v, want the 5 statuses", got)
		}
	})

	t.Run("failures of a request are logged at info level with its ID, the rest at debug level, never the token", func(t *testing.T) {
		all := strings.Join(takeLogs(), "\n")
		if strings.Contains(all, secretToken) {
			t.Errorf("the session token was logged:\n%s", all)
		}
		var failed, debug int
		for _, l := range strings.Split(all, "\n") {
			switch {
			case strings.Contains(l, `"msg"="coderd request failed"`):
				failed++
				if !strings.Contains(l, `"requestID"="req-1"`) || !strings.Contains(l, `"controlPlane"="`+cp+`"`) {
					t.Errorf("failure logged without request ID or control plane: %s", l)
				}
			case strings.Contains(l, `"msg"="coderd request"`):
				debug++
			}
		}
		// 401 and 503 are failures; 200, 204 and 404 are not.
		if failed != 2 || debug != 3 {
			t.Errorf("%d failure lines and %d debug lines, want 2 and 3:\n%s", failed, debug, all)
		}
	})

	t.Run("no answer is an error, the caller giving up is canceled", func(t *testing.T) {
		dead := closedURL(t)
		dc := coderapi.NewClient(dead, secretToken, 5*time.Second, target)
		if _, err := dc.BuildInfo(ctx); err == nil {
			t.Fatal("no error from a closed port")
		}
		if got := count("GET /api/v2/buildinfo", "error"); got != 1 {
			t.Errorf("code=error: %v, want 1", got)
		}
		got := obs.take()
		if len(got) != 1 || got[0].status != 0 || got[0].err == nil {
			t.Errorf("Observe saw %+v, want one transport error", got)
		}
		for _, l := range takeLogs() {
			if strings.Contains(l, "coderd request failed") && strings.Contains(l, dead.Host+"/api") {
				t.Errorf("the request URL was logged: %s", l)
			}
		}

		cctx, cancel := context.WithCancel(ctx)
		time.AfterFunc(100*time.Millisecond, cancel)
		if _, err := c.Request(cctx, http.MethodGet, "/api/v2/hang", nil); err == nil {
			t.Fatal("no error from a canceled request")
		}
		if got := count("GET /api/v2/{id}", "canceled"); got != 1 {
			t.Errorf("code=canceled: %v, want 1", got)
		}
		if got := obs.take(); len(got) != 0 {
			t.Errorf("Observe saw %+v for a request its caller canceled", got)
		}

		slow := coderapi.NewClient(u, secretToken, 100*time.Millisecond, target)
		_, err := slow.Request(ctx, http.MethodGet, "/api/v2/hang", nil)
		var netErr net.Error
		if err == nil || !errors.As(err, &netErr) || !netErr.Timeout() || !strings.Contains(err.Error(), "Client.Timeout exceeded") {
			t.Fatalf("after the client timeout: %v, want http.Client's timeout error", err)
		}
		if n := strings.Count(err.Error(), srv.URL); n != 1 {
			t.Errorf("the error names the URL %d times: %v", n, err)
		}
		if got := count("GET /api/v2/{id}", "error"); got != 1 {
			t.Errorf("client timeout: code=error %v, want 1", got)
		}
		if got := obs.take(); len(got) != 1 || got[0].err == nil {
			t.Errorf("Observe saw %+v, want the timeout", got)
		}
	})

	t.Run("a coderd below a path prefix has the same operations", func(t *testing.T) {
		prefixed, _ := url.Parse(srv.URL + "/coder/")
		pc := coderapi.NewClient(prefixed, "", 5*time.Second, target)
		res, err := pc.Request(ctx, http.MethodGet, "/api/v2/status/200", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if got := count("GET /api/v2/status/{id}", "2xx"); got != 3 {
			t.Errorf("code=2xx after a prefixed request: %v, want 3", got)
		}
		obs.take()
	})

	t.Run("CloseIdleConnections reaches the transport", func(t *testing.T) {
		closed := make(chan struct{}, 10)
		cs := httptest.NewUnstartedServer(srv.Config.Handler)
		cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closed <- struct{}{}
			}
		}
		cs.Start()
		t.Cleanup(cs.Close)
		cu, _ := url.Parse(cs.URL)
		cc := coderapi.NewClient(cu, "", 5*time.Second, coderapi.Target{})
		res, err := cc.Request(ctx, http.MethodGet, "/api/v2/status/200", nil)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		cc.HTTPClient.CloseIdleConnections()
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the idle connection stayed open")
		}
	})
}

// closedURL is an http URL where nothing listens.
func closedURL(t *testing.T) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Fatal(err)
	}
	return &url.URL{Scheme: "http", Host: addr}
}

// recorder is an HTTP server that records every request it receives and
// answers 200.
type recorder struct {
	*httptest.Server
	mu  sync.Mutex
	got []*http.Request
}

func newRecorder(t *testing.T) *recorder {
	t.Helper()
	r := &recorder{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, req.Clone(context.Background()))
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"00000000-0000-0000-0000-000000000001","username":"elsewhere"}`))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *recorder) requests() []*http.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*http.Request(nil), r.got...)
}

// TestRedirectsAreNotFollowed has a coderd that redirects every request
// to another server, which must never see a request, let alone the
// session token or a password, and the caller learns why.
func TestRedirectsAreNotFollowed(t *testing.T) {
	elsewhere := newRecorder(t)
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, elsewhere.URL+r.URL.Path+"?state=secret-state#frag", status)
			}))
			t.Cleanup(redirecting.Close)
			u, _ := url.Parse(redirecting.URL)
			c := coderapi.NewClient(u, secretToken, 5*time.Second, coderapi.Target{ControlPlane: "ns/redirect", Component: "controller"})
			ctx := context.Background()

			_, err := c.User(ctx, codersdk.Me)
			var redirect *coderapi.RedirectError
			if !errors.As(err, &redirect) {
				t.Fatalf("User(me) through a redirecting coderd: %v, want a RedirectError", err)
			}
			wantTarget := elsewhere.URL + "/api/v2/users/me"
			if redirect.Status != status || redirect.Location != wantTarget {
				t.Errorf("RedirectError %+v, want status %d to %s", redirect, status, wantTarget)
			}
			for _, want := range []string{
				fmt.Sprintf("coderd answered GET /api/v2/users/me with a redirect (%d) to %s;", status, wantTarget),
				"coder-k8s does not follow redirects, so no credentials are sent there",
				"configure coderd's final URL",
			} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
			if strings.Contains(err.Error(), "secret-state") {
				t.Errorf("error %q shows the redirect's query", err)
			}

			// A login sends a password in its body: a 307 or 308 would
			// resend it.
			anon := coderapi.NewClient(u, "", 5*time.Second, coderapi.Target{})
			if _, err := anon.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: "owner@example.com", Password: "owner-password"}); !errors.As(err, &redirect) {
				t.Fatalf("login through a redirecting coderd: %v, want a RedirectError", err)
			}
			if got := elsewhere.requests(); len(got) != 0 {
				t.Fatalf("the redirect target received %d requests (first %s %s with token %q)", len(got), got[0].Method, got[0].URL, got[0].Header.Get(codersdk.SessionTokenHeader))
			}
			if got := metricstest.Value(t, requestsMetric, map[string]string{"operation": "GET /api/v2/users/me", "control_plane": "ns/redirect", "component": "controller", "code": "3xx"}); got < 1 {
				t.Errorf("redirect counted %v times as 3xx", got)
			}
		})
	}

	t.Run("a redirect to the same host is refused too", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/api/v2/buildinfo" {
				http.Redirect(w, r, "/coder/api/v2/buildinfo", http.StatusFound)
				return
			}
			t.Errorf("the redirect was followed to %s", r.URL.Path)
		}))
		t.Cleanup(srv.Close)
		u, _ := url.Parse(srv.URL)
		_, err := coderapi.NewClient(u, secretToken, 5*time.Second, coderapi.Target{}).BuildInfo(context.Background())
		if err == nil || !strings.Contains(err.Error(), "redirect (302) to "+srv.URL+"/coder/api/v2/buildinfo") {
			t.Fatalf("got %v, want the redirect refused", err)
		}
	})
}

// TestResponseSizeLimit has a coderd whose answers exceed
// MaxResponseBytes: the caller gets an error naming the limit instead of
// a truncated answer.
func TestResponseSizeLimit(t *testing.T) {
	limit := coderapi.MaxResponseBytes
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api/v2/buildinfo":
			// Declares more than the limit, then sends nothing.
			w.Header().Set("Content-Length", strconv.FormatInt(limit+1, 10))
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/api/v2/workspaces":
			// A valid JSON answer one byte longer than the limit, sent
			// without a length: cut at the limit it would still parse
			// as a shorter list.
			const head, tail = `{"workspaces":[`, `],"count":0}`
			w.WriteHeader(http.StatusOK)
			chunk := []byte(strings.Repeat(`{}, `, 16<<10))
			n := int64(len(head) + len(tail))
			_, _ = w.Write([]byte(head))
			for n+int64(len(chunk)) < limit+1 {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				n += int64(len(chunk))
			}
			rest := int(limit + 1 - n)
			pad := strings.Repeat(" ", rest-2) + "{}"
			_, _ = w.Write([]byte(pad + tail))
		}
	}))
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	c := coderapi.NewClient(u, secretToken, time.Minute, coderapi.Target{})
	ctx := context.Background()

	_, err := c.BuildInfo(ctx)
	var tooLarge *coderapi.ResponseTooLargeError
	if !errors.As(err, &tooLarge) || !strings.Contains(err.Error(), "coderd's response to GET /api/v2/buildinfo is larger than 256 MiB, the most coder-k8s reads from coderd") {
		t.Fatalf("a declared length over the limit: %v, want a ResponseTooLargeError", err)
	}

	_, err = c.Workspaces(ctx, codersdk.WorkspaceFilter{})
	if !errors.As(err, &tooLarge) || !strings.Contains(err.Error(), "coderd's response to GET /api/v2/workspaces is larger than 256 MiB") {
		t.Fatalf("an answer one byte over the limit: %v, want a ResponseTooLargeError", err)
	}
}

// TestClientKeepsParallelConnections sends rounds of MaxParallel requests
// at once: the connections of the first round are kept alive and reused,
// not closed beyond net/http's default of 2 idle per host and dialled
// again.
func TestClientKeepsParallelConnections(t *testing.T) {
	var mu sync.Mutex
	conns := 0
	inRound := make(chan struct{}, coderapi.MaxParallel)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every request of a round is in flight at once, so a round needs
		// MaxParallel connections.
		inRound <- struct{}{}
		for len(inRound) < coderapi.MaxParallel {
			time.Sleep(time.Millisecond)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`[]`))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := coderapi.NewClient(u, "", 10*time.Second, coderapi.Target{})
	const rounds = 3
	for round := range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, coderapi.MaxParallel)
		for range coderapi.MaxParallel {
			wg.Go(func() {
				if _, err := c.WorkspaceBuildParameters(t.Context(), [16]byte{1}); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", round, err)
		}
		for len(inRound) > 0 {
			<-inRound
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != coderapi.MaxParallel {
		t.Errorf("%d rounds of %d requests at once opened %d connections; want %d, kept alive and reused", rounds, coderapi.MaxParallel, conns, coderapi.MaxParallel)
	}
}
