package coderapi_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

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
