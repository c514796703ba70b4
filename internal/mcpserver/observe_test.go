package mcpserver

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/metrics/metricstest"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// logLines collects a logger's output.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) write(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

func (l *logLines) find(parts ...string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return line
		}
	}
	return ""
}

func (l *logLines) all() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// requestIDs sets X-Request-Id on every request (when id is not empty)
// and keeps the X-Request-Id of the responses.
type requestIDs struct {
	token, id string
	next      http.RoundTripper

	mu   sync.Mutex
	seen []string
}

func (r *requestIDs) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("Authorization", "Bearer "+r.token)
	if r.id != "" {
		req.Header.Set(requestIDHeader, r.id)
	}
	res, err := r.next.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.seen = append(r.seen, res.Header.Get(requestIDHeader))
		r.mu.Unlock()
	}
	return res, err
}

func (r *requestIDs) last() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		return ""
	}
	return r.seen[len(r.seen)-1]
}

// TestToolCallMetricsAndRequestIDs calls tools as ServiceAccounts with
// real RBAC on a real kube-apiserver and checks what /metrics counts for
// each outcome, the X-Request-Id of the responses, and the log lines of
// the calls (request ID and caller, never the token).
func TestToolCallMetricsAndRequestIDs(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver")
	}
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	h := newHarness(t, k, nil)
	logs := &logLines{}
	o := defaultOptions()
	o.Kube = Kube{Cached: h.c, Direct: h.c, Clientset: k.Clientset}
	o.REST = k.Config
	o.Ready = func(*http.Request) error { return nil }
	o.Log = funcr.New(logs.write, funcr.Options{Verbosity: 1})
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)

	agentToken := h.serviceAccountToken(t, "agents", "agent")
	nobodyToken := h.serviceAccountToken(t, "agents", "nobody")
	h.grant(t, "agents", "agent", "", rbacv1.PolicyRule{
		APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"},
	})
	connect := func(ids *requestIDs) *mcp.ClientSession {
		return mcpclient.MustConnect(t, hs.URL+"/mcp", mcpclient.Options{Transport: ids})
	}
	agentIDs := &requestIDs{token: agentToken, id: "agent-call-1", next: http.DefaultTransport}
	agent := connect(agentIDs)
	nobodyIDs := &requestIDs{token: nobodyToken, id: "bad id\twith spaces", next: http.DefaultTransport}
	nobody := connect(nobodyIDs)

	count := func(tool, outcome string) float64 {
		return metricstest.Value(t, "coder_k8s_mcp_tool_calls_total", map[string]string{"tool": tool, "outcome": outcome})
	}
	calls := []struct {
		what          string
		session       *mcp.ClientSession
		tool          string
		args          map[string]any
		label, result string
	}{
		{"allowed", agent, "list_control_planes", map[string]any{}, "list_control_planes", "ok"},
		{"RBAC refuses", nobody, "list_control_planes", map[string]any{}, "list_control_planes", "denied"},
		{"not found", agent, "get_control_plane", map[string]any{"namespace": "default", "name": "missing"}, "get_control_plane", "error"},
		{"ill-typed arguments", agent, "list_control_planes", map[string]any{"limit": "many"}, "list_control_planes", "invalid"},
		{"unknown tool", agent, "no_such_tool", map[string]any{}, unknownTool, "invalid"},
	}
	for _, c := range calls {
		before := count(c.label, c.result)
		durBefore := metricstest.Value(t, "coder_k8s_mcp_tool_call_duration_seconds", map[string]string{"tool": c.label})
		res := callTool(t, c.session, c.tool, c.args, nil)
		if res.IsError != (c.result != "ok") {
			t.Errorf("%s: isError=%v: %s", c.what, res.IsError, resultText(res))
		}
		if got := count(c.label, c.result); got != before+1 {
			t.Errorf("%s: tool=%s outcome=%s went from %v to %v, want +1", c.what, c.label, c.result, before, got)
		}
		if got := metricstest.Value(t, "coder_k8s_mcp_tool_call_duration_seconds", map[string]string{"tool": c.label}); got != durBefore+1 {
			t.Errorf("%s: duration count of %s went from %v to %v, want +1", c.what, c.label, durBefore, got)
		}
	}
	if s := metricstest.Series(t, "coder_k8s_mcp_tool_calls_total", map[string]string{"tool": "no_such_tool"}); len(s) != 0 {
		t.Error("an unknown tool's name became a label value")
	}

	t.Run("responses carry the caller's sane request ID, or a new one", func(t *testing.T) {
		if got := agentIDs.last(); got != "agent-call-1" {
			t.Errorf("X-Request-Id %q, want the caller's agent-call-1", got)
		}
		got := nobodyIDs.last()
		if got == "" || strings.ContainsAny(got, " \t") {
			t.Errorf("X-Request-Id %q for a caller's unusable ID, want a new one", got)
		}
	})

	t.Run("tool calls are logged with the request ID and the caller", func(t *testing.T) {
		agentUser := "system:serviceaccount:agents:agent"
		if l := logs.find(`"tool call"`, `"requestID"="agent-call-1"`, `"user"="`+agentUser+`"`, `"tool"="get_control_plane"`, `"outcome"="error"`); l == "" {
			t.Errorf("no info line for the failed call with request ID and user:\n%s", logs.all())
		}
		if l := logs.find(`"tool call"`, `"requestID"="`+nobodyIDs.last()+`"`, `"outcome"="denied"`, `"user"="system:serviceaccount:agents:nobody"`); l == "" {
			t.Errorf("no line for the denied call with the generated request ID:\n%s", logs.all())
		}
		if all := logs.all(); strings.Contains(all, agentToken) || strings.Contains(all, nobodyToken) {
			t.Error("a bearer token was logged")
		}
	})
}
