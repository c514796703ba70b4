package mcpserver

import (
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/config"
)

func TestAuthentication(t *testing.T) {
	h := newHarness(t, nil, nil)

	t.Run("a request without a token gets 401", func(t *testing.T) {
		resp, err := http.Post(h.url, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", resp.StatusCode)
		}
	})

	t.Run("an invalid token gets 401", func(t *testing.T) {
		if _, err := connectMCP(t.Context(), h.url, "not-a-token"); err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
			t.Fatalf("connect with an invalid token: %v, want 401", err)
		}
	})

	t.Run("a ServiceAccount without RBAC gets a clear authorization error", func(t *testing.T) {
		s := h.connect(t, h.serviceAccountToken(t, "agents", "nobody"))
		res := callTool(t, s, "list_workspaces", map[string]any{"namespace": "team"}, nil)
		if !res.IsError || !strings.Contains(resultText(res), `"system:serviceaccount:agents:nobody" may not list coderworkspaces.aggregation.coder.com in namespace team`) {
			t.Fatalf("result %v: %s", res.IsError, resultText(res))
		}
	})

	t.Run("with RBAC the same call passes authorization", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "reader")
		h.grant(t, "agents", "reader", "team", rbacv1.PolicyRule{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces"}, Verbs: []string{"list"}})
		s := h.connect(t, token)
		res := callTool(t, s, "list_workspaces", map[string]any{"namespace": "team"}, nil)
		// This harness serves no aggregated API, so the call gets as far
		// as kube-apiserver, which does not know the resource.
		if text := resultText(res); strings.Contains(text, "may not") || !strings.Contains(text, "list coderworkspaces") {
			t.Fatalf("result: %s", text)
		}
	})

	t.Run("an oversized request body is refused", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "big")
		req, _ := http.NewRequest(http.MethodPost, h.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"`+strings.Repeat("a", 2<<20)+`"}}`))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Fatalf("status %d for a 2 MiB body, want 4xx", resp.StatusCode)
		}
	})
}

func TestToolSelection(t *testing.T) {
	var names []string
	for _, tc := range []struct {
		name   string
		mutate func(*config.MCP)
		has    []string
		hasNot []string
	}{
		{"default", nil, []string{"list_workspaces", "set_workspace_running"}, []string{"delete_workspace"}},
		{"read-only", func(c *config.MCP) { c.ReadOnly = true }, []string{"list_workspaces"}, []string{"set_workspace_running", "delete_workspace"}},
		{"destructive allowed", func(c *config.MCP) { c.AllowDestructiveTools = true }, []string{"delete_workspace"}, nil},
		{"allow list", func(c *config.MCP) { c.AllowTools = []string{"get_workspace"} }, []string{"get_workspace"}, []string{"list_workspaces"}},
		{"deny list", func(c *config.MCP) { c.DenyTools = []string{"get_workspace"} }, []string{"list_workspaces"}, []string{"get_workspace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default().MCP
			cfg.Auth = config.MCPAuthNone
			if tc.mutate != nil {
				tc.mutate(&cfg)
			}
			srv, err := New(Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			names = srv.Tools()
			for _, n := range tc.has {
				if !slices.Contains(names, n) {
					t.Errorf("%s missing from %v", n, names)
				}
			}
			for _, n := range tc.hasNot {
				if slices.Contains(names, n) {
					t.Errorf("%s registered: %v", n, names)
				}
			}
		})
	}
	cfg := config.Default().MCP
	cfg.DenyTools = []string{"no_such_tool"}
	if _, err := New(Options{Config: cfg}); err == nil || !strings.Contains(err.Error(), `unknown tool "no_such_tool"`) {
		t.Errorf("an unknown tool name in denyTools: %v", err)
	}
	_ = mcp.Tool{}
}

// TestAllowedAccessIsRemembered calls a tool again and again: one
// SubjectAccessReview answers them until accessCacheTTL has passed, after
// which a revoked permission is refused; a denial is not remembered, so a
// permission granted after a refusal works on the next call.
func TestAllowedAccessIsRemembered(t *testing.T) {
	h := newHarness(t, nil, nil)
	var skew atomic.Int64
	h.srv.authz.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	sars := func() float64 { return h.requests(t, "authorization.k8s.io", "subjectaccessreviews") }
	passes := func(res *mcp.CallToolResult) bool {
		// This harness serves no aggregated API: an authorized call gets as
		// far as kube-apiserver, which does not know the resource.
		return !strings.Contains(resultText(res), "may not")
	}
	list := map[string]any{"namespace": "team"}

	s := h.connect(t, h.serviceAccountToken(t, "agents", "repeat"))
	h.grant(t, "agents", "repeat", "team", rbacv1.PolicyRule{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces"}, Verbs: []string{"list"}})
	before := sars()
	for range 5 {
		if res := callTool(t, s, "list_workspaces", list, nil); !passes(res) {
			t.Fatalf("refused with the permission granted: %s", resultText(res))
		}
	}
	if got := sars() - before; got != 1 {
		t.Errorf("5 calls cost %v SubjectAccessReviews, want 1", got)
	}

	// Revoked: refused once the allowance has expired.
	var bindings rbacv1.RoleBindingList
	if err := h.c.List(t.Context(), &bindings, client.InNamespace("team")); err != nil {
		t.Fatal(err)
	}
	for _, b := range bindings.Items {
		if b.Subjects[0].Name == "repeat" {
			if err := h.c.Delete(t.Context(), &b); err != nil {
				t.Fatal(err)
			}
		}
	}
	skew.Store(int64(accessCacheTTL))
	var res *mcp.CallToolResult
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if res = callTool(t, s, "list_workspaces", list, nil); !passes(res) {
			break
		}
	}
	if passes(res) || !strings.Contains(resultText(res), `"system:serviceaccount:agents:repeat" may not list coderworkspaces`) {
		t.Fatalf("after the TTL with the permission revoked: %s", resultText(res))
	}

	// A denial is asked again: granted after a refusal, the next call passes.
	s = h.connect(t, h.serviceAccountToken(t, "agents", "late"))
	if res := callTool(t, s, "list_workspaces", list, nil); passes(res) {
		t.Fatalf("allowed without a permission: %s", resultText(res))
	}
	h.grant(t, "agents", "late", "team", rbacv1.PolicyRule{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces"}, Verbs: []string{"list"}})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if res = callTool(t, s, "list_workspaces", list, nil); passes(res) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still refused 5 s after the grant: %s", resultText(res))
		}
	}
	// Bounded: with the cache full of live entries, a new allowance still
	// gets in and the cache stays at its bound.
	a := newAuthorizer(h.cs, false)
	expires := time.Now().Add(time.Hour)
	for i := range maxCachedAccess {
		a.allowed[sha256.Sum256([]byte(fmt.Sprint("filler-", i)))] = expires
	}
	key := sha256.Sum256([]byte("one-more"))
	a.remember(key)
	if !a.wasAllowed(key) || len(a.allowed) != maxCachedAccess {
		t.Errorf("after an allowance with the cache full: new entry kept %v, %d entries (bound %d)", a.wasAllowed(key), len(a.allowed), maxCachedAccess)
	}
}
