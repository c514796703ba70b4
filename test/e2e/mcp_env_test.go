package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// mcpEnv is what TestMCP's subtests share.
type mcpEnv struct {
	s *aggStack
	// full serves every tool (allowDestructiveTools), readOnly only those
	// that change nothing; the stack's operator serves the defaults.
	full, readOnly *Operator
	// rec records every tool result, of every agent.
	rec *e2eMCPRecorder
	// agent's sessions with the stack's operator, full and readOnly.
	agent, fullAgent, roAgent *e2eMCPAgent
	// Bearer tokens of ServiceAccounts agents/agent (may do what every
	// tool needs), agents/nobody (may do nothing) and agents/reader (may
	// read workspaces in the stack's namespace).
	agentToken, nobodyToken, readerToken string
	// bigFiles are the source files of template "big".
	bigFiles map[string]string
}

// newMCPEnv builds the stack, two more MCP servers, Coder content (three
// templates, one with large source files, and four workspaces of the
// first user, one of them stopped) and the agents, and waits until the
// aggregated API lists the workspaces.
func newMCPEnv(t *testing.T) *mcpEnv {
	s := newStack(t)
	ctx := context.Background()
	// The stack's operator (all mode) serves MCP with the default tools.
	// Two more processes serve MCP alone against the same kube-apiserver:
	// one with every tool (delete_workspace included), one read-only.
	full := StartOperator(t, OperatorOptions{Mode: "mcp-http", Kubeconfig: s.k.KubeconfigPath, MCP: "allowDestructiveTools: true"})
	readOnly := StartOperator(t, OperatorOptions{Mode: "mcp-http", Kubeconfig: s.k.KubeconfigPath, MCP: "readOnly: true, allowDestructiveTools: true"})

	// Coder content: three templates (one with large source files) and
	// four workspaces of the first user, one of them stopped.
	bigFiles := map[string]string{
		"main.tf": testenv.ProviderFreeTemplate()["main.tf"],
		"a.txt":   strings.Repeat("a", 70_000),
		"b.txt":   strings.Repeat("b", 70_000),
		"c.txt":   strings.Repeat("c", 70_000),
	}
	for name, files := range map[string]map[string]string{"base": testenv.ProviderFreeTemplate(), "other": testenv.ProviderFreeTemplate(), "big": bigFiles} {
		if _, err := s.coder.PushTemplate(ctx, name, files); err != nil {
			t.Fatal(err)
		}
	}
	for ws, tpl := range map[string]string{"ws-run": "base", "ws-stop": "base", "ws-other": "other", "ws-del": "base"} {
		if _, err := s.coder.CreateWorkspace(ctx, tpl, ws); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.coder.StopWorkspace(ctx, "ws-stop"); err != nil {
		t.Fatal(err)
	}

	// Agents: ServiceAccounts with tokens from the TokenRequest API.
	agentToken := e2eMCPServiceAccountToken(t, s, "agent")
	nobodyToken := e2eMCPServiceAccountToken(t, s, "nobody")
	readerToken := e2eMCPServiceAccountToken(t, s, "reader")
	e2eMCPGrant(t, s, "agent", "", []rbacv1.PolicyRule{
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces", "codertemplates", "codertemplateversions"}, Verbs: []string{"get", "list", "watch", "update", "patch", "delete"}},
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}},
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderusers"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"events", "pods", "pods/log", "services"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get", "list"}},
		// The tools check namespaces as the caller.
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
	}...)
	e2eMCPGrant(t, s, "reader", s.ns, rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list"}})

	for _, op := range []*Operator{s.op, full, readOnly} {
		op.WaitOK(t, op.MCP+"/readyz")
	}
	rec := &e2eMCPRecorder{}
	agent := rec.connect(t, s.op.MCP, agentToken)
	fullAgent := rec.connect(t, full.MCP, agentToken)
	roAgent := rec.connect(t, readOnly.MCP, agentToken)

	// The aggregated API shows what coderd holds once its cache has polled.
	testenv.WaitFor(t, 30*time.Second, func() error {
		var l mcpserver.WorkspaceList
		if res := agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns}, &l); res.IsError {
			return fmt.Errorf("list_workspaces: %s", e2eMCPText(res))
		}
		if len(l.Items) != 4 {
			return errNotYet(fmt.Sprintf("list_workspaces shows %d of 4 workspaces", len(l.Items)))
		}
		return nil
	})

	return &mcpEnv{s: s, full: full, readOnly: readOnly, rec: rec, agent: agent, fullAgent: fullAgent, roAgent: roAgent,
		agentToken: agentToken, nobodyToken: nobodyToken, readerToken: readerToken, bigFiles: bigFiles}
}
