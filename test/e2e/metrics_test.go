package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// TestMetrics runs the operator in all mode against the real stack, uses it
// as people and agents do (kubectl get, a watch, MCP tool calls), then
// scrapes /metrics for the coder_k8s_ series an SRE would look at, checks
// their counts against what coderd was actually asked (a counting proxy in
// front of it), finds the request IDs of those requests in the operator's
// log, and finds no credential in the log, /metrics or events: neither
// the owner's, the operator's nor any token coder-k8s sent coderd, among
// them those it minted for the mapped callers (the stack runs Mapped).
func TestMetrics(t *testing.T) {
	// coder/coder adopts the stack's coderd through a counting proxy: what
	// the proxy forwarded is every request coder-k8s made for that control
	// plane; a recording proxy behind it keeps their tokens.
	s := newStack(t, withCoderdRecorder())
	ctx := context.Background()
	cp := s.ns + "/coder"
	if _, err := s.coder.PushTemplate(ctx, "metrics", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	ws, err := s.coder.CreateWorkspace(ctx, "metrics", "metrics-ws")
	if err != nil {
		t.Fatal(err)
	}
	wsName := s.workspaceName("metrics-ws")

	// A second control plane adopts a coderd without users: the operator
	// creates its first user and keeps the password in Secret
	// <control plane>-admin, another credential that must not leak.
	const freshNS = "fresh"
	fresh := testenv.NewCoder(t, testenv.CoderOptions{SkipFirstUser: true, Postgres: s.coder.Postgres})
	createAdoptingControlPlane(t, s, freshNS, "coder", fresh.URL.String(), "")

	// kubectl: a list, and a watch, which keeps the poller polling.
	testenv.WaitFor(t, 60*time.Second, func() error {
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
	ids := &testenv.HeaderTransport{Next: http.DefaultTransport, Header: http.Header{"Authorization": {"Bearer " + token}, "X-Request-Id": {mcpRequestID}}}
	session, err := mcpclient.Connect(ctx, s.op.MCP+"/mcp", mcpclient.Options{Transport: ids})
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
	if got := ids.LastResponse("X-Request-Id"); got != mcpRequestID {
		t.Errorf("MCP response X-Request-Id %q, want the caller's %q", got, mcpRequestID)
	}
	freshCCP := waitOperatorAccess(t, s, freshNS, "coder", fresh.URL.String(), 60*time.Second)

	var families map[string]*dto.MetricFamily
	// The watch's poller runs every second; scrape until it has reported.
	testenv.WaitFor(t, 30*time.Second, func() error {
		families = scrapeMetrics(t, s.op.Metrics+"/metrics")
		if seriesSum(families, "coder_k8s_poller_lag_seconds", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}) == nil {
			return errNotYet("no poller lag yet")
		}
		return nil
	})
	t.Run("while a watch is open the poller reports it, the cached workspace and its lag", func(t *testing.T) {
		checkSeries(t, families, []metricWant{
			{"coder_k8s_poller_objects", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}, exactly(1)},
			{"coder_k8s_poller_watchers", map[string]string{"kind": "CoderWorkspace"}, exactly(1)},
			{"coder_k8s_poller_lag_seconds", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"},
				metricCheck{func(v float64) bool { return v >= 0 && v < 30 }, "in [0, 30)"}},
		})
	})

	// Counters are compared once nothing is in flight: with the watch
	// closed the poller stops, and nothing else asks coderd until the
	// controller's next access check, minutes away.
	watch.stop()
	families, forwarded := settledCoderRequests(t, s.op.Metrics+"/metrics", cp, s.proxy)

	t.Run("the series a user looks for have their labels and exact counts", func(t *testing.T) {
		// What the test did: one GET of the workspace, one list_workspaces
		// and one health call (one build info request to coderd).
		// Everything else is what coderd was asked through the proxy.
		t.Logf("coderd was asked, through the proxy: %v", forwarded)
		lists, checks := forwarded["GET /api/v2/workspaces"], forwarded["GET /api/v2/users/me"]
		if lists == 0 || checks == 0 {
			t.Fatalf("coderd was asked for %v workspace lists and %v token checks through the proxy, want some of each: %v", lists, checks, forwarded)
		}
		checkSeries(t, families, []metricWant{
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "controller", "control_plane": cp, "operation": "GET /api/v2/users/me", "code": "2xx"}, exactly(checks)},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/workspaces", "code": "2xx"}, exactly(lists)},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/users/{id}/workspace/{id}", "code": "2xx"}, exactly(1)},
			{"coder_k8s_coder_api_request_duration_seconds", map[string]string{"component": "aggregated", "control_plane": cp, "operation": "GET /api/v2/workspaces"}, exactly(lists)},
			{"coder_k8s_coder_api_requests_total", map[string]string{"component": "mcp", "control_plane": cp, "operation": "GET /api/v2/buildinfo", "code": "2xx"}, exactly(1)},
			{"coder_k8s_mcp_tool_calls_total", map[string]string{"tool": "list_workspaces", "outcome": "ok"}, exactly(1)},
			{"coder_k8s_mcp_tool_calls_total", map[string]string{"tool": "health", "outcome": "ok"}, exactly(1)},
			{"coder_k8s_mcp_tool_call_duration_seconds", map[string]string{"tool": "health"}, exactly(1)},
			{"coder_k8s_poller_objects", map[string]string{"control_plane": cp, "kind": "CoderWorkspace"}, exactly(1)},
			{"coder_k8s_poller_watchers", map[string]string{"kind": "CoderWorkspace"}, exactly(0)},
		})
		// Lag is reported only while someone watches.
		if v := seriesSum(families, "coder_k8s_poller_lag_seconds", map[string]string{"control_plane": cp}); v != nil {
			t.Errorf("coder_k8s_poller_lag_seconds{control_plane=%q} = %v with no watch open, want no series", cp, *v)
		}
	})

	t.Run("every request to coderd is counted once, under its operation", func(t *testing.T) {
		checkCountedAsForwarded(t, families, cp, forwarded)
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

	// The standalone processes' logs and /metrics, read before they stop.
	outputs := map[string]string{}
	var standaloneTokens []string
	t.Run("aggregated-apiserver and mcp-http modes serve their metrics too", func(t *testing.T) {
		var out map[string]string
		out, standaloneTokens = checkStandaloneMetrics(t, s, token, wsName)
		maps.Copy(outputs, out)
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
	})

	t.Run("no credential in the logs, /metrics or events", func(t *testing.T) {
		secrets := map[string]string{
			"the owner token":                   s.coder.SessionToken,
			"the agent's bearer token":          token,
			"the operator token of " + cp:       operatorToken(t, s, waitOperatorAccess(t, s, s.ns, "coder", s.coderURL(), 10*time.Second)),
			"the operator token of fresh/coder": operatorToken(t, s, freshCCP),
			"the first user's password in Secret " + freshNS + "/" + operatoraccess.AdminSecretName(freshCCP): secretValue(t, s, freshNS, operatoraccess.AdminSecretName(freshCCP), "password"),
		}
		// The tokens coder-k8s sent coderd that the test does not know
		// otherwise: those minted for the mapped callers.
		minted := 0
		for _, tok := range append(sessionTokensSent(s.recorder), standaloneTokens...) {
			if !slices.Contains(slices.Collect(maps.Values(secrets)), tok) {
				minted++
				secrets[fmt.Sprintf("token %d coder-k8s minted and sent coderd", minted)] = tok
			}
		}
		if minted == 0 {
			t.Errorf("coder-k8s sent coderd only the owner's and the operator's tokens: the mapped callers' tokens are not checked")
		}
		for what, v := range maps.Clone(secrets) {
			// A Coder API key's secret half alone must not show either.
			if _, after, ok := strings.Cut(v, "-"); ok && len(after) >= 16 {
				secrets[what+" after its first dash"] = after
			}
		}
		if len(outputs) != 4 {
			t.Errorf("read %d outputs of the standalone processes, want their logs and /metrics", len(outputs))
		}
		maps.Copy(outputs, processOutputs(t, s.op))
		outputs["the kubectl watch's output"] = watch.output()
		outputs["events"] = allEvents(t, s)
		for where, out := range outputs {
			if len(out) == 0 {
				t.Errorf("%s is empty", where)
			}
			for what, v := range secrets {
				if strings.Contains(out, v) {
					t.Errorf("%s is in %s", what, where)
				}
			}
		}
	})
}

// metricWant is a series (the sum of those whose labels include labels)
// and what its value must be.
type metricWant struct {
	metric string
	labels map[string]string
	want   metricCheck
}

type metricCheck struct {
	ok   func(float64) bool
	desc string
}

func exactly[N int | int64 | float64](n N) metricCheck {
	return metricCheck{func(v float64) bool { return v == float64(n) }, fmt.Sprintf("exactly %v", n)}
}

func checkSeries(t *testing.T, families map[string]*dto.MetricFamily, wants []metricWant) {
	t.Helper()
	for _, c := range wants {
		v := seriesSum(families, c.metric, c.labels)
		if v == nil || !c.want.ok(*v) {
			got := "no series"
			if v != nil {
				got = strconv.FormatFloat(*v, 'f', -1, 64)
			}
			t.Errorf("%s%v = %s, want %s; series:\n%s", c.metric, c.labels, got, c.want.desc, describeMetricFamily(families[c.metric]))
		}
	}
}

// settledCoderRequests waits until neither the counters of requests to
// coderd for control plane cp on metricsURL nor the requests proxy
// forwarded have changed for a few poll intervals, and returns the last
// scrape and the requests forwarded by operation (coderapi.Operation).
func settledCoderRequests(t *testing.T, metricsURL, cp string, proxy *testenv.CountingProxy) (map[string]*dto.MetricFamily, map[string]float64) {
	t.Helper()
	const quiet, timeout = 3 * pollInterval, 60 * time.Second
	start := time.Now()
	var last string
	since := start
	for {
		families := scrapeMetrics(t, metricsURL)
		forwarded := forwardedByOperation(proxy)
		state := fmt.Sprint(countedByOperation(families, cp), forwarded)
		switch {
		case state != last:
			last, since = state, time.Now()
		case time.Since(since) >= quiet:
			t.Logf("requests to coderd for %s settled after %s", cp, time.Since(start).Round(time.Millisecond))
			return families, forwarded
		}
		if time.Since(start) > timeout {
			t.Fatalf("requests to coderd for %s still changing after %s (counted, forwarded): %s", cp, timeout, state)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// countedByOperation adds up coder_k8s_coder_api_requests_total of control
// plane cp by operation, over components and codes.
func countedByOperation(families map[string]*dto.MetricFamily, cp string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range families["coder_k8s_coder_api_requests_total"].GetMetric() {
		if metricLabel(m, "control_plane") == cp {
			out[metricLabel(m, "operation")] += m.GetCounter().GetValue()
		}
	}
	return out
}

// forwardedByOperation is what proxy forwarded, by the operation
// coder-k8s names each request with.
func forwardedByOperation(proxy *testenv.CountingProxy) map[string]float64 {
	out := map[string]float64{}
	for endpoint, st := range proxy.Stats() {
		method, path, _ := strings.Cut(endpoint, " ")
		out[coderapi.Operation(method, path)] += float64(st.Requests)
	}
	return out
}

// checkCountedAsForwarded requires the request counters of control plane
// cp to add up, operation by operation, to what coderd was asked.
func checkCountedAsForwarded(t *testing.T, families map[string]*dto.MetricFamily, cp string, forwarded map[string]float64) {
	t.Helper()
	counted := countedByOperation(families, cp)
	if len(forwarded) == 0 {
		t.Fatalf("the proxy forwarded nothing for %s", cp)
	}
	ops := maps.Clone(counted)
	maps.Copy(ops, forwarded)
	for op := range ops {
		if counted[op] != forwarded[op] {
			t.Errorf("%s: coder_k8s_coder_api_requests_total{control_plane=%q} adds up to %v, coderd was asked %v times", op, cp, counted[op], forwarded[op])
		}
	}
	if t.Failed() {
		t.Logf("counted by operation: %v", counted)
		t.Logf("forwarded by operation: %v", forwarded)
	}
}

// processOutputs is what an operator process wrote to its log and serves
// on /metrics now.
func processOutputs(t *testing.T, op *Operator) map[string]string {
	t.Helper()
	log, err := os.ReadFile(op.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	_, metrics := scrapeMetricsText(t, op.Metrics+"/metrics")
	return map[string]string{op.Name + " log": string(log), op.Name + " /metrics": metrics}
}

// allEvents is every Event in the cluster (core and events.k8s.io), as
// JSON.
func allEvents(t *testing.T, s *aggStack) string {
	t.Helper()
	ctx := context.Background()
	core, err := s.k.Clientset.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := s.k.Clientset.EventsV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal([]any{core, ev})
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// checkStandaloneMetrics runs the aggregated-apiserver (static backend on
// the stack's coderd, through a counting proxy of its own) and mcp-http
// modes next to the stack, uses each once, and checks their own /metrics
// against what they did. It returns both processes' logs and /metrics
// (processOutputs) and the session tokens the static backend sent coderd.
func checkStandaloneMetrics(t *testing.T, s *aggStack, token, wsName string) (map[string]string, []string) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeTokenFile(t, tokenFile, s.coder.SessionToken)
	rec := testenv.NewRecordingProxy(t, s.coder.URL)
	proxy := testenv.NewCountingProxy(t, rec.URL)
	agg := StartOperator(t, OperatorOptions{Mode: "aggregated-apiserver", Kubeconfig: s.k.KubeconfigPath,
		Aggregated: fmt.Sprintf(`coder: {staticBackend: {url: %q, sessionTokenFile: %q, namespace: %s, identity: %s}}`,
			proxy.URL.String(), tokenFile, s.ns, identityConfig(s.identity(s.coder.Username)))})
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
	testenv.WaitFor(t, 60*time.Second, func() error {
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

	session, err := mcpclient.Connect(context.Background(), mcpOnly.MCP+"/mcp", mcpclient.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	if res, err := session.CallTool(context.Background(), &mcp.CallToolParams{Name: "list_control_planes", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("list_control_planes: %v %+v", err, res)
	}

	// aggregated-apiserver mode: every request coderd was asked is counted
	// under the static backend's label.
	families, forwarded := settledCoderRequests(t, agg.Metrics+"/metrics", "static", proxy)
	lists := forwarded["GET /api/v2/workspaces"]
	if lists == 0 {
		t.Errorf("aggregated-apiserver mode: coderd was asked for no workspace list through the proxy: %v", forwarded)
	}
	checkSeries(t, families, []metricWant{{"coder_k8s_coder_api_requests_total",
		map[string]string{"component": "aggregated", "control_plane": "static", "operation": "GET /api/v2/workspaces", "code": "2xx"}, exactly(lists)}})
	checkCountedAsForwarded(t, families, "static", forwarded)

	checkSeries(t, scrapeMetrics(t, mcpOnly.Metrics+"/metrics"), []metricWant{{"coder_k8s_mcp_tool_calls_total",
		map[string]string{"tool": "list_control_planes", "outcome": "ok"}, exactly(1)}})
	outputs := processOutputs(t, agg)
	maps.Copy(outputs, processOutputs(t, mcpOnly))
	return outputs, sessionTokensSent(rec)
}

// sessionTokensSent are the distinct Coder-Session-Token headers of the
// requests rec received.
func sessionTokensSent(rec *testenv.RecordingProxy) []string {
	var out []string
	for _, r := range rec.Requests() {
		if tok := r.Header.Get(codersdk.SessionTokenHeader); tok != "" && !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

// scrapeMetrics reads and parses the Prometheus text at url.
func scrapeMetrics(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	families, _ := scrapeMetricsText(t, url)
	return families
}

// scrapeMetricsText reads the Prometheus text at url and returns it parsed
// and as it came.
func scrapeMetricsText(t testing.TB, url string) (map[string]*dto.MetricFamily, string) {
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
	return families, string(body)
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
