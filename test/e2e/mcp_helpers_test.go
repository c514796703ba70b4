package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// e2eMCPRecorder keeps the text and structured content of every tool result,
// to check that none carries a credential.
type e2eMCPRecorder struct {
	outputs []string
}

func (r *e2eMCPRecorder) record(res *mcp.CallToolResult) {
	r.outputs = append(r.outputs, e2eMCPText(res))
	if res.StructuredContent != nil {
		raw, _ := json.Marshal(res.StructuredContent)
		r.outputs = append(r.outputs, string(raw))
	}
}

// e2eMCPAgent is an MCP client session of one agent with one server.
type e2eMCPAgent struct {
	session *mcp.ClientSession
	rec     *e2eMCPRecorder
}

func (r *e2eMCPRecorder) connect(t *testing.T, base, token string) *e2eMCPAgent {
	t.Helper()
	return &e2eMCPAgent{session: mcpclient.MustConnect(t, base+"/mcp", mcpclient.Options{Token: token}), rec: r}
}

// call calls a tool and decodes its structured content into out (when not
// nil and the call succeeded). A protocol error fails the test: every
// failure must come back as an isError result.
func (a *e2eMCPAgent) call(t *testing.T, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	res := mcpclient.MustCall(t, a.session, name, args, out)
	a.rec.record(res)
	return res
}

// e2eMCPMust fails the test on an isError result.
func e2eMCPMust(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", e2eMCPText(res))
	}
}

// e2eMCPText is the text content of a result (the suite's benchmarks use
// it too).
func e2eMCPText(res *mcp.CallToolResult) string { return mcpclient.Text(res) }

// e2eMCPPostInitialize sends an MCP initialize request over plain HTTP and
// returns the status code and body.
func e2eMCPPostInitialize(t *testing.T, url, token string) (int, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// e2eMCPListTools lists every tool, following pages.
func e2eMCPListTools(t *testing.T, a *e2eMCPAgent) []*mcp.Tool {
	t.Helper()
	tools, err := mcpclient.ListTools(context.Background(), a.session)
	if err != nil {
		t.Fatal(err)
	}
	return tools
}

func e2eMCPToolNames(tools []*mcp.Tool) []string {
	names := make([]string, len(tools))
	for i, tool := range tools {
		names[i] = tool.Name
	}
	sort.Strings(names)
	return names
}

// e2eMCPServiceAccountToken creates ServiceAccount name in the agents'
// namespace and returns a token for it from the TokenRequest API, as an
// agent would get one.
func e2eMCPServiceAccountToken(t *testing.T, s *aggStack, name string) string {
	t.Helper()
	ctx := context.Background()
	if err := s.k.EnsureNamespace(ctx, e2eMCPAgentNamespace); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e2eMCPAgentNamespace}}
	if err := s.c.Create(ctx, sa); err != nil {
		t.Fatal(err)
	}
	return serviceAccountToken(t, s, e2eMCPAgentNamespace, name)
}

// serviceAccountToken is a one-hour token of ServiceAccount ns/name from
// the TokenRequest API.
func serviceAccountToken(t *testing.T, s *aggStack, ns, name string) string {
	t.Helper()
	expiry := int64(3600)
	tr, err := s.k.Clientset.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", ns, name, err)
	}
	return tr.Status.Token
}

// e2eMCPGrant gives ServiceAccount agents/name the rules in namespace ("" for
// every namespace, with a ClusterRole).
func e2eMCPGrant(t *testing.T, s *aggStack, name, namespace string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	role := fmt.Sprintf("mcp-e2e-%s-%d", name, time.Now().UnixNano())
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e2eMCPAgentNamespace}}
	var err error
	if namespace == "" {
		if err = s.c.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}); err == nil {
			err = s.c.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}})
		}
	} else {
		if err = s.c.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: namespace}, Rules: rules}); err == nil {
			err = s.c.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: namespace}, Subjects: subjects,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role}})
		}
	}
	if err != nil {
		t.Fatalf("grant %s: %v", name, err)
	}
}
