package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/client-go/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestMetrics runs the operator in all mode against the real stack, uses it
// as people and agents do (kubectl get, a watch, MCP tool calls), then
// scrapes /metrics for the coder_k8s_ series an SRE would look at, and
// finds the request IDs of those requests in the operator's log.
func TestMetrics(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "metrics", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	ws, err := s.coder.CreateWorkspace(ctx, "metrics", "metrics-ws")
	if err != nil {
		t.Fatal(err)
	}
	wsName := s.workspaceName("metrics-ws")

	// kubectl: a list, and a watch, which keeps the poller polling.
	waitFor(t, 60*time.Second, func() error {
		out, err := s.run("get", "coderworkspaces", "-n", s.ns)
		if err != nil {
			return err
		}
		if !strings.Contains(out, wsName) {
			return errNotYet("kubectl get coderworkspaces shows no " + wsName + ":\n" + out)
		}
		return nil
	})
	watch := s.startKubectl(t, "get", "coderworkspaces", "-n", s.ns, "-w")
	watch.waitLine(t, 60*time.Second, wsName)

	// A GET through kube-apiserver with our own Audit-ID, which
	// kube-apiserver forwards to the aggregated API server.
	const auditID = "e2e-metrics-audit-1"
	hc, err := rest.HTTPClientFor(s.k.Config)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/apis/%s/namespaces/%s/coderworkspaces/%s",
		strings.TrimSuffix(s.k.Config.Host, "/"), aggv1.SchemeGroupVersion, s.ns, wsName), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Audit-ID", auditID)
	res, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Header.Get("Audit-ID") != auditID {
		t.Fatalf("GET coderworkspace %s: %s, Audit-ID %q", wsName, res.Status, res.Header.Get("Audit-ID"))
	}

	// MCP: an agent lists workspaces and checks health (which asks coderd
	// itself), sending its own request ID.
	const mcpRequestID = "e2e-metrics-mcp-1"
	token := e2eMCPServiceAccountToken(t, s, "metrics-agent")
	e2eMCPGrant(t, s, "metrics-agent", "", []rbacv1.PolicyRule{
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"coder.com"}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
	}...)
	ids := &headerTransport{set: map[string]string{"Authorization": "Bearer " + token, "X-Request-Id": mcpRequestID}, next: http.DefaultTransport}
	client := mcp.NewClient(&mcp.Implementation{Name: "coder-k8s-e2e-metrics", Version: "v0"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.op.MCP + "/mcp",
		HTTPClient: &http.Client{Timeout: time.Minute, Transport: ids}, DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { session.Close() })
	for _, call := range []*mcp.CallToolParams{
		{Name: "list_workspaces", Arguments: map[string]any{"namespace": s.ns}},
		{Name: "health", Arguments: map[string]any{"namespace": s.ns}},
	} {
		res, err := session.CallTool(ctx, call)
		if err != nil || res.IsError {
			t.Fatalf("%s: %v %+v", call.Name, err, res)
		}
	}
	if got := ids.lastResponse("X-Request-Id"); got != mcpRequestID {
		t.Errorf("MCP response X-Request-Id %q, want the caller's %q", got, mcpRequestID)
	}

	cp := s.ns + "/coder"
	var families map[string]*dto.MetricFamily
	// The watch's poller runs every second; scrape until it has reported.
	waitFor(t, 30*time.Second, func() error {
		families = scrapeMetrics(t, s.op.Metrics+"/metrics")
		if seriesSum(families, "coder_k8s_poller_lag_seconds", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}) == nil {
			return errNotYet("no poller lag yet")
		}
		return nil
	})

	t.Run("the series a user looks for have their labels and counts", func(t *testing.T) {
		for _, c := range []struct {
			metric string
			labels map[string]string
			check  func(float64) bool
			want   string
		}{
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "controller", "control_plane": cp, "operation": "GET /api/v2/users/me", "code": "2xx"}, metricPositive, "> 0"},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/workspaces", "code": "2xx"}, metricPositive, "> 0"},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/users/{id}/workspace/{id}", "code": "2xx"}, metricPositive, "> 0"},
			{"coder_k8s_coder_api_request_duration_seconds", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/workspaces"}, metricPositive, "count > 0"},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "mcp", "control_plane": cp, "operation": "GET /api/v2/buildinfo", "code": "2xx"}, metricPositive, "> 0"},
			{"coder_k8s_mcp_tool_calls_total", map[string]string{"tool": "list_workspaces", "outcome": "ok"}, metricPositive, "> 0"},
			{"coder_k8s_mcp_tool_call_duration_seconds", map[string]string{"tool": "health"}, metricPositive, "count > 0"},
			{"coder_k8s_poller_objects", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}, metricPositive, "> 0"},
			{"coder_k8s_poller_watchers", map[string]string{"kind": "CoderWorkspace"}, metricPositive, "> 0"},
			{"coder_k8s_poller_lag_seconds", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}, func(v float64) bool { return v >= 0 && v < 30 }, "in [0, 30)"},
		} {
			v := seriesSum(families, c.metric, c.labels)
			if v == nil || !c.check(*v) {
				t.Errorf("%s%v = %v, want %s; series:\n%s", c.metric, c.labels, v, c.want, describeMetricFamily(families[c.metric]))
			}
		}
	})

	t.Run("operations are routes, not names or IDs", func(t *testing.T) {
		route := regexp.MustCompile(`^[A-Z]+ (/([a-z0-9-]+|\{id\}))+$`)
		for _, m := range families["coder_k8s_coder_api_requests_total"].GetMetric() {
			op := metricLabel(m, "operation")
			if !route.MatchString(op) || strings.Contains(op, ws.ID.String()) || strings.Contains(op, "metrics-ws") || strings.Contains(op, s.coder.Username) {
				t.Errorf("operation %q", op)
			}
		}
		for name, f := range families {
			if strings.HasPrefix(name, "coder_k8s_") && f.GetHelp() == "" {
				t.Errorf("%s has no HELP", name)
			}
		}
	})

	t.Run("aggregated-apiserver and mcp-http modes serve their metrics too", func(t *testing.T) {
		checkStandaloneMetrics(t, s, token, wsName)
	})

	t.Run("the log has the requests' IDs", func(t *testing.T) {
		log := testenv.LogTail(s.op.LogPath, 100000)
		find := func(parts ...string) bool {
			for _, l := range strings.Split(log, "\n") {
				ok := true
				for _, p := range parts {
					ok = ok && strings.Contains(l, p)
				}
				if ok {
					return true
				}
			}
			return false
		}
		if !find("coderd request", auditID, "GET /api/v2/users/{id}/workspace/{id}") {
			t.Errorf("no log line for the GET's coderd request with its Audit-ID %s", auditID)
		}
		if !find("tool call", mcpRequestID, "list_workspaces", "system:serviceaccount:agents:metrics-agent") {
			t.Errorf("no log line for the MCP tool call with its request ID %s and caller", mcpRequestID)
		}
		if strings.Contains(log, token) || strings.Contains(log, s.coder.SessionToken) {
			t.Error("a token is in the operator's log")
		}
	})
}

func metricPositive(v float64) bool { return v > 0 }

// checkStandaloneMetrics runs the aggregated-apiserver (static backend on
// the stack's coderd) and mcp-http modes next to the stack, uses each
// once, and scrapes their own /metrics.
func checkStandaloneMetrics(t *testing.T, s *aggStack, token, wsName string) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeTokenFile(t, tokenFile, s.coder.SessionToken)
	agg := StartOperator(t, OperatorOptions{Mode: "aggregated-apiserver", Kubeconfig: s.k.KubeconfigPath,
		Aggregated: fmt.Sprintf(`coder: {staticBackend: {url: %q, sessionTokenFile: %q, namespace: %s}}`, s.coder.URL.String(), tokenFile, s.ns)})
	mcpOnly := StartOperator(t, OperatorOptions{Mode: "mcp-http", Kubeconfig: s.k.KubeconfigPath})
	agg.WaitOK(t, agg.Aggregated+"/readyz")
	mcpOnly.WaitOK(t, mcpOnly.MCP+"/readyz")

	// The admin's client certificate straight to the aggregated API server
	// (delegated authentication), which asks coderd.
	tlsCfg, err := rest.TLSConfigFor(s.k.Config)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg.InsecureSkipVerify = true //nolint:gosec // self-signed fallback certificate
	tlsCfg.RootCAs = nil
	admin := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
	waitFor(t, 60*time.Second, func() error {
		res, err := admin.Get(fmt.Sprintf("%s/apis/%s/namespaces/%s/coderworkspaces", agg.Aggregated, aggv1.SchemeGroupVersion, s.ns))
		if err != nil {
			return err
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			return err
		}
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), wsName) {
			return errNotYet(fmt.Sprintf("list: %s %.300s", res.Status, body))
		}
		return nil
	})

	session, err := mcp.NewClient(&mcp.Implementation{Name: "coder-k8s-e2e-metrics", Version: "v0"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: mcpOnly.MCP + "/mcp", DisableStandaloneSSE: true, HTTPClient: &http.Client{Timeout: time.Minute,
			Transport: &headerTransport{set: map[string]string{"Authorization": "Bearer " + token}, next: http.DefaultTransport}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	if res, err := session.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_control_planes", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("list_control_planes: %v %+v", err, res)
	}

	labels := map[string]string{"component": "aggregated", "control_plane": "static", "operation": "GET /api/v2/workspaces", "code": "2xx"}
	if v := seriesSum(scrapeMetrics(t, agg.Metrics+"/metrics"), "coder_k8s_coder_api_requests_total", labels); v == nil || *v <= 0 {
		t.Errorf("aggregated-apiserver mode: coder_k8s_coder_api_requests_total%v = %v, want > 0", labels, v)
	}
	labels = map[string]string{"tool": "list_control_planes", "outcome": "ok"}
	if v := seriesSum(scrapeMetrics(t, mcpOnly.Metrics+"/metrics"), "coder_k8s_mcp_tool_calls_total", labels); v == nil || *v != 1 {
		t.Errorf("mcp-http mode: coder_k8s_mcp_tool_calls_total%v = %v, want 1", labels, v)
	}
}

// headerTransport sets headers on every request and keeps the last
// response's headers.
type headerTransport struct {
	set  map[string]string
	next http.RoundTripper
	last http.Header
}

func (h *headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.set {
		r.Header.Set(k, v)
	}
	res, err := h.next.RoundTrip(r)
	if err == nil {
		h.last = res.Header.Clone()
	}
	return res, err
}

func (h *headerTransport) lastResponse(key string) string { return h.last.Get(key) }

// scrapeMetrics reads and parses the Prometheus text at url.
func scrapeMetrics(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s %v", url, res.Status, err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return families
}

// seriesSum adds up the series of metric whose labels include labels (a
// histogram counts its observations); nil when there is none.
func seriesSum(families map[string]*dto.MetricFamily, metric string, labels map[string]string) *float64 {
	var total float64
	found := false
	for _, m := range families[metric].GetMetric() {
		match := true
		for k, v := range labels {
			match = match && metricLabel(m, k) == v
		}
		if !match {
			continue
		}
		found = true
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	if !found {
		return nil
	}
	return &total
}

func metricLabel(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func describeMetricFamily(f *dto.MetricFamily) string {
	var b strings.Builder
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			fmt.Fprintf(&b, "%s=%q ", l.GetName(), l.GetValue())
		}
		b.WriteString("\n")
	}
	return b.String()
}
