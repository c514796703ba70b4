package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// requestLog records the requests a client sends: method and path.
type requestLog struct {
	mu   sync.Mutex
	seen []string
}

func (l *requestLog) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		l.mu.Lock()
		l.seen = append(l.seen, r.Method+" "+r.URL.Path)
		l.mu.Unlock()
		return rt.RoundTrip(r)
	})
}

func (l *requestLog) requests() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.seen)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// operatorWithMCPRole is a client configuration for a user holding exactly
// the generated MCP ClusterRole (config/rbac/mcp/role.yaml), the rights the
// chart gives coder-k8s for the MCP server, whose requests log records.
func operatorWithMCPRole(t *testing.T, k *testenv.KubeAPI, log *requestLog) *rest.Config {
	t.Helper()
	const user = "coder-k8s-operator"
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(root, "config", "rbac", "mcp", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.Unmarshal(raw, &role); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	role.ObjectMeta = metav1.ObjectMeta{Name: "coder-k8s-mcp"}
	if _, err := k.Clientset.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Clientset.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "coder-k8s-mcp"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := k.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	if log != nil {
		cfg.Wrap(log.wrap)
	}
	return cfg
}

// bindClusterRole binds ClusterRole role to ServiceAccount agents/name in
// namespace.
func (h *harness) bindClusterRole(t *testing.T, name, namespace, role string) {
	t.Helper()
	if err := h.c.Create(t.Context(), &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + role, Namespace: namespace},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: "agents"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
	}); err != nil {
		t.Fatal(err)
	}
}

// discovery matches the API discovery requests a REST mapper sends.
var discovery = regexp.MustCompile(`^GET /(api|apis|api/v1|apis/[^/]+/[^/]+)$`)

// TestToolsActAsTheCaller runs tools with coder-k8s holding only its
// generated MCP role: callers with view and edit read and write as
// themselves, kube-apiserver's admission sees the caller, and coder-k8s's
// own credentials send nothing but TokenReviews and discovery.
func TestToolsActAsTheCaller(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "coderworkspaces.yaml"), []byte(workspaceStandInCRD), 0o600); err != nil {
		t.Fatal(err)
	}
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{CRDDirs: []string{filepath.Join(root, "config", "crd", "bases"), dir}})
	operatorRequests := &requestLog{}
	h := newHarnessAs(t, k, operatorWithMCPRole(t, k, operatorRequests), nil)
	ctx := t.Context()
	const ns, name = "team", "acme.alice.dev"
	if err := h.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "hello", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Name: "coder-0", Namespace: ns},
		Type:           "Normal", Reason: "Tested", Message: "seen by the caller", Count: 1,
		FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	ws := &aggv1.CoderWorkspace{}
	ws.Namespace, ws.Name = ns, name
	if err := h.c.Create(ctx, ws); err != nil {
		t.Fatal(err)
	}
	running := func() bool { return h.workspaceRunning(t, ns, name) }

	// Admission shows who sent a request: this policy refuses every stop
	// and names the user kube-apiserver authenticated.
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "who-stops"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionregistrationv1.Fail),
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{aggv1.GroupName}, APIVersions: []string{"*"}, Resources: []string{"coderworkspaces"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression:        "has(object.spec) && has(object.spec.running) && object.spec.running",
				MessageExpression: "'stop of ' + object.metadata.name + ' sent by ' + request.userInfo.username",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "who-stops"},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: "who-stops", ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}
	for _, o := range []client.Object{policy, binding} {
		if err := h.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The policy takes effect once kube-apiserver has loaded it: probe with
	// a dry-run stop as the admin.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		probe := &aggv1.CoderWorkspace{}
		probe.Namespace, probe.Name = ns, name
		err := h.c.Patch(ctx, probe, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"running":false}}`)), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), "stop of "+name+" sent by ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policy is not in effect after 30 s: %v", err)
		}
	}
	workspaceRule := func(verbs ...string) rbacv1.PolicyRule {
		return rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: verbs}
	}
	args := map[string]any{"namespace": ns, "name": name, "running": true}

	t.Run("view reads and is refused the write by kube-apiserver", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "viewer")
		// view's rules: kube-controller-manager, absent here, would
		// aggregate them into view itself.
		h.bindClusterRole(t, "viewer", ns, "system:aggregate-to-view")
		// What the chart's aggregated view role adds for Coder objects.
		h.grant(t, "agents", "viewer", ns, workspaceRule("get", "list"))
		s := h.connect(t, token)
		var events EventList
		if res := callTool(t, s, "list_events", map[string]any{"namespace": ns}, &events); res.IsError {
			t.Fatalf("list_events with view: %s", resultText(res))
		}
		if len(events.Items) != 1 || events.Items[0].Message != "seen by the caller" {
			t.Fatalf("events: %+v", events.Items)
		}
		res := callTool(t, s, "set_workspace_running", args, nil)
		want := `set spec.running of coderworkspace team/acme.alice.dev: coderworkspaces.aggregation.coder.com "acme.alice.dev" is forbidden: User "system:serviceaccount:agents:viewer" cannot patch resource "coderworkspaces" in API group "aggregation.coder.com" in the namespace "team" (the tools act with your own Kubernetes RBAC, as kubectl would; ask for a Role granting it)`
		if !res.IsError || resultText(res) != want {
			t.Fatalf("set_workspace_running with view (error %v):\n%s\nwant:\n%s", res.IsError, resultText(res), want)
		}
		if running() {
			t.Fatal("the refused call started the workspace")
		}
	})

	t.Run("edit writes, and admission sees the caller", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "editor")
		h.bindClusterRole(t, "editor", ns, "system:aggregate-to-view")
		h.bindClusterRole(t, "editor", ns, "system:aggregate-to-edit")
		h.grant(t, "agents", "editor", ns, workspaceRule("get", "list", "patch"))
		s := h.connect(t, token)
		var out SetRunningResult
		if res := callTool(t, s, "set_workspace_running", args, &out); res.IsError {
			t.Fatalf("start with edit: %s", resultText(res))
		}
		if !out.Changed || !running() {
			t.Fatalf("changed=%v, running=%v; want the workspace started", out.Changed, running())
		}
		res := callTool(t, s, "set_workspace_running", map[string]any{"namespace": ns, "name": name, "running": false}, nil)
		want := `set spec.running of coderworkspace team/acme.alice.dev: coderworkspaces.aggregation.coder.com "acme.alice.dev" is forbidden: ValidatingAdmissionPolicy 'who-stops' with binding 'who-stops' denied request: stop of acme.alice.dev sent by system:serviceaccount:agents:editor`
		if !res.IsError || resultText(res) != want {
			t.Fatalf("stop with edit (error %v):\n%s\nwant:\n%s", res.IsError, resultText(res), want)
		}
	})

	t.Run("coder-k8s's own credentials only review tokens and discover", func(t *testing.T) {
		reqs := operatorRequests.requests()
		reviews := 0
		for _, r := range reqs {
			switch {
			case r == "POST /apis/authentication.k8s.io/v1/tokenreviews":
				reviews++
			case discovery.MatchString(r):
			default:
				t.Errorf("coder-k8s sent %s for a caller", r)
			}
		}
		if reviews != 2 {
			t.Errorf("%d TokenReviews, want 2 (one per caller): %q", reviews, reqs)
		}
	})
}

// TestAuthNoneActsAsCoderK8s: without authentication the tools have
// coder-k8s's own rights, which hold nothing for them.
func TestAuthNoneActsAsCoderK8s(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	h := newHarnessAs(t, k, operatorWithMCPRole(t, k, nil), func(o *Options) { o.AuthNone = true })
	res := callTool(t, h.connect(t, ""), "list_events", map[string]any{"namespace": "default"}, nil)
	want := `list events in namespace default: events is forbidden: User "coder-k8s-operator" cannot list resource "events" in API group "" in the namespace "default" (with mcp.auth none the tools act with coder-k8s's own permissions, which include none of what only the tools need; use mcp.auth kubernetes)`
	if !res.IsError || resultText(res) != want {
		t.Fatalf("list_events with auth none (error %v):\n%s\nwant:\n%s", res.IsError, resultText(res), want)
	}
	if status, _, _ := get(t, strings.TrimSuffix(h.url, mcpPath)+wellKnownPath); status != http.StatusNotFound {
		t.Errorf("metadata with auth none: status %d, want 404", status)
	}
}

// post sends a tools/list request with token ("" for none). Safe in
// goroutines: a failure is reported with t.Error and a zero status.
func (h *harness) post(t *testing.T, token string) (status int, header http.Header, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	return send(t, req)
}

func get(t *testing.T, url string) (status int, header http.Header, body string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	return send(t, req)
}

func send(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestAudiencesAndProtectedResourceMetadata checks mcp.audiences against
// ServiceAccount tokens for various audiences, and what clients read
// before they have a token: the metadata document and the 401 challenge.
func TestAudiencesAndProtectedResourceMetadata(t *testing.T) {
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	const mcpAudience = "coder-k8s-mcp"
	h := newHarness(t, k, func(o *Options) { o.Audiences = []string{mcpAudience} })
	base := strings.TrimSuffix(h.url, mcpPath)
	ctx := t.Context()

	// kube-apiserver's own audience: what a token request without
	// audiences gets.
	h.serviceAccountToken(t, "agents", "probe")
	tr, err := h.cs.CoreV1().ServiceAccounts("agents").CreateToken(ctx, "probe", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	apiAudiences := tr.Spec.Audiences
	if len(apiAudiences) == 0 {
		t.Fatal("kube-apiserver named no default audience")
	}
	if err := h.k.EnsureNamespace(ctx, "team"); err != nil {
		t.Fatal(err)
	}
	eventsRule := rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"list"}}
	wantChallenge := `Bearer resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp"`

	t.Run("a token for kube-apiserver and this server works", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "both", append(slices.Clone(apiAudiences), mcpAudience)...)
		h.grant(t, "agents", "both", "team", eventsRule)
		if res := callTool(t, h.connect(t, token), "list_events", map[string]any{"namespace": "team"}, nil); res.IsError {
			t.Fatalf("list_events: %s", resultText(res))
		}
	})

	t.Run("a token for kube-apiserver only is refused with 401", func(t *testing.T) {
		status, header, body := h.post(t, h.serviceAccountToken(t, "agents", "api-only"))
		want := fmt.Sprintf("the bearer token is not valid for this cluster: [invalid bearer token, token audiences %q is invalid for the target audiences [%q]]: invalid token\n", apiAudiences, mcpAudience)
		if status != http.StatusUnauthorized || body != want {
			t.Errorf("status %d, body %q; want 401, %q", status, body, want)
		}
		if got := header.Get("WWW-Authenticate"); got != wantChallenge+`, error="invalid_token"` {
			t.Errorf("WWW-Authenticate %q", got)
		}
	})

	t.Run("a token for this server only is refused by kube-apiserver when forwarded", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "mcp-only", mcpAudience)
		h.grant(t, "agents", "mcp-only", "team", eventsRule)
		res := callTool(t, h.connect(t, token), "list_events", map[string]any{"namespace": "team"}, nil)
		want := "list events in namespace team: Unauthorized (kube-apiserver did not accept your bearer token: with mcp.audiences set, the token must also be valid for kube-apiserver's own audience)"
		if !res.IsError || resultText(res) != want {
			t.Fatalf("list_events (error %v): %s\nwant: %s", res.IsError, resultText(res), want)
		}
	})

	t.Run("a request without a token gets the challenge without an error code", func(t *testing.T) {
		status, header, body := h.post(t, "")
		if status != http.StatusUnauthorized || body != "no bearer token\n" {
			t.Errorf("status %d, body %q", status, body)
		}
		if got := header.Get("WWW-Authenticate"); got != wantChallenge {
			t.Errorf("WWW-Authenticate %q, want %q", got, wantChallenge)
		}
	})

	t.Run("metadata without OAuth configuration names the resource only", func(t *testing.T) {
		want := `{"resource":"` + base + `/mcp","bearer_methods_supported":["header"],"resource_name":"coder-k8s MCP"}` + "\n"
		for _, path := range []string{wellKnownPath + mcpPath, wellKnownPath} {
			status, header, body := get(t, base+path)
			if status != http.StatusOK || body != want || header.Get("Content-Type") != "application/json" {
				t.Errorf("GET %s: %d %s %q; want 200 application/json %q", path, status, header.Get("Content-Type"), body, want)
			}
		}
	})

	t.Run("metadata with OAuth configuration", func(t *testing.T) {
		o := newHarness(t, k, func(o *Options) {
			o.OAuth = OAuth{Resource: "https://mcp.example.com/mcp", AuthorizationServers: []string{"https://issuer.example.com"}, Scopes: []string{"openid", "groups"}}
		})
		obase := strings.TrimSuffix(o.url, mcpPath)
		want := `{"resource":"https://mcp.example.com/mcp","authorization_servers":["https://issuer.example.com"],"scopes_supported":["openid","groups"],"bearer_methods_supported":["header"],"resource_name":"coder-k8s MCP"}` + "\n"
		for _, path := range []string{wellKnownPath + mcpPath, wellKnownPath} {
			if status, _, body := get(t, obase+path); status != http.StatusOK || body != want {
				t.Errorf("GET %s: %d %q; want %q", path, status, body, want)
			}
		}
		status, header, _ := o.post(t, "not-a-token")
		if got, want := header.Get("WWW-Authenticate"), `Bearer resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp", error="invalid_token"`; status != http.StatusUnauthorized || got != want {
			t.Errorf("status %d, WWW-Authenticate %q; want 401, %q", status, got, want)
		}
	})
}

// authenticatedAs is a fake kube-apiserver whose TokenReviews authenticate
// every token as user with audiences.
func authenticatedAs(user string, audiences ...string) *fake.Clientset {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{
			Authenticated: true, Audiences: audiences, User: authenticationv1.UserInfo{Username: user},
		}}, nil
	})
	return cs
}

// TestAudienceAwareReviews: an answer that names none of mcp.audiences
// (an authenticator that ignores audiences) is a rejection.
func TestAudienceAwareReviews(t *testing.T) {
	noClients := func(string) (Kube, error) { return Kube{}, nil }
	r := newTokenReviewer(authenticatedAs("alice", "https://kubernetes.default.svc"), []string{"coder-k8s-mcp"}, noClients)
	_, err := r.verify(t.Context(), "some-token", nil)
	want := `the bearer token is not meant for this server: its audiences ["https://kubernetes.default.svc"] include none of mcp.audiences ["coder-k8s-mcp"]: invalid token`
	if !errors.Is(err, auth.ErrInvalidToken) || err.Error() != want {
		t.Fatalf("verify: %v\nwant: %s", err, want)
	}
	r = newTokenReviewer(authenticatedAs("alice", "coder-k8s-mcp"), []string{"coder-k8s-mcp", "other"}, noClients)
	if info, err := r.verify(t.Context(), "some-token", nil); err != nil || info.UserID != "alice" {
		t.Fatalf("verify with a matching audience: %v, %+v", err, info)
	}
}

// TestReviewsAreRememberedButNotFailures: a verdict, acceptance or
// rejection, is reused with its reason and its caller; a TokenReview that
// failed is not, and the next check asks again.
func TestReviewsAreRememberedButNotFailures(t *testing.T) {
	var reviews int
	failing := true
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews++
		if failing {
			return true, nil, errors.New("connection refused")
		}
		status := authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "alice"}}
		if a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).Spec.Token != "good" {
			status = authenticationv1.TokenReviewStatus{Error: "no such token"}
		}
		return true, &authenticationv1.TokenReview{Status: status}, nil
	})
	r := newTokenReviewer(cs, nil, func(string) (Kube, error) { return Kube{}, nil })
	for i := range 2 {
		if _, err := r.verify(t.Context(), "good", nil); err == nil || errors.Is(err, auth.ErrInvalidToken) || !strings.Contains(err.Error(), "check the token with kube-apiserver: connection refused") {
			t.Fatalf("verify while kube-apiserver fails: %v, want an error that is not ErrInvalidToken", err)
		}
		if reviews != i+1 {
			t.Fatalf("%d failed checks cost %d TokenReviews, want one each", i+1, reviews)
		}
	}
	failing, reviews = false, 0
	var first *auth.TokenInfo
	for range 3 {
		info, err := r.verify(t.Context(), "good", nil)
		if err != nil || info.UserID != "alice" || !info.Expiration.After(time.Now()) {
			t.Fatalf("verify: %v, %+v", err, info)
		}
		if first == nil {
			first = info
		} else if info.Extra[callerKey] != first.Extra[callerKey] {
			t.Errorf("a second check of the token has a new caller, want the one of the first (its clients)")
		}
		const want = "the bearer token is not valid for this cluster: no such token: invalid token"
		if _, err := r.verify(t.Context(), "bad", nil); !errors.Is(err, auth.ErrInvalidToken) || err.Error() != want {
			t.Fatalf("verify of a bad token: %v, want %s", err, want)
		}
	}
	if reviews != 2 {
		t.Errorf("three checks each of a good and a bad token cost %d TokenReviews, want 2", reviews)
	}
}

// TestCallerClientsCarryNoOperatorCredentials sends a request with a
// caller's clients built from a configuration full of credentials: only
// the caller's token arrives.
func TestCallerClientsCarryNoOperatorCredentials(t *testing.T) {
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"gitVersion":"v1.36.0"}`))
	}))
	t.Cleanup(srv.Close)
	operator := &rest.Config{
		Host:        srv.URL,
		BearerToken: "operator-token", Username: "operator", Password: "secret",
		Impersonate: rest.ImpersonationConfig{UserName: "someone-else", Groups: []string{"system:masters"}},
		QPS:         50, Burst: 100, Timeout: 7 * time.Second, UserAgent: "coder-k8s",
	}
	cc, err := newCallerClients(operator, runtime.NewScheme(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := cc.config; c.BearerToken != "" || c.BearerTokenFile != "" || c.Username != "" || c.Password != "" || c.Impersonate.UserName != "" ||
		c.ExecProvider != nil || c.AuthProvider != nil || c.CertData != nil || c.KeyData != nil || c.Host != srv.URL || c.QPS != 50 || c.Burst != 100 || cc.timeout != 7*time.Second {
		t.Errorf("caller configuration: %+v", c)
	}
	kube, err := cc.forToken("caller-token")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.Clientset.Discovery().RESTClient().Get().AbsPath("/version").DoRaw(context.Background()); err != nil {
		t.Fatal(err)
	}
	if a := got.Get("Authorization"); a != "Bearer caller-token" {
		t.Errorf("Authorization %q, want the caller's token", a)
	}
	for h := range got {
		if strings.HasPrefix(h, "Impersonate-") {
			t.Errorf("impersonation header %s sent", h)
		}
	}
	if ua := got.Get("User-Agent"); ua != "coder-k8s" {
		t.Errorf("User-Agent %q", ua)
	}
}
