package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkWorkspaces/MCP. BENCH_WORKSPACES overrides the
// number of workspaces (benchWorkspaces), BENCH_MCP_DURATION the length of
// each throughput run and BENCH_KUBE_QPS the operator's Kubernetes client
// rate limit (default kubernetes.qps 50), to see what the tools do
// unthrottled.
const (
	// mcpBenchPairs alternating MCP/LIST pairs are timed after
	// mcpBenchWarmup pairs.
	mcpBenchPairs  = 40
	mcpBenchWarmup = 3
	// mcpBenchPartRounds is how many rounds the latency breakdown takes.
	mcpBenchPartRounds = 15
	// mcpBenchPage is the largest page list_workspaces returns, so the
	// benchmark's 300 workspaces come in one call.
	mcpBenchPage = 500
	// mcpBenchClients concurrent agents call list_workspaces with
	// mcpBenchSmallPage (the tool's default page) for mcpBenchDuration.
	mcpBenchClients   = 10
	mcpBenchSmallPage = 20
	mcpBenchDuration  = 30 * time.Second
	// The agents are ServiceAccount mcpBenchAgent in mcpBenchAgentNS.
	mcpBenchAgentNS = "agents"
	mcpBenchAgent   = "bench-agent"
	// mcpBenchColdCalls is how many cold calls are timed, each after the
	// cache went stale.
	mcpBenchColdCalls = 8
)

// benchMCP (BenchmarkWorkspaces/MCP) measures the MCP server's
// list_workspaces tool on real workspaces in a real coderd, against a
// reference measured in the same run:
//
//   - latency, warm: with one watch open (the poller keeps the watch cache
//     fresh), paging through every workspace with list_workspaces (limit
//     500 and the continue token, one MCP client session, a ServiceAccount
//     bearer token) vs one LIST ?resourceVersion=0 of the same workspaces
//     through kube-apiserver's aggregation layer, both served from the
//     watch cache, with the same *http.Client (medians of alternating
//     requests), then where the MCP time goes;
//   - throughput: tool calls per second with 10 concurrent MCP client
//     sessions (each its own agent: its own token and connection) calling
//     list_workspaces with limit 20, with p50 and p99 latency, next to 10
//     concurrent clients making the aggregated LIST ?resourceVersion=0
//     (the watch still open);
//   - latency, cold: no watch open, each call after the cache went stale
//     (two poll intervals), so the tool reads coderd, vs the plain
//     aggregated LIST (which always reads coderd) after the same idle
//     time, taking turns.
//
// Run it with:
//
//	make bench-mcp
func benchMCP(b *testing.B, stack *benchStack, n, qps int) {
	dur := mcpBenchDuration
	if d, err := time.ParseDuration(os.Getenv("BENCH_MCP_DURATION")); err == nil && d > 0 {
		dur = d
	}
	st := newMCPBench(b, stack, qps)
	st.waitListed(b, n)
	tokens := st.agentTokens(b, mcpBenchClients)

	b.ResetTimer()
	// Warm: one watch open, as an informer keeps one, so the poller keeps
	// the watch cache fresh and both the tool's first page and the
	// reference LIST ?resourceVersion=0 are served from it.
	ws := st.startWatchers(b, 1, st.listRV(b))
	time.Sleep(2 * st.watchPollInterval()) // the poller fills the cache
	st.benchLatency(b, n, tokens[0])
	st.benchThroughput(b, n, tokens, dur)
	ws.stop(b)
	st.benchCold(b, n, tokens[0])
	b.StopTimer()
}

// mcpBench is the benchmark stack of BenchmarkWorkspaces with the
// operator's MCP server ready.
type mcpBench struct {
	*benchStack
	// mcpURL is the operator's MCP endpoint.
	mcpURL string
	qps    int
}

func newMCPBench(b *testing.B, stack *benchStack, qps int) *mcpBench {
	b.Helper()
	st := &mcpBench{benchStack: stack, qps: qps}
	st.op.WaitOK(b, st.op.MCP+"/readyz")
	st.mcpURL = st.op.MCP + "/mcp"
	return st
}

// waitListed waits until the aggregated API lists all n workspaces with a
// finished build.
func (st *mcpBench) waitListed(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	testenv.WaitFor(b, 2*time.Minute, func() error {
		var list aggv1.CoderWorkspaceList
		if err := st.c.List(ctx, &list); err != nil {
			return err
		}
		if len(list.Items) != n {
			return fmt.Errorf("the aggregated API lists %d workspaces, want %d", len(list.Items), n)
		}
		for _, w := range list.Items {
			if w.Status.LatestBuild == nil || w.Status.LatestBuild.JobStatus != "succeeded" {
				return fmt.Errorf("workspace %s: latest build %+v", w.Name, w.Status.LatestBuild)
			}
		}
		return nil
	})
}

// agentTokens creates ServiceAccount mcpBenchAgent, lets it list
// coderworkspaces in every namespace (and nothing else), and returns n
// distinct tokens for it from the TokenRequest API, one per agent.
func (st *mcpBench) agentTokens(b *testing.B, n int) []string {
	b.Helper()
	ctx := context.Background()
	if err := st.k.EnsureNamespace(ctx, mcpBenchAgentNS); err != nil {
		b.Fatal(err)
	}
	role := "mcp-bench-list-coderworkspaces"
	for _, o := range []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: mcpBenchAgent, Namespace: mcpBenchAgentNS}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"list"},
		}}},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: role},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: mcpBenchAgent, Namespace: mcpBenchAgentNS}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		},
	} {
		if err := st.c.Create(ctx, o); err != nil {
			b.Fatal(err)
		}
	}
	tokens := make([]string, n)
	for i := range tokens {
		tokens[i] = st.agentToken(b)
	}
	return tokens
}

// agentClient is one agent's HTTP client: its own transport, with no
// client certificate and the agent's bearer token on every request, so the
// reference LISTs through kube-apiserver are made as the agent, as the
// tool makes its own.
func (st *mcpBench) agentClient(b *testing.B, token string) *http.Client {
	b.Helper()
	tr := st.transportFor(b, rest.AnonymousClientConfig(st.k.Config))
	return &http.Client{Timeout: 2 * time.Minute, Transport: &testenv.HeaderTransport{Next: tr, Header: http.Header{"Authorization": {"Bearer " + token}}}}
}

// connect opens an MCP client session over hc.
func (st *mcpBench) connect(b *testing.B, hc *http.Client) *mcp.ClientSession {
	b.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "coder-k8s-bench", Version: "v0"}, nil)
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: st.mcpURL, HTTPClient: hc}, nil)
	if err != nil {
		b.Fatalf("connect to %s: %v\noperator log:\n%s", st.mcpURL, err, st.op.LogTail(20))
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// mcpRows is the part of a list_workspaces result the benchmark checks.
type mcpRows struct {
	Items []struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"items"`
	Continue string `json:"continue"`
}

// mcpListWorkspaces calls list_workspaces once and returns the result and
// its continue token.
func mcpListWorkspaces(ctx context.Context, s *mcp.ClientSession, limit int, cont string) (*mcp.CallToolResult, string, error) {
	args := map[string]any{"limit": limit}
	if cont != "" {
		args["continue"] = cont
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "list_workspaces", Arguments: args})
	if err != nil {
		return nil, "", fmt.Errorf("call list_workspaces: %w", err)
	}
	if res.IsError {
		return nil, "", fmt.Errorf("list_workspaces: %s", e2eMCPText(res))
	}
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("list_workspaces: structured content is %T", res.StructuredContent)
	}
	next, _ := m["continue"].(string)
	return res, next, nil
}

// mcpPageAll pages through every workspace with list_workspaces (limit 500),
// timed from the first request to the last result decoded by the SDK, and
// returns the results and the time of each call.
func mcpPageAll(s *mcp.ClientSession) (time.Duration, []*mcp.CallToolResult, []time.Duration, error) {
	ctx := context.Background()
	var results []*mcp.CallToolResult
	var each []time.Duration
	cont := ""
	start := time.Now()
	for {
		t := time.Now()
		res, next, err := mcpListWorkspaces(ctx, s, mcpBenchPage, cont)
		if err != nil {
			return 0, nil, nil, err
		}
		each = append(each, time.Since(t))
		results = append(results, res)
		if next == "" {
			break
		}
		cont = next
		if len(results) > 1000 {
			return 0, nil, nil, errors.New("list_workspaces: more than 1000 pages")
		}
	}
	return time.Since(start), results, each, nil
}

// mcpCheckPages fails unless results hold n distinct workspaces; it returns
// the size of the results' JSON.
func mcpCheckPages(b *testing.B, results []*mcp.CallToolResult, n int) int {
	b.Helper()
	seen := map[string]bool{}
	size := 0
	for _, res := range results {
		raw, err := json.Marshal(res)
		if err != nil {
			b.Fatal(err)
		}
		size += len(raw)
		var rows mcpRows
		sc, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(sc, &rows); err != nil {
			b.Fatalf("list_workspaces: %v: %.300s", err, sc)
		}
		for _, r := range rows.Items {
			seen[r.Namespace+"/"+r.Name] = true
		}
	}
	if len(seen) != n {
		b.Fatalf("paging through list_workspaces: %d distinct workspaces in %d calls, want %d", len(seen), len(results), n)
	}
	return size
}

// post POSTs obj as JSON to kube-apiserver path with hc and times
// it until the body is read.
func (st *mcpBench) post(hc *http.Client, path string, obj any) (time.Duration, []byte, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return 0, nil, err
	}
	u := strings.TrimRight(st.k.Config.Host, "/") + path
	req, err := http.NewRequest(http.MethodPost, u, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	d, body, _, err := timedDo(hc, req, http.StatusCreated, http.StatusOK)
	return d, body, err
}

// benchLatency times paging through every workspace over MCP against one
// aggregated LIST of the same workspaces, with the same HTTP client, and
// then the parts an MCP call is made of.
func (st *mcpBench) benchLatency(b *testing.B, n int, token string) {
	hc := st.agentClient(b, token)
	s := st.connect(b, hc)

	var ms, ls []time.Duration
	var perPage [][]time.Duration
	calls, mcpBytes, listBytes := 0, 0, 0
	for i := range mcpBenchWarmup + mcpBenchPairs {
		mcpFirst := i%2 == 0
		for j := range 2 {
			if (j == 0) == mcpFirst {
				d, results, each, err := mcpPageAll(s)
				if err != nil {
					b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
				}
				if i < mcpBenchWarmup {
					mcpBytes = mcpCheckPages(b, results, n)
					calls = len(results)
					continue
				}
				if len(results) != calls {
					b.Fatalf("paging took %d calls, earlier %d", len(results), calls)
				}
				ms = append(ms, d)
				for p, d := range each {
					if p == len(perPage) {
						perPage = append(perPage, nil)
					}
					perPage[p] = append(perPage[p], d)
				}
			} else {
				d, body, _, err := timedGet(hc, st.listURL+"?resourceVersion=0", "")
				if err != nil {
					b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
				}
				if i < mcpBenchWarmup {
					st.checkItems(b, "aggregated LIST", body, "items", n)
					listBytes = len(body)
					continue
				}
				ls = append(ls, d)
			}
		}
	}
	mcpMed, listMed := percentile(ms, 50), percentile(ls, 50)
	ratio := mcpMed.Seconds() / listMed.Seconds()
	b.ReportMetric(ratio, "mcp-ratio")
	b.ReportMetric(float64(mcpMed.Microseconds())/1000, "mcp-page-all-ms")
	b.ReportMetric(float64(listMed.Microseconds())/1000, "list-ms")
	fmt.Printf("mcp ratio=%.2f (target ≤ 1.3): list_workspaces paging through %d workspaces (%d calls, limit %d, one MCP client session) median %s; aggregated LIST ?resourceVersion=0 of the same %d through kube-apiserver median %s; both from the watch cache, one watch open; %d alternating pairs after %d warm-up pairs, one *http.Client; results %d KiB over MCP, %d KiB LIST JSON\n",
		ratio, n, calls, mcpBenchPage, mcpMed.Round(100*time.Microsecond), n, listMed.Round(100*time.Microsecond),
		mcpBenchPairs, mcpBenchWarmup, mcpBytes>>10, listBytes>>10)

	pages := make([]string, len(perPage))
	for p, ds := range perPage {
		pages[p] = percentile(ds, 50).Round(100 * time.Microsecond).String()
	}
	fmt.Printf("mcp paging: median time of each call while paging: %s\n", strings.Join(pages, ", "))

	st.latencyParts(b, s, hc, calls, mcpMed)
}

// latencyParts times, alternately, what one list_workspaces call is made
// of: the aggregated LIST it makes (all workspaces, whatever the page;
// the tool makes it with the caller's token), and the TokenReview it asks
// for when its cache (10 s per token) has no answer; next to one call.
// The LIST is made with the agent's client, as the tool makes it; the
// review with the admin's certificate (the operator makes it as itself,
// and the agent may not).
func (st *mcpBench) latencyParts(b *testing.B, s *mcp.ClientSession, hc *http.Client, calls int, mcpMed time.Duration) {
	ctx := context.Background()
	admin := &http.Client{Timeout: 2 * time.Minute, Transport: st.transportFor(b, st.k.Config)}
	review, err := st.k.Clientset.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: st.agentToken(b)},
	}, metav1.CreateOptions{})
	if err != nil || !review.Status.Authenticated {
		b.Fatalf("TokenReview: %v %+v", err, review.Status)
	}
	tokenReview := &authenticationv1.TokenReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authentication.k8s.io/v1", Kind: "TokenReview"},
		Spec:     authenticationv1.TokenReviewSpec{Token: st.agentToken(b)},
	}

	type part struct {
		name  string
		run   func() (time.Duration, error)
		times []time.Duration
	}
	parts := []*part{
		{name: "one list_workspaces call (limit 500)", run: func() (time.Duration, error) {
			start := time.Now()
			_, _, err := mcpListWorkspaces(ctx, s, mcpBenchPage, "")
			return time.Since(start), err
		}},
		// What the tool's first page asks the aggregated API for: the
		// watch cache's state while it is fresh.
		{name: "aggregated LIST ?resourceVersion=0", run: func() (time.Duration, error) {
			d, _, _, err := timedGet(hc, st.listURL+"?resourceVersion=0", "")
			return d, err
		}},
		{name: "TokenReview", run: func() (time.Duration, error) {
			d, body, err := st.post(admin, "/apis/authentication.k8s.io/v1/tokenreviews", tokenReview)
			if err == nil && !bytes.Contains(body, []byte(`"authenticated":true`)) {
				err = fmt.Errorf("TokenReview not authenticated: %.300s", body)
			}
			return d, err
		}},
	}
	for i := range 2 + mcpBenchPartRounds {
		for j := range parts {
			p := parts[(i+j)%len(parts)]
			d, err := p.run()
			if err != nil {
				b.Fatalf("%s: %v", p.name, err)
			}
			if i >= 2 {
				p.times = append(p.times, d)
			}
		}
	}
	med := make([]time.Duration, len(parts))
	var out []string
	for i, p := range parts {
		med[i] = percentile(p.times, 50)
		out = append(out, fmt.Sprintf("%s %s", p.name, med[i].Round(100*time.Microsecond)))
	}
	call, list, trMed := med[0], med[1], med[2]
	fmt.Printf("mcp latency parts (medians of %d alternating rounds): %s\n", mcpBenchPartRounds, strings.Join(out, "; "))
	fmt.Printf("mcp per call: aggregated LIST ?resourceVersion=0 = %s of %s (%.0f%%); the rest (HTTP to the MCP port, JSON-RPC, a stateless server session per request, decoding the list, encoding the rows, client-side rate limiting) %s; a TokenReview %s is paid once per 10 s (cached per token); no SubjectAccessReview (kube-apiserver authorizes the call with the caller's token)\n",
		list.Round(100*time.Microsecond), call.Round(100*time.Microsecond), 100*list.Seconds()/call.Seconds(),
		(call - list).Round(100*time.Microsecond), trMed.Round(100*time.Microsecond))
	fmt.Printf("mcp paging through all workspaces: %d calls × aggregated LIST ?resourceVersion=0 = %s of the %s median; one such LIST %s\n",
		calls, (time.Duration(calls) * list).Round(100*time.Microsecond), mcpMed.Round(100*time.Microsecond), list.Round(100*time.Microsecond))
}

// agentToken is a fresh token for the agent ServiceAccount.
func (st *mcpBench) agentToken(b *testing.B) string {
	b.Helper()
	exp := int64(3600)
	tr, err := st.k.Clientset.CoreV1().ServiceAccounts(mcpBenchAgentNS).CreateToken(context.Background(), mcpBenchAgent, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return tr.Status.Token
}

// benchCold times list_workspaces paging through every workspace with the
// watch cache stale: no watch open, each call more than two poll
// intervals (the cache's freshness limit) after the previous request, so
// the tool's first page reads coderd. The reference is the plain
// aggregated LIST (which always reads coderd) with the same *http.Client
// after the same idle time, the two taking turns: a request after a pause
// finds coderd, its database and the connections as cold as the call
// does. coderd's own list is timed right after each reference. Each cold
// call also pays a TokenReview (the MCP server reuses it for 10 s), as an
// agent calling now and then does.
func (st *mcpBench) benchCold(b *testing.B, n int, token string) {
	hc := st.agentClient(b, token)
	s := st.connect(b, hc)
	stale := 2*st.watchPollInterval() + time.Second
	coderd := st.coder.URL.String() + "/api/v2/workspaces"
	var cold, lists, coderLists []time.Duration
	for range mcpBenchColdCalls {
		time.Sleep(stale)
		d, results, _, err := mcpPageAll(s)
		if err != nil {
			b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
		}
		mcpCheckPages(b, results, n)
		cold = append(cold, d)

		time.Sleep(stale)
		d, body, _, err := timedGet(hc, st.listURL, "")
		if err != nil {
			b.Fatal(err)
		}
		st.checkItems(b, "aggregated LIST", body, "items", n)
		lists = append(lists, d)
		// coderd's own list, with the measurement client (it holds the
		// coderd session; the agent's client holds only the agent's token).
		if d, _, _, err = st.fetch(coderd); err != nil {
			b.Fatal(err)
		}
		coderLists = append(coderLists, d)
	}
	list, coderList := percentile(lists, 50), percentile(coderLists, 50)

	coldMed := percentile(cold, 50)
	ratio := coldMed.Seconds() / list.Seconds()
	b.ReportMetric(ratio, "mcp-cold-ratio")
	b.ReportMetric(float64(coldMed.Microseconds())/1000, "mcp-cold-ms")
	b.ReportMetric(float64(list.Microseconds())/1000, "list-coderd-ms")
	fmt.Printf("mcp cold ratio=%.2f (target ≤ 1.3): list_workspaces paging through %d workspaces with the watch cache stale (no watch open, %s after the previous request) median %s (max %s) of %d calls; plain aggregated LIST (reads coderd) after the same pause, taking turns, median %s (max %s); coderd GET /api/v2/workspaces right after each LIST median %s\n",
		ratio, n, stale, coldMed.Round(100*time.Microsecond), slices.Max(cold).Round(100*time.Microsecond), mcpBenchColdCalls,
		list.Round(100*time.Microsecond), slices.Max(lists).Round(100*time.Microsecond), coderList.Round(100*time.Microsecond))
}

// benchThroughput runs one agent per token, each its own MCP client
// session with its own HTTP client, calling list_workspaces (limit 20) in
// a loop for dur; then as many clients making the aggregated LIST for dur.
func (st *mcpBench) benchThroughput(b *testing.B, n int, tokens []string, dur time.Duration) {
	sessions := make([]*mcp.ClientSession, len(tokens))
	for i, tok := range tokens {
		sessions[i] = st.connect(b, st.agentClient(b, tok))
		// Warm-up: the connection and the token's TokenReview.
		if _, _, err := mcpListWorkspaces(context.Background(), sessions[i], mcpBenchSmallPage, ""); err != nil {
			b.Fatal(err)
		}
	}
	mcpRate, mcpLat, mcpErrs, mcpFirstErr := mcpBenchRun(len(sessions), dur, func(i int) error {
		res, _, err := mcpListWorkspaces(context.Background(), sessions[i], mcpBenchSmallPage, "")
		if err != nil {
			return err
		}
		if items, _ := res.StructuredContent.(map[string]any)["items"].([]any); len(items) != min(mcpBenchSmallPage, n) {
			return fmt.Errorf("list_workspaces: %d rows, want %d", len(items), min(mcpBenchSmallPage, n))
		}
		return nil
	})

	hcs := make([]*http.Client, len(tokens))
	for i, tok := range tokens {
		hcs[i] = st.agentClient(b, tok)
		if _, _, _, err := timedGet(hcs[i], st.listURL+"?resourceVersion=0", ""); err != nil {
			b.Fatal(err)
		}
	}
	listRate, listLat, listErrs, listFirstErr := mcpBenchRun(len(hcs), dur, func(i int) error {
		_, _, _, err := timedGet(hcs[i], st.listURL+"?resourceVersion=0", "")
		return err
	})

	p50, p99 := percentile(mcpLat, 50), percentile(mcpLat, 99)
	b.ReportMetric(mcpRate, "calls/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "call-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "call-p99-ms")
	b.ReportMetric(listRate, "ref-list/s")
	qps := "kubernetes.qps 50 (default)"
	if st.qps > 0 {
		qps = fmt.Sprintf("kubernetes.qps %d", st.qps)
	}
	fmt.Printf("mcp calls/s=%.1f with %d concurrent MCP client sessions (list_workspaces limit %d, %s, one token each): p50 %s p99 %s; %d calls, %d errors; operator %s\n",
		mcpRate, len(sessions), mcpBenchSmallPage, dur, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond),
		len(mcpLat), mcpErrs, qps)
	fmt.Printf("mcp reference: aggregated LIST ?resourceVersion=0 of all %d workspaces with %d concurrent clients: %.1f/s, p50 %s p99 %s; %d requests, %d errors\n",
		n, len(hcs), listRate, percentile(listLat, 50).Round(100*time.Microsecond), percentile(listLat, 99).Round(100*time.Microsecond),
		len(listLat), listErrs)
	if mcpErrs > 0 {
		b.Fatalf("errors during the MCP throughput run: %d (first: %v)\noperator log:\n%s", mcpErrs, mcpFirstErr, st.op.LogTail(20))
	}
	if listErrs > 0 {
		b.Fatalf("errors during the reference LIST run: %d (first: %v)", listErrs, listFirstErr)
	}
}

// mcpBenchRun runs do(i) in a loop on workers 0..workers-1 until dur has
// passed and returns successful operations per second, their latencies,
// and the number of errors with the first one.
func mcpBenchRun(workers int, dur time.Duration, do func(i int) error) (float64, []time.Duration, int, error) {
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	var firstErr error
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t := time.Now()
				err := do(i)
				d := time.Since(t)
				if err != nil {
					mu.Lock()
					if errs == 0 {
						firstErr = err
					}
					errs++
					mu.Unlock()
					continue
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	return float64(len(lat)) / elapsed.Seconds(), lat, errs, firstErr
}
