package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// Tunables of BenchmarkMCP. BENCH_WORKSPACES overrides the number of
// workspaces, BENCH_MCP_DURATION the length of each throughput run and
// BENCH_KUBE_QPS the operator's Kubernetes client rate limit (default
// kubernetes.qps 50), to see what the tools do unthrottled.
const (
	mcpBenchWorkspaces = 300
	// mcpBenchPairs alternating MCP/LIST pairs are timed after
	// mcpBenchWarmup pairs.
	mcpBenchPairs  = 40
	mcpBenchWarmup = 3
	// mcpBenchPartRounds is how many rounds the latency breakdown takes.
	mcpBenchPartRounds = 15
	// mcpBenchPage is the largest page list_workspaces returns.
	mcpBenchPage = 100
	// mcpBenchClients concurrent agents call list_workspaces with
	// mcpBenchSmallPage (the tool's default page) for mcpBenchDuration.
	mcpBenchClients   = 10
	mcpBenchSmallPage = 20
	mcpBenchDuration  = 30 * time.Second
	mcpBenchNS        = "coder"
	// The agents are ServiceAccount mcpBenchAgent in mcpBenchAgentNS.
	mcpBenchAgentNS = "agents"
	mcpBenchAgent   = "bench-agent"
)

// BenchmarkMCP measures the MCP server's list_workspaces tool on real
// workspaces in a real coderd, against a reference measured in the same
// run:
//
//   - latency: paging through every workspace with list_workspaces (limit
//     100 and the continue token, one MCP client session, a ServiceAccount
//     bearer token) vs one LIST of the same workspaces through
//     kube-apiserver's aggregation layer, with the same *http.Client
//     (medians of alternating requests), then where the MCP time goes;
//   - throughput: tool calls per second with 10 concurrent MCP client
//     sessions (each its own agent: its own token and connection) calling
//     list_workspaces with limit 20, with p50 and p99 latency, next to 10
//     concurrent clients making the aggregated LIST.
//
// Run it with:
//
//	make bench-mcp
func BenchmarkMCP(b *testing.B) {
	n := mcpBenchWorkspaces
	if v, err := strconv.Atoi(os.Getenv("BENCH_WORKSPACES")); err == nil && v > 0 {
		n = v
	}
	dur := mcpBenchDuration
	if d, err := time.ParseDuration(os.Getenv("BENCH_MCP_DURATION")); err == nil && d > 0 {
		dur = d
	}
	st := newMCPBench(b)
	st.createWorkspaces(b, n)
	st.waitListed(b, n)
	tokens := st.agentTokens(b, mcpBenchClients)

	b.ResetTimer()
	st.benchLatency(b, n, tokens[0])
	st.benchThroughput(b, n, tokens, dur)
	b.StopTimer()
}

// mcpBench is kube-apiserver, coderd and coder-k8s in all mode serving
// aggregation.coder.com through an APIService and MCP on its own port,
// with one CoderControlPlane adopting the coderd.
type mcpBench struct {
	k     *testenv.KubeAPI
	coder *testenv.Coder
	op    *Operator
	c     client.Client
	// listURL is the aggregated LIST of every coderworkspace through
	// kube-apiserver; mcpURL the operator's MCP endpoint.
	listURL, mcpURL string
	qps             int
}

func newMCPBench(b *testing.B) *mcpBench {
	b.Helper()
	k := testenv.NewKubeAPI(b, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(b, testenv.CoderOptions{})
	st := &mcpBench{k: k, coder: coder}

	ca, err := testenv.NewCA("coder-k8s-bench-mcp-ca")
	if err != nil {
		b.Fatal(err)
	}
	serving, err := ca.ServingCert([]string{testenv.ServiceDNSName(aggServiceName, aggServiceNamespace), "localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		b.Fatal(err)
	}
	certDir := b.TempDir()
	if err := serving.WriteTo(certDir); err != nil {
		b.Fatal(err)
	}
	st.qps, _ = strconv.Atoi(os.Getenv("BENCH_KUBE_QPS"))
	// Log at info, the default: debug logging (a line per tool call) is
	// not what a deployment pays for.
	st.op = StartOperator(b, OperatorOptions{
		Mode: "all", Kubeconfig: k.KubeconfigPath, KubeQPS: st.qps,
		Aggregated: fmt.Sprintf("certDir: %s, watchPollInterval: %s", certDir, pollInterval),
		Args:       []string{"--log-level", "info"},
	})
	st.op.WaitOK(b, st.op.Health+"/readyz")
	st.op.WaitOK(b, st.op.MCP+"/readyz")
	st.mcpURL = st.op.MCP + "/mcp"
	st.listURL = strings.TrimRight(k.Config.Host, "/") + "/apis/aggregation.coder.com/v1alpha1/coderworkspaces"

	sch := scheme.New()
	if err := aggv1.AddToScheme(sch); err != nil {
		b.Fatal(err)
	}
	if st.c, err = client.New(k.Config, client.Options{Scheme: sch}); err != nil {
		b.Fatal(err)
	}
	st.adopt(b)

	port := 0
	if _, err := fmt.Sscanf(st.op.Aggregated, "https://127.0.0.1:%d", &port); err != nil {
		b.Fatal(err)
	}
	if err := k.RegisterAPIService(context.Background(), testenv.APIService{
		Group: aggv1.GroupName, Version: "v1alpha1", Port: port, CABundle: ca.CertPEM,
		ServiceName: aggServiceName, ServiceNamespace: aggServiceNamespace,
	}); err != nil {
		b.Fatalf("register APIService: %v\noperator log:\n%s", err, st.op.LogTail(40))
	}
	return st
}

// adopt creates the owner token Secret and a CoderControlPlane adopting
// the coderd in mcpBenchNS, and waits for its operator access.
func (st *mcpBench) adopt(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	if err := st.k.EnsureNamespace(ctx, mcpBenchNS); err != nil {
		b.Fatal(err)
	}
	if err := st.c.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: mcpBenchNS},
		Data:       map[string][]byte{"token": []byte(st.coder.SessionToken)},
	}); err != nil {
		b.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "coder", Namespace: mcpBenchNS},
		Spec: coderv1alpha1.CoderControlPlaneSpec{
			ExternalURL: st.coder.URL.String(),
			OperatorAccess: coderv1alpha1.OperatorAccessSpec{
				OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"},
			},
		},
	}
	if err := st.c.Create(ctx, ccp); err != nil {
		b.Fatal(err)
	}
	mcpBenchWait(b, 60*time.Second, func() error {
		if err := st.c.Get(ctx, types.NamespacedName{Namespace: mcpBenchNS, Name: "coder"}, ccp); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
			return errors.New("OperatorAccessReady is not True: " + conditionSummary(ccp.Status.Conditions))
		}
		return nil
	})
}

// createWorkspaces creates n workspaces of a provider-free template as
// coderd's first user through codersdk, ten requests at a time, and waits
// until every build has succeeded.
func (st *mcpBench) createWorkspaces(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	tpl, err := st.coder.PushTemplate(ctx, "bench-mcp", testenv.ProviderFreeTemplate())
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	parallel(n, func(i int) error {
		name := fmt.Sprintf("mcp-%03d", i)
		if _, err := st.coder.Client.CreateUserWorkspace(ctx, codersdk.Me, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: name}); err != nil {
			return fmt.Errorf("create workspace %s: %w", name, err)
		}
		return nil
	}, b)
	queued := time.Since(start)
	lastLog := time.Now()
	for {
		resp, err := st.coder.Client.Workspaces(ctx, codersdk.WorkspaceFilter{})
		if err != nil {
			b.Fatal(err)
		}
		done := 0
		for _, w := range resp.Workspaces {
			switch w.LatestBuild.Job.Status {
			case codersdk.ProvisionerJobSucceeded:
				done++
			case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
				_, err := st.coder.WaitBuild(ctx, w.LatestBuild.ID)
				b.Fatalf("workspace %s: build %s: %v", w.Name, w.LatestBuild.Job.Status, err)
			}
		}
		if len(resp.Workspaces) == n && done == n {
			break
		}
		if time.Since(start) > 20*time.Minute {
			b.Fatalf("%d of %d workspace builds done after 20 minutes", done, n)
		}
		if time.Since(lastLog) > 30*time.Second {
			fmt.Printf("workspaces: %d of %d builds done after %s\n", done, n, time.Since(start).Round(time.Second))
			lastLog = time.Now()
		}
		time.Sleep(2 * time.Second)
	}
	fmt.Printf("workspaces: %d created in coderd (requests %s, all builds succeeded after %s)\n",
		n, queued.Round(time.Millisecond), time.Since(start).Round(time.Second))
}

// waitListed waits until the aggregated API lists all n workspaces with a
// finished build.
func (st *mcpBench) waitListed(b *testing.B, n int) {
	b.Helper()
	ctx := context.Background()
	mcpBenchWait(b, 2*time.Minute, func() error {
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

// httpClient is one agent's HTTP client: one transport that trusts
// kube-apiserver's CA and presents the admin client certificate (used only
// by kube-apiserver, over TLS), and adds the agent's bearer token to
// requests for the MCP server only.
func (st *mcpBench) httpClient(b *testing.B, token string) *http.Client {
	b.Helper()
	if len(st.k.Config.CertData) == 0 && st.k.Config.CertFile == "" {
		b.Fatal("the admin configuration of kube-apiserver carries no client certificate")
	}
	tlsCfg, err := rest.TLSConfigFor(st.k.Config)
	if err != nil {
		b.Fatalf("TLS configuration for kube-apiserver: %v", err)
	}
	tr := &http.Transport{TLSClientConfig: tlsCfg, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second}
	b.Cleanup(tr.CloseIdleConnections)
	u, err := url.Parse(st.mcpURL)
	if err != nil {
		b.Fatal(err)
	}
	return &http.Client{Timeout: 2 * time.Minute, Transport: &mcpBearerTransport{base: tr, host: u.Host, token: token}}
}

// mcpBearerTransport adds the bearer token to requests for host only.
type mcpBearerTransport struct {
	base  http.RoundTripper
	host  string
	token string
}

func (t *mcpBearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Host == t.host {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+t.token)
	}
	return t.base.RoundTrip(r)
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
		return nil, "", fmt.Errorf("list_workspaces: %s", mcpText(res))
	}
	m, ok := res.StructuredContent.(map[string]any)
	if !ok {
		return nil, "", fmt.Errorf("list_workspaces: structured content is %T", res.StructuredContent)
	}
	next, _ := m["continue"].(string)
	return res, next, nil
}

// mcpPageAll pages through every workspace with list_workspaces (limit 100),
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

// mcpBenchGet GETs u as JSON with hc and times it until the body is read.
func mcpBenchGet(hc *http.Client, u string) (time.Duration, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Accept", "application/json")
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: read body: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("GET %s: %s: %.500s", u, resp.Status, body)
	}
	return d, body, nil
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
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: %w", path, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, nil, fmt.Errorf("POST %s: read body: %w", path, err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("POST %s: %s: %.500s", path, resp.Status, body)
	}
	return d, body, nil
}

// mcpListItems is the number of items in a LIST response body.
func mcpListItems(b *testing.B, body []byte) int {
	b.Helper()
	var l struct {
		Items []json.RawMessage `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		b.Fatalf("aggregated LIST: %v: %.300s", err, body)
	}
	return len(l.Items)
}

// benchLatency times paging through every workspace over MCP against one
// aggregated LIST of the same workspaces, with the same HTTP client, and
// then the parts an MCP call is made of.
func (st *mcpBench) benchLatency(b *testing.B, n int, token string) {
	hc := st.httpClient(b, token)
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
				d, body, err := mcpBenchGet(hc, st.listURL)
				if err != nil {
					b.Fatalf("%v\noperator log:\n%s", err, st.op.LogTail(20))
				}
				if i < mcpBenchWarmup {
					if got := mcpListItems(b, body); got != n {
						b.Fatalf("aggregated LIST: %d items, want %d", got, n)
					}
					listBytes = len(body)
					continue
				}
				ls = append(ls, d)
			}
		}
	}
	mcpMed, listMed := mcpPercentile(ms, 50), mcpPercentile(ls, 50)
	ratio := mcpMed.Seconds() / listMed.Seconds()
	b.ReportMetric(ratio, "mcp-ratio")
	b.ReportMetric(float64(mcpMed.Microseconds())/1000, "mcp-page-all-ms")
	b.ReportMetric(float64(listMed.Microseconds())/1000, "list-ms")
	fmt.Printf("mcp ratio=%.2f (target ≤ 1.3): list_workspaces paging through %d workspaces (%d calls, limit %d, one MCP client session) median %s; aggregated LIST of the same %d through kube-apiserver median %s; %d alternating pairs after %d warm-up pairs, one *http.Client; results %d KiB over MCP, %d KiB LIST JSON\n",
		ratio, n, calls, mcpBenchPage, mcpMed.Round(100*time.Microsecond), n, listMed.Round(100*time.Microsecond),
		mcpBenchPairs, mcpBenchWarmup, mcpBytes>>10, listBytes>>10)

	pages := make([]string, len(perPage))
	for p, ds := range perPage {
		pages[p] = mcpPercentile(ds, 50).Round(100 * time.Microsecond).String()
	}
	fmt.Printf("mcp paging: median time of each call while paging: %s\n", strings.Join(pages, ", "))

	st.latencyParts(b, s, hc, calls, mcpMed)
}

// latencyParts times, alternately, what one list_workspaces call is made
// of: the SubjectAccessReview the tool asks for every call, the aggregated
// LIST it makes (all workspaces, whatever the page), and the TokenReview
// it asks for when its cache (10 s per token) has no answer; next to one
// call. Each is made with the measurement client as the admin, like the
// operator makes them with its own credentials.
func (st *mcpBench) latencyParts(b *testing.B, s *mcp.ClientSession, hc *http.Client, calls int, mcpMed time.Duration) {
	ctx := context.Background()
	review, err := st.k.Clientset.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: st.agentToken(b)},
	}, metav1.CreateOptions{})
	if err != nil || !review.Status.Authenticated {
		b.Fatalf("TokenReview: %v %+v", err, review.Status)
	}
	u := review.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar := &authorizationv1.SubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "authorization.k8s.io/v1", Kind: "SubjectAccessReview"},
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Group: aggv1.GroupName, Resource: "coderworkspaces"},
		},
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
		{name: "one list_workspaces call (limit 100)", run: func() (time.Duration, error) {
			start := time.Now()
			_, _, err := mcpListWorkspaces(ctx, s, mcpBenchPage, "")
			return time.Since(start), err
		}},
		{name: "aggregated LIST", run: func() (time.Duration, error) {
			d, _, err := mcpBenchGet(hc, st.listURL)
			return d, err
		}},
		{name: "SubjectAccessReview", run: func() (time.Duration, error) {
			d, body, err := st.post(hc, "/apis/authorization.k8s.io/v1/subjectaccessreviews", sar)
			if err == nil && !bytes.Contains(body, []byte(`"allowed":true`)) {
				err = fmt.Errorf("SubjectAccessReview not allowed: %.300s", body)
			}
			return d, err
		}},
		{name: "TokenReview", run: func() (time.Duration, error) {
			d, body, err := st.post(hc, "/apis/authentication.k8s.io/v1/tokenreviews", tokenReview)
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
		med[i] = mcpPercentile(p.times, 50)
		out = append(out, fmt.Sprintf("%s %s", p.name, med[i].Round(100*time.Microsecond)))
	}
	call, list, sarMed, trMed := med[0], med[1], med[2], med[3]
	kube := sarMed + list
	fmt.Printf("mcp latency parts (medians of %d alternating rounds): %s\n", mcpBenchPartRounds, strings.Join(out, "; "))
	fmt.Printf("mcp per call: SubjectAccessReview + aggregated LIST of all workspaces = %s of %s (%.0f%%); the rest (HTTP to the MCP port, JSON-RPC, a stateless server session per request, schemas, JSON, client-side rate limiting) %s; TokenReview %s is paid once per token per 10 s (cached)\n",
		kube.Round(100*time.Microsecond), call.Round(100*time.Microsecond), 100*kube.Seconds()/call.Seconds(),
		(call - kube).Round(100*time.Microsecond), trMed.Round(100*time.Microsecond))
	fmt.Printf("mcp paging through all workspaces: %d calls × (SubjectAccessReview + aggregated LIST) = %s of the %s median; one aggregated LIST %s\n",
		calls, (time.Duration(calls) * kube).Round(100*time.Microsecond), mcpMed.Round(100*time.Microsecond), list.Round(100*time.Microsecond))
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

// benchThroughput runs one agent per token, each its own MCP client
// session with its own HTTP client, calling list_workspaces (limit 20) in
// a loop for dur; then as many clients making the aggregated LIST for dur.
func (st *mcpBench) benchThroughput(b *testing.B, n int, tokens []string, dur time.Duration) {
	sessions := make([]*mcp.ClientSession, len(tokens))
	for i, tok := range tokens {
		sessions[i] = st.connect(b, st.httpClient(b, tok))
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
		hcs[i] = st.httpClient(b, tok)
		if _, _, err := mcpBenchGet(hcs[i], st.listURL); err != nil {
			b.Fatal(err)
		}
	}
	listRate, listLat, listErrs, listFirstErr := mcpBenchRun(len(hcs), dur, func(i int) error {
		_, _, err := mcpBenchGet(hcs[i], st.listURL)
		return err
	})

	p50, p99 := mcpPercentile(mcpLat, 50), mcpPercentile(mcpLat, 99)
	b.ReportMetric(mcpRate, "calls/s")
	b.ReportMetric(float64(p50.Microseconds())/1000, "call-p50-ms")
	b.ReportMetric(float64(p99.Microseconds())/1000, "call-p99-ms")
	qps := "kubernetes.qps 50 (default)"
	if st.qps > 0 {
		qps = fmt.Sprintf("kubernetes.qps %d", st.qps)
	}
	fmt.Printf("mcp calls/s=%.1f with %d concurrent MCP client sessions (list_workspaces limit %d, %s, one token each): p50 %s p99 %s; %d calls, %d errors; operator %s\n",
		mcpRate, len(sessions), mcpBenchSmallPage, dur, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond),
		len(mcpLat), mcpErrs, qps)
	fmt.Printf("mcp reference: aggregated LIST of all %d workspaces with %d concurrent clients: %.1f/s, p50 %s p99 %s; %d requests, %d errors\n",
		n, len(hcs), listRate, mcpPercentile(listLat, 50).Round(100*time.Microsecond), mcpPercentile(listLat, 99).Round(100*time.Microsecond),
		len(listLat), listErrs)
	if mcpErrs > 0 || listErrs > 0 {
		b.Fatalf("errors during the throughput runs: MCP %d (first: %v), LIST %d (first: %v)\noperator log:\n%s",
			mcpErrs, mcpFirstErr, listErrs, listFirstErr, st.op.LogTail(20))
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

// mcpPercentile is the p-th percentile (nearest rank) of ds.
func mcpPercentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if p == 50 && len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// mcpBenchWait polls check until it succeeds or timeout passes.
func mcpBenchWait(b *testing.B, timeout time.Duration, check func() error) {
	b.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// mcpText is the text content of a result.
func mcpText(res *mcp.CallToolResult) string {
	var s string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			s += tc.Text
		}
	}
	return s
}
