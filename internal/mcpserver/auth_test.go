package mcpserver

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
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

	t.Run("a ServiceAccount without RBAC gets kube-apiserver's refusal", func(t *testing.T) {
		s := h.connect(t, h.serviceAccountToken(t, "agents", "nobody"))
		res := callTool(t, s, "list_workspaces", map[string]any{"namespace": "team"}, nil)
		want := `list coderworkspaces: coderworkspaces.aggregation.coder.com is forbidden: User "system:serviceaccount:agents:nobody" cannot list resource "coderworkspaces" in API group "aggregation.coder.com" in the namespace "team" (the tools act with your own Kubernetes RBAC, as kubectl would; ask for a Role granting it)`
		if !res.IsError || resultText(res) != want {
			t.Fatalf("result (error %v): %s\nwant: %s", res.IsError, resultText(res), want)
		}
	})

	t.Run("with RBAC the same call passes authorization", func(t *testing.T) {
		token := h.serviceAccountToken(t, "agents", "reader")
		h.grant(t, "agents", "reader", "team", rbacv1.PolicyRule{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces"}, Verbs: []string{"list"}})
		s := h.connect(t, token)
		res := callTool(t, s, "list_workspaces", map[string]any{"namespace": "team"}, nil)
		// This harness serves no aggregated API, so the call gets past
		// RBAC to kube-apiserver, which does not know the resource.
		if text := resultText(res); strings.Contains(text, "forbidden") || !strings.Contains(text, "list coderworkspaces: the server could not find the requested resource") {
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
		mutate func(*Options)
		has    []string
		hasNot []string
	}{
		{"default", nil, []string{"list_workspaces", "set_workspace_running"}, []string{"delete_workspace"}},
		{"read-only", func(c *Options) { c.ReadOnly = true }, []string{"list_workspaces"}, []string{"set_workspace_running", "delete_workspace"}},
		{"destructive allowed", func(c *Options) { c.AllowDestructiveTools = true }, []string{"delete_workspace"}, nil},
		{"allow list", func(c *Options) { c.AllowTools = []string{"get_workspace"} }, []string{"get_workspace"}, []string{"list_workspaces"}},
		{"deny list", func(c *Options) { c.DenyTools = []string{"get_workspace"} }, []string{"list_workspaces"}, []string{"get_workspace"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := defaultOptions()
			o.AuthNone = true
			if tc.mutate != nil {
				tc.mutate(&o)
			}
			srv, err := New(o)
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
	o := defaultOptions()
	o.DenyTools = []string{"no_such_tool"}
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), `unknown tool "no_such_tool"`) {
		t.Errorf("an unknown tool name in denyTools: %v", err)
	}
	_ = mcp.Tool{}
}
