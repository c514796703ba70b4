package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

var updateMCPGolden = flag.Bool("update", false, "rewrite testdata/mcp-tools.golden.json from the MCP server's tools/list")

// e2eMCPGolden is what tools/list shows an agent when every tool is allowed
// (allowDestructiveTools: true): names, titles, descriptions, input and
// output schemas and annotations.
const e2eMCPGolden = "testdata/mcp-tools.golden.json"

// e2eMCPAgentNamespace holds the ServiceAccounts the test's agents run as.
const e2eMCPAgentNamespace = "agents"

// TestMCP drives the MCP server with the go-sdk client over real HTTP, as
// ServiceAccounts with real RBAC, against kube-apiserver, the aggregated API
// and a real coderd, and checks every change in coderd itself. The
// subtests share one environment (newMCPEnv) and run in order: later ones
// see what earlier ones changed.
func TestMCP(t *testing.T) {
	env := newMCPEnv(t)
	runSubtests(t, env, []subtest[*mcpEnv]{
		{"tools/list matches the golden file; defaults hide destructive tools, read-only hides every mutating tool", testMCPToolsList},
		{"authentication: no or a bad token is HTTP 401", testMCPAuthentication},
		{"authorization: calls run with the caller's RBAC", testMCPAuthorization},
		{"list_templates and get_template, with source files capped", testMCPTemplates},
		{"list_template_versions lists a template's versions as coderd has them", testMCPTemplateVersions},
		{"list_workspaces filters and pages; get_workspace matches coderd", testMCPListWorkspaces},
		{"diagnose_workspace says whether a workspace is usable and why", testMCPDiagnoseWorkspace},
		{"set_workspace_running stops and starts a workspace in coderd", testMCPSetWorkspaceRunning},
		{"delete_workspace deletes the workspace in coderd", testMCPDeleteWorkspace},
		{"control planes, health and events", testMCPControlPlanes},
		{"whoami and list_users: the caller's Coder user, users as coderd shows them, filters; an unmapped caller", testMCPUsers},
		{"bad input is an isError result an agent can act on", testMCPBadInput},
		{"a namespace that does not exist is an error in every tool", testMCPUnknownNamespace},
		{"output caps: rows per page and message length", testMCPOutputCaps},
		{"read-only server offers no tool that changes anything", testMCPReadOnly},
		{"get_workspace_build_log and get_template_version_log read coderd's logs as the caller (a member's workspace added last)", testMCPBuildLogs},
		{"no tool result carries a credential; no MCP server panicked", testMCPNoCredentials},
	})
}

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

// testMCPToolsList checks that tools/list matches the golden file, the defaults hide destructive
// tools and a read-only server hides every mutating tool.
func testMCPToolsList(t *testing.T, env *mcpEnv) {
	agent, fullAgent, roAgent := env.agent, env.fullAgent, env.roAgent
	got := e2eMCPListTools(t, fullAgent)
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // descriptions say <organization>.<template>
	enc.SetIndent("", "  ")
	if err := enc.Encode(got); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	if *updateMCPGolden {
		if err := os.WriteFile(e2eMCPGolden, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(e2eMCPGolden)
	if err != nil {
		t.Fatalf("read %s (run go test ./test/e2e/ -run TestMCP -update): %v", e2eMCPGolden, err)
	}
	if !bytes.Equal(raw, want) {
		t.Errorf("tools/list differs from %s; if the change is intended run `go test ./test/e2e/ -run TestMCP -update`\n--- got\n%s", e2eMCPGolden, raw)
	}
	var golden []*mcp.Tool
	if err := json.Unmarshal(want, &golden); err != nil {
		t.Fatal(err)
	}
	wantNames := []string{"create_workspace", "delete_workspace", "diagnose_workspace", "get_control_plane", "get_control_plane_rollout", "get_control_plane_service", "get_pod_logs",
		"get_template", "get_template_version_log", "get_workspace", "get_workspace_build_log", "health", "list_control_plane_pods", "list_control_planes", "list_events",
		"list_template_parameters", "list_template_versions", "list_templates", "list_users", "list_workspaces", "set_workspace_running", "update_workspace", "whoami"}
	if names := e2eMCPToolNames(golden); !slices.Equal(names, wantNames) {
		t.Errorf("golden tools %v, want %v", names, wantNames)
	}
	var readOnlyNames, defaultNames []string
	for _, tool := range golden {
		a := tool.Annotations
		if tool.Title == "" || tool.Description == "" || a == nil || a.Title != tool.Title || a.DestructiveHint == nil || a.OpenWorldHint == nil {
			t.Errorf("tool %s lacks a title, description or annotations: %+v", tool.Name, tool)
			continue
		}
		for what, schema := range map[string]any{"input": tool.InputSchema, "output": tool.OutputSchema} {
			if m, ok := schema.(map[string]any); !ok || m["type"] != "object" {
				t.Errorf("tool %s: %s schema is not an object schema: %v", tool.Name, what, schema)
			}
		}
		mutating := slices.Contains([]string{"set_workspace_running", "delete_workspace", "create_workspace", "update_workspace"}, tool.Name)
		if a.ReadOnlyHint == mutating {
			t.Errorf("tool %s: readOnlyHint %v", tool.Name, a.ReadOnlyHint)
		}
		if *a.DestructiveHint != (tool.Name == "delete_workspace") {
			t.Errorf("tool %s: destructiveHint %v", tool.Name, *a.DestructiveHint)
		}
		if a.ReadOnlyHint {
			readOnlyNames = append(readOnlyNames, tool.Name)
		}
		if !*a.DestructiveHint {
			defaultNames = append(defaultNames, tool.Name)
		}
	}
	// The operator's defaults: everything but destructive tools, with
	// the same descriptions.
	def := e2eMCPListTools(t, agent)
	if names := e2eMCPToolNames(def); !slices.Equal(names, defaultNames) {
		t.Errorf("default tools %v, want %v", names, defaultNames)
	}
	for _, tool := range def {
		i := slices.IndexFunc(golden, func(g *mcp.Tool) bool { return g.Name == tool.Name })
		a, _ := json.Marshal(tool)
		b, _ := json.Marshal(golden[i])
		if !bytes.Equal(a, b) {
			t.Errorf("tool %s differs between the default and the full server:\n%s\n%s", tool.Name, a, b)
		}
	}
	if names := e2eMCPToolNames(e2eMCPListTools(t, roAgent)); !slices.Equal(names, readOnlyNames) {
		t.Errorf("read-only tools %v, want %v (readOnly wins over allowDestructiveTools)", names, readOnlyNames)
	}
}

// testMCPAuthentication checks that a call without a token, or with one kube-apiserver does not know,
// is HTTP 401; the health endpoints need none.
func testMCPAuthentication(t *testing.T, env *mcpEnv) {
	ctx, s := context.Background(), env.s
	for name, token := range map[string]string{"no token": "", "a token kube-apiserver does not know": "not-a-token"} {
		code, body := e2eMCPPostInitialize(t, s.op.MCP+"/mcp", token)
		if code != http.StatusUnauthorized {
			t.Errorf("%s: initialize answered %d %s, want 401", name, code, body)
		}
		if _, err := mcpclient.Connect(ctx, s.op.MCP+"/mcp", mcpclient.Options{Token: token}); err == nil {
			t.Errorf("%s: the go-sdk client connected", name)
		}
	}
	// The health endpoints need no token.
	if code, body, err := get(ctx, s.op.MCP+"/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("GET /healthz: %d %s %v", code, body, err)
	}
}

// testMCPAuthorization checks that tool calls run with the caller's RBAC, errors name the Role to
// ask for, and a grant takes effect without reconnecting.
func testMCPAuthorization(t *testing.T, env *mcpEnv) {
	s, rec, nobodyToken, readerToken, wsName := env.s, env.rec, env.nobodyToken, env.readerToken, env.s.workspaceName
	nobody := rec.connect(t, s.op.MCP, nobodyToken)
	// kube-apiserver's own refusals: the tools call it with the caller's
	// token.
	const who = `User "system:serviceaccount:` + e2eMCPAgentNamespace + `:nobody"`
	inNS := ` in the namespace "` + s.ns + `"`
	for _, c := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{"list_workspaces", map[string]any{"namespace": s.ns}, who + ` cannot list resource "coderworkspaces" in API group "aggregation.coder.com"` + inNS},
		{"list_templates", nil, who + ` cannot list resource "codertemplates" in API group "aggregation.coder.com" at the cluster scope`},
		{"get_control_plane", map[string]any{"namespace": s.ns, "name": "coder"}, who + ` cannot get resource "codercontrolplanes" in API group "coder.com"` + inNS},
		{"list_events", map[string]any{"namespace": s.ns}, who + ` cannot list resource "events" in API group ""` + inNS},
		{"diagnose_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-run")}, who + ` cannot get resource "coderworkspaces" in API group "aggregation.coder.com"` + inNS},
		{"health", nil, who + ` cannot list resource "codercontrolplanes" in API group "coder.com" at the cluster scope`},
	} {
		res := nobody.call(t, c.tool, c.args, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, c.want) || !strings.Contains(text, "Role") {
			t.Errorf("%s without RBAC: isError %v %q, want an error containing %q and naming the Role to ask for", c.tool, res.IsError, text, c.want)
		}
	}

	// A Role that allows reading workspaces, not changing them.
	reader := rec.connect(t, s.op.MCP, readerToken)
	var l mcpserver.WorkspaceList
	testenv.WaitFor(t, 30*time.Second, func() error {
		if res := reader.call(t, "list_workspaces", map[string]any{"namespace": s.ns}, &l); res.IsError {
			return fmt.Errorf("reader: %s", e2eMCPText(res))
		}
		return nil
	})
	if len(l.Items) != 4 {
		t.Errorf("reader sees %d workspaces, want 4", len(l.Items))
	}
	before := s.coderWorkspace(t, "ws-run")
	res := reader.call(t, "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": false}, nil)
	want := `User "system:serviceaccount:` + e2eMCPAgentNamespace + `:reader" cannot patch resource "coderworkspaces" in API group "aggregation.coder.com" in the namespace "` + s.ns + `"`
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, want) {
		t.Errorf("set_workspace_running by a reader: isError %v %q, want %q", res.IsError, text, want)
	}
	if after := s.coderWorkspace(t, "ws-run"); after.LatestBuild.ID != before.LatestBuild.ID {
		t.Errorf("a refused call started build %d in coderd", after.LatestBuild.BuildNumber)
	}
	res = reader.call(t, "list_workspaces", nil, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, `cannot list resource "coderworkspaces" in API group "aggregation.coder.com" at the cluster scope`) {
		t.Errorf("list_workspaces in every namespace with a namespaced Role: isError %v %q", res.IsError, text)
	}

	// Granting the permission makes the same token work: nothing
	// about the caller's rights is cached.
	e2eMCPGrant(t, s, "nobody", s.ns, rbacv1.PolicyRule{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get"}})
	testenv.WaitFor(t, 30*time.Second, func() error {
		var d mcpserver.ControlPlaneDetail
		if res := nobody.call(t, "get_control_plane", map[string]any{"namespace": s.ns, "name": "coder"}, &d); res.IsError {
			return fmt.Errorf("after the grant: %s", e2eMCPText(res))
		}
		if d.Name != "coder" {
			return fmt.Errorf("get_control_plane after the grant: %+v", d)
		}
		return nil
	})
}

// testMCPTemplateVersions checks list_template_versions against coderd:
// every version of template base, the active one marked, with its author.
func testMCPTemplateVersions(t *testing.T, env *mcpEnv) {
	ctx, s, agent := context.Background(), env.s, env.agent
	tpl, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "base")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, v := range vs {
		want = append(want, fmt.Sprintf("coder.base.%s %s %v %s", v.Name, v.CreatedBy.Username, v.ID == tpl.ActiveVersionID, v.Job.Status))
	}
	sort.Strings(want)
	var l mcpserver.TemplateVersionList
	e2eMCPMust(t, agent.call(t, "list_template_versions", map[string]any{"namespace": s.ns, "template": "base"}, &l))
	var got []string
	for _, r := range l.Items {
		got = append(got, fmt.Sprintf("%s %s %v %s", r.Name, r.CreatedBy, r.Active, r.BuildStatus))
	}
	if !slices.Equal(got, want) {
		t.Errorf("list_template_versions template base: %v, want %v", got, want)
	}
}

// testMCPTemplates checks that list_templates and get_template match coderd, page, and cap the
// source files they show.
func testMCPTemplates(t *testing.T, env *mcpEnv) {
	ctx, s, agent, bigFiles := context.Background(), env.s, env.agent, env.bigFiles
	var l mcpserver.TemplateList
	e2eMCPMust(t, agent.call(t, "list_templates", map[string]any{"namespace": s.ns}, &l))
	byName := map[string]mcpserver.TemplateRow{}
	for _, r := range l.Items {
		byName[r.Name] = r
	}
	for _, name := range []string{"coder.base", "coder.other", "coder.big"} {
		if r, ok := byName[name]; !ok || r.Namespace != s.ns || r.ActiveVersion == "" || r.BuildStatus != "succeeded" {
			t.Errorf("list_templates row %s: %+v (present %v)", name, r, ok)
		}
	}
	if l.Continue != "" || len(l.Items) != 3 {
		t.Errorf("list_templates: %d rows, continue %q; want the 3 templates on one page", len(l.Items), l.Continue)
	}
	// One row a page: the continue tokens walk the same list.
	var paged []string
	cont := ""
	for range 5 {
		var p mcpserver.TemplateList
		e2eMCPMust(t, agent.call(t, "list_templates", map[string]any{"namespace": s.ns, "limit": 1, "continue": cont}, &p))
		if len(p.Items) != 1 {
			t.Fatalf("list_templates limit 1: %d rows", len(p.Items))
		}
		paged = append(paged, p.Items[0].Name)
		if cont = p.Continue; cont == "" {
			break
		}
	}
	if want := []string{"coder.base", "coder.big", "coder.other"}; !slices.Equal(paged, want) {
		t.Errorf("paging through list_templates: %v, want %v", paged, want)
	}

	tpl, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "base")
	if err != nil {
		t.Fatal(err)
	}
	var d mcpserver.TemplateDetail
	e2eMCPMust(t, agent.call(t, "get_template", map[string]any{"namespace": s.ns, "name": "coder.base"}, &d))
	if d.ActiveVersionID != tpl.ActiveVersionID.String() || d.Organization != s.org || d.BuildStatus != "succeeded" ||
		!slices.Equal(d.FileNames, []string{"main.tf"}) || d.Files != nil {
		t.Errorf("get_template coder.base: %+v; coderd active version %s", d, tpl.ActiveVersionID)
	}
	// Its versions, newest first: coderd's list for the template.
	vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: tpl.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Versions) != len(vs) || d.VersionsError != "" {
		t.Errorf("get_template coder.base versions %+v (%s), coderd has %d", d.Versions, d.VersionsError, len(vs))
	}
	for _, v := range d.Versions {
		if v.Active != (v.Name == "coder.base."+d.ActiveVersionName) || v.BuildStatus != "succeeded" || v.Template != "base" {
			t.Errorf("get_template coder.base version %+v; active version %s", v, d.ActiveVersionName)
		}
	}
	e2eMCPMust(t, agent.call(t, "get_template", map[string]any{"namespace": s.ns, "name": "coder.base", "includeFiles": true}, &d))
	if d.Files["main.tf"] != testenv.ProviderFreeTemplate()["main.tf"] || len(d.TruncatedFiles) != 0 {
		t.Errorf("get_template coder.base includeFiles: files %v truncated %v", d.Files, d.TruncatedFiles)
	}

	// Caps: 4 KiB a file by default, at most 64 KiB a file and 128 KiB
	// in all whatever the caller asks.
	for _, c := range []struct {
		maxFileBytes, perFile int
	}{{0, 4096}, {100, 100}, {1 << 30, 64 << 10}} {
		var big mcpserver.TemplateDetail
		args := map[string]any{"namespace": s.ns, "name": "coder.big", "includeFiles": true}
		if c.maxFileBytes != 0 {
			args["maxFileBytes"] = c.maxFileBytes
		}
		res := agent.call(t, "get_template", args, &big)
		e2eMCPMust(t, res)
		total := 0
		for _, name := range big.FileNames {
			src, got := bigFiles[name], big.Files[name]
			total += len(got)
			if len(got) > c.perFile || !strings.HasPrefix(src, got) {
				t.Errorf("maxFileBytes %d: file %s has %d bytes (cap %d) or is not the source's start", c.maxFileBytes, name, len(got), c.perFile)
			}
			if cut := slices.Contains(big.TruncatedFiles, name); cut == (got == src) {
				t.Errorf("maxFileBytes %d: file %s: %d of %d bytes shown, listed as truncated: %v", c.maxFileBytes, name, len(got), len(src), cut)
			}
		}
		if total > 128<<10 {
			t.Errorf("maxFileBytes %d: %d bytes of source in one result", c.maxFileBytes, total)
		}
		if n := len(e2eMCPText(res)); n > 300<<10 {
			t.Errorf("maxFileBytes %d: the result text has %d bytes", c.maxFileBytes, n)
		}
		if !slices.Equal(big.FileNames, []string{"a.txt", "b.txt", "c.txt", "main.tf"}) {
			t.Errorf("fileNames %v", big.FileNames)
		}
	}
}

// testMCPListWorkspaces checks that list_workspaces filters and pages, and get_workspace matches
// coderd.
func testMCPListWorkspaces(t *testing.T, env *mcpEnv) {
	s, agent, wsName := env.s, env.agent, env.s.workspaceName
	list := func(args map[string]any) []string {
		t.Helper()
		var l mcpserver.WorkspaceList
		e2eMCPMust(t, agent.call(t, "list_workspaces", args, &l))
		var names []string
		for _, r := range l.Items {
			names = append(names, r.Name)
			if r.Owner != s.coder.Username || r.Namespace != s.ns || r.Template == "" || r.Status == "" || r.LastBuilt == "" {
				t.Errorf("list_workspaces %v row: %+v", args, r)
			}
		}
		return names
	}
	all := []string{wsName("ws-del"), wsName("ws-other"), wsName("ws-run"), wsName("ws-stop")}
	for _, c := range []struct {
		args map[string]any
		want []string
	}{
		{map[string]any{"namespace": s.ns}, all},
		{map[string]any{}, all},
		{map[string]any{"owner": s.coder.Username}, all},
		{map[string]any{"owner": "someone-else"}, nil},
		{map[string]any{"template": "other"}, []string{wsName("ws-other")}},
		{map[string]any{"namespace": s.ns, "running": false}, []string{wsName("ws-stop")}},
		{map[string]any{"namespace": s.ns, "running": true, "template": "base"}, []string{wsName("ws-del"), wsName("ws-run")}},
	} {
		if got := list(c.args); !slices.Equal(got, c.want) {
			t.Errorf("list_workspaces %v: %v, want %v", c.args, got, c.want)
		}
	}
	var paged []string
	cont := ""
	for range 4 {
		var p mcpserver.WorkspaceList
		e2eMCPMust(t, agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns, "limit": 3, "continue": cont}, &p))
		for _, r := range p.Items {
			paged = append(paged, r.Name)
		}
		if cont = p.Continue; cont == "" {
			break
		}
	}
	if !slices.Equal(paged, all) {
		t.Errorf("paging through list_workspaces with limit 3: %v, want %v", paged, all)
	}
	res := agent.call(t, "list_workspaces", map[string]any{"namespace": s.ns, "continue": "not-a-token"}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "call it again without continue") {
		t.Errorf("a made-up continue token: isError %v %q", res.IsError, text)
	}

	cw := s.coderWorkspace(t, "ws-run")
	var d mcpserver.WorkspaceDetail
	e2eMCPMust(t, agent.call(t, "get_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-run")}, &d))
	if d.ID != cw.ID.String() || d.Owner != s.coder.Username || d.Organization != s.org || d.Template != "base" || !d.Running ||
		d.Status != string(codersdk.WorkspaceStatusRunning) || d.LatestBuild == nil || d.LatestBuild.ID != cw.LatestBuild.ID.String() ||
		d.LatestBuild.Transition != "start" || d.LatestBuild.JobStatus != "succeeded" {
		t.Errorf("get_workspace ws-run: %+v; coderd: id %s build %s %s %s", d, cw.ID, cw.LatestBuild.ID, cw.LatestBuild.Transition, cw.LatestBuild.Job.Status)
	}
	// The provider-free template has no agent: running is usable.
	if !d.Ready || len(d.Agents) != 0 || !slices.Contains(d.Conditions, "Ready=True (Running): the workspace is running (it has no agents)") {
		t.Errorf("get_workspace ws-run: ready %v, agents %+v, conditions %q; want ready, no agents, Ready=True (Running)", d.Ready, d.Agents, d.Conditions)
	}
}

// testMCPDiagnoseWorkspace checks diagnose_workspace on a running
// workspace without agents (usable, no pods) and on one that does not
// exist (isError); testMCPAuthorization checks it without RBAC.
func testMCPDiagnoseWorkspace(t *testing.T, env *mcpEnv) {
	s, agent, wsName := env.s, env.agent, env.s.workspaceName
	cw := s.coderWorkspace(t, "ws-run")
	var d mcpserver.WorkspaceDiagnosis
	e2eMCPMust(t, agent.call(t, "diagnose_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-run")}, &d))
	if d.Workspace.ID != cw.ID.String() || !d.Usable || d.Summary != "Running: the workspace is running (it has no agents)" || len(d.Pods) != 0 {
		t.Errorf("diagnose_workspace ws-run: %+v; want coderd's workspace %s, usable, no pods", d, cw.ID)
	}
	res := agent.call(t, "diagnose_workspace", map[string]any{"namespace": s.ns, "name": wsName("no-such-ws")}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") {
		t.Errorf("diagnose_workspace of a missing workspace: isError %v %q", res.IsError, text)
	}
}

// testMCPSetWorkspaceRunning checks that set_workspace_running stops and starts ws-run in coderd, and
// changes nothing when it already is as asked.
func testMCPSetWorkspaceRunning(t *testing.T, env *mcpEnv) {
	s, agent, wsName := env.s, env.agent, env.s.workspaceName
	for _, running := range []bool{false, true} {
		transition, status := codersdk.WorkspaceTransitionStop, codersdk.WorkspaceStatusStopped
		if running {
			transition, status = codersdk.WorkspaceTransitionStart, codersdk.WorkspaceStatusRunning
		}
		before := s.coderWorkspace(t, "ws-run")
		var r mcpserver.SetRunningResult
		start := time.Now()
		e2eMCPMust(t, agent.call(t, "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": running, "waitSeconds": 60}, &r))
		t.Logf("set_workspace_running %v returned after %s (waited %.1fs)", running, time.Since(start).Round(time.Millisecond), r.WaitedSecs)
		cw := s.coderWorkspace(t, "ws-run")
		if cw.LatestBuild.ID == before.LatestBuild.ID || cw.LatestBuild.Transition != transition || cw.LatestBuild.Job.Status != codersdk.ProvisionerJobSucceeded || cw.LatestBuild.Status != status {
			t.Errorf("running %v: coderd's latest build %d %s %s (%s); before the call build %d", running, cw.LatestBuild.BuildNumber, cw.LatestBuild.Transition, cw.LatestBuild.Job.Status, cw.LatestBuild.Status, before.LatestBuild.BuildNumber)
		}
		if !r.Changed || !r.BuildDone || r.Workspace.Running != running || r.Workspace.LatestBuild == nil ||
			r.Workspace.LatestBuild.ID != cw.LatestBuild.ID.String() || r.Workspace.LatestBuild.JobStatus != "succeeded" || r.Workspace.Status != string(status) {
			t.Errorf("running %v: result %+v (latest build %+v); coderd's latest build %s", running, r, r.Workspace.LatestBuild, cw.LatestBuild.ID)
		}
		// The same state again changes nothing.
		var again mcpserver.SetRunningResult
		e2eMCPMust(t, agent.call(t, "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": running}, &again))
		if again.Changed || s.coderWorkspace(t, "ws-run").LatestBuild.ID != cw.LatestBuild.ID {
			t.Errorf("running %v again: changed %v, or coderd got a new build", running, again.Changed)
		}
	}
	res := agent.call(t, "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": false, "waitSeconds": 500}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "waitSeconds must be between 0 and 120") {
		t.Errorf("waitSeconds 500: isError %v %q", res.IsError, text)
	}
	if cw := s.coderWorkspace(t, "ws-run"); cw.LatestBuild.Transition != codersdk.WorkspaceTransitionStart {
		t.Errorf("a refused waitSeconds still stopped the workspace")
	}
}

// testMCPDeleteWorkspace checks that delete_workspace is offered only with allowDestructiveTools
// and deletes ws-del in coderd.
func testMCPDeleteWorkspace(t *testing.T, env *mcpEnv) {
	ctx, s, agent, fullAgent, wsName := context.Background(), env.s, env.agent, env.fullAgent, env.s.workspaceName
	res := agent.call(t, "delete_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-del")}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, `unknown tool "delete_workspace"`) {
		t.Errorf("delete_workspace on a server that does not allow destructive tools: isError %v %q", res.IsError, text)
	}
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-del", codersdk.WorkspaceOptions{}); err != nil {
		t.Fatalf("ws-del is gone although delete_workspace was not offered: %v", err)
	}
	var d mcpserver.WorkspaceDetail
	e2eMCPMust(t, fullAgent.call(t, "delete_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-del")}, &d))
	if !d.Deleting || d.Name != wsName("ws-del") {
		t.Errorf("delete_workspace result: %+v", d)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		_, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-del", codersdk.WorkspaceOptions{})
		if err == nil {
			return errNotYet("coderd still has ws-del")
		}
		if !strings.Contains(err.Error(), "404") && !strings.Contains(strings.ToLower(err.Error()), "not found") {
			return err
		}
		return nil
	})
	testenv.WaitFor(t, 30*time.Second, func() error {
		res := fullAgent.call(t, "get_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-del")}, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") {
			return errNotYet(fmt.Sprintf("get_workspace after the delete: isError %v %q", res.IsError, text))
		}
		return nil
	})
	// Deleting what is gone says so.
	res = fullAgent.call(t, "delete_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-del")}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") || !strings.Contains(text, "list tools show what exists") {
		t.Errorf("delete_workspace of a deleted workspace: isError %v %q", res.IsError, text)
	}
}

// testMCPControlPlanes checks that the control plane tools, health and list_events report the
// adopted control plane as its status and coderd say.
func testMCPControlPlanes(t *testing.T, env *mcpEnv) {
	ctx, s, agent := context.Background(), env.s, env.agent
	var ccp coderv1alpha1.CoderControlPlane
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
		t.Fatal(err)
	}
	var l mcpserver.ControlPlaneList
	e2eMCPMust(t, agent.call(t, "list_control_planes", nil, &l))
	if len(l.Items) != 1 || l.Items[0].Name != "coder" || l.Items[0].Namespace != s.ns || !l.Items[0].AccessReady || !l.Items[0].Adopted || l.Items[0].URL != ccp.Status.URL {
		t.Errorf("list_control_planes: %+v; status.url %s", l.Items, ccp.Status.URL)
	}
	var d mcpserver.ControlPlaneDetail
	e2eMCPMust(t, agent.call(t, "get_control_plane", map[string]any{"namespace": s.ns, "name": "coder"}, &d))
	if !d.Adopted || d.ExternalURL != s.coder.URL.String() || !d.OperatorAccess.Ready || d.OperatorAccess.TokenSecretName == "" ||
		d.OperatorAccess.TokenSecretName != ccp.Status.OperatorTokenSecretRef.Name || d.CoderVersion == "" || !d.StatusCurrent ||
		!slices.ContainsFunc(d.Conditions, func(c mcpserver.StatusCondition) bool {
			return c.Type == coderv1alpha1.ConditionOperatorAccessReady && c.Status == "True"
		}) {
		t.Errorf("get_control_plane: %+v", d)
	}
	for _, tool := range []string{"list_control_plane_pods", "get_control_plane_rollout", "get_control_plane_service"} {
		var out struct {
			Adopted bool `json:"adopted"`
		}
		res := agent.call(t, tool, map[string]any{"namespace": s.ns, "name": "coder"}, &out)
		e2eMCPMust(t, res)
		if !out.Adopted || !strings.Contains(e2eMCPText(res), "adopts an existing coderd") {
			t.Errorf("%s of an adopted control plane: %s", tool, e2eMCPText(res))
		}
	}

	info, err := s.coder.Client.BuildInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var h mcpserver.HealthReport
	e2eMCPMust(t, agent.call(t, "health", map[string]any{"namespace": s.ns}, &h))
	if !h.Healthy || !h.Kubernetes.Reachable || h.Kubernetes.Version == "" || len(h.ControlPlanes) != 1 ||
		!h.ControlPlanes[0].Reachable || h.ControlPlanes[0].Version != info.Version || h.ControlPlanes[0].Name != "coder" {
		t.Errorf("health: %+v; coderd version %s", h, info.Version)
	}

	var ev mcpserver.EventList
	testenv.WaitFor(t, 30*time.Second, func() error {
		res := agent.call(t, "list_events", map[string]any{"namespace": s.ns, "kind": "CoderControlPlane", "name": "coder"}, &ev)
		if res.IsError {
			return fmt.Errorf("list_events: %s", e2eMCPText(res))
		}
		if len(ev.Items) == 0 {
			return errNotYet("no events about CoderControlPlane/coder")
		}
		return nil
	})
	for _, e := range ev.Items {
		if e.Object != "CoderControlPlane/coder" || e.Reason == "" || e.LastSeen == "" || (e.Type != "Normal" && e.Type != "Warning") {
			t.Errorf("list_events row: %+v", e)
		}
	}
	res := agent.call(t, "list_events", map[string]any{"namespace": s.ns, "type": "Bad"}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "use Normal, Warning") {
		t.Errorf("list_events type Bad: isError %v %q", res.IsError, text)
	}

	// get_pod_logs needs a kubelet, which this stack has not; its
	// errors still say what to do.
	res = agent.call(t, "get_pod_logs", map[string]any{"namespace": s.ns, "pod": "no-such-pod"}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "not found") || !strings.Contains(text, "check the namespace and the name") {
		t.Errorf("get_pod_logs of a missing pod: isError %v %q", res.IsError, text)
	}
	res = agent.call(t, "get_pod_logs", map[string]any{"namespace": s.ns, "pod": "p", "tailLines": -1}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "tailLines must be positive") {
		t.Errorf("get_pod_logs tailLines -1: isError %v %q", res.IsError, text)
	}
}

// testMCPBadInput checks that bad input is an isError result an agent can act on (never a
// protocol error), showing the tool's input schema where it helps.
func testMCPBadInput(t *testing.T, env *mcpEnv) {
	ctx, s, rec, agent, wsName := context.Background(), env.s, env.rec, env.agent, env.s.workspaceName
	const schemaMarker = "The arguments must match this JSON schema: "
	inputSchemas := map[string]any{}
	for _, tool := range e2eMCPListTools(t, agent) {
		inputSchemas[tool.Name] = tool.InputSchema
	}
	for _, c := range []struct {
		name string
		tool string
		args any
		want []string
	}{
		{"unknown tool", "no_such_tool", nil, []string{`unknown tool "no_such_tool"`, "list_workspaces", "set_workspace_running"}},
		{"ill-typed bool", "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": "yes"},
			[]string{"running", "The arguments must match this JSON schema", `"waitSeconds"`}},
		{"ill-typed filter", "list_workspaces", map[string]any{"running": "yes"}, []string{"running", "The arguments must match this JSON schema", `"template"`}},
		{"ill-typed limit", "list_templates", map[string]any{"limit": "ten"}, []string{"limit", "The arguments must match this JSON schema"}},
		{"bad template name", "list_template_versions", map[string]any{"template": "not a name"}, []string{`template "not a name" is not a Coder template name`}},
		{"missing required argument", "get_workspace", map[string]any{"namespace": s.ns}, []string{"name", "The arguments must match this JSON schema"}},
		{"missing required running", "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("ws-run")}, []string{"running", "The arguments must match this JSON schema"}},
		{"empty name", "get_workspace", map[string]any{"namespace": s.ns, "name": ""}, []string{"name is required"}},
		{"unknown namespace", "get_control_plane", map[string]any{"namespace": "no-such-ns", "name": "coder"},
			[]string{`namespace "no-such-ns" does not exist`, "list_control_planes"}},
		{"unknown namespace, health", "health", map[string]any{"namespace": "no-such-ns"}, []string{`namespace "no-such-ns" does not exist`}},
		{"unknown control plane", "get_control_plane", map[string]any{"namespace": s.ns, "name": "nope"},
			[]string{`no CoderControlPlane "nope"`, "list_control_planes"}},
		{"unknown control plane, pods", "list_control_plane_pods", map[string]any{"namespace": s.ns, "name": "nope"}, []string{`no CoderControlPlane "nope"`}},
		{"unknown control plane, rollout", "get_control_plane_rollout", map[string]any{"namespace": s.ns, "name": "nope"}, []string{`no CoderControlPlane "nope"`}},
		{"unknown control plane, service", "get_control_plane_service", map[string]any{"namespace": "no-such-ns", "name": "coder"}, []string{`namespace "no-such-ns" does not exist`}},
		{"missing pod", "get_pod_logs", map[string]any{"namespace": s.ns}, []string{"pod", "The arguments must match this JSON schema"}},
		{"unknown workspace", "get_workspace", map[string]any{"namespace": s.ns, "name": wsName("nope")},
			[]string{"not found", "check the namespace and the name"}},
		{"unknown workspace to start", "set_workspace_running", map[string]any{"namespace": s.ns, "name": wsName("nope"), "running": true},
			[]string{"not found", "check the namespace and the name"}},
		{"unknown template", "get_template", map[string]any{"namespace": s.ns, "name": "coder.nope"},
			[]string{"not found", "check the namespace and the name"}},
		{"malformed workspace name", "get_workspace", map[string]any{"namespace": s.ns, "name": "just-a-name"},
			[]string{"<organization>.<owner>.<workspace>"}},
		{"unknown namespace, workspace", "get_workspace", map[string]any{"namespace": "no-such-ns", "name": wsName("ws-run")},
			[]string{"no-such-ns"}},
		{"arguments not an object", "list_workspaces", []any{1}, []string{"cannot unmarshal", "The arguments must match this JSON schema"}},
		{"misspelt argument", "get_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "nmae": "x"},
			[]string{`unexpected additional properties ["nmae"]`, "The arguments must match this JSON schema"}},
		{"missing namespace for events", "list_events", map[string]any{}, []string{"namespace", "The arguments must match this JSON schema"}},
	} {
		res, err := agent.session.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err != nil {
			t.Errorf("%s: a protocol error instead of an isError result: %v", c.name, err)
			continue
		}
		rec.record(res)
		text := e2eMCPText(res)
		t.Logf("%s: %.300s", c.name, text)
		if !res.IsError {
			t.Errorf("%s: %s succeeded: %.300s", c.name, c.tool, text)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(text, w) {
				t.Errorf("%s: %s: %.600q lacks %q", c.name, c.tool, text, w)
			}
		}
		// The schema shown is the tool's input schema, as tools/list has it.
		if _, schema, ok := strings.Cut(text, schemaMarker); ok {
			var got any
			if err := json.Unmarshal([]byte(schema), &got); err != nil {
				t.Errorf("%s: the schema in the error is not JSON: %v\n%s", c.name, err, schema)
			} else if want := inputSchemas[c.tool]; !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the schema in the error\n%s\ndiffers from tools/list's\n%v", c.name, schema, want)
			}
		}
	}
	// The session survived every error, and the server is alive.
	var l mcpserver.TemplateList
	e2eMCPMust(t, agent.call(t, "list_templates", map[string]any{"namespace": s.ns}, &l))
	if len(l.Items) != 3 {
		t.Errorf("list_templates after the errors: %d rows", len(l.Items))
	}
	if exited, err := s.op.Exited(); exited {
		t.Fatalf("the operator exited: %v", err)
	}
}

// testMCPUnknownNamespace checks that a namespace that does not exist is an error in every tool,
// not an empty page.
func testMCPUnknownNamespace(t *testing.T, env *mcpEnv) {
	agent := env.agent
	// list_control_planes and health say so; the other list tools
	// must not answer with an empty page that looks like a valid one.
	for _, tool := range []string{"list_control_planes", "health", "list_workspaces", "list_templates", "list_events", "list_users", "whoami"} {
		res := agent.call(t, tool, map[string]any{"namespace": "no-such-ns"}, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, `namespace "no-such-ns" does not exist`) {
			t.Errorf("%s in namespace no-such-ns: isError %v %.300q, want an error saying the namespace does not exist", tool, res.IsError, text)
		}
	}
}

// testMCPUsers checks whoami and list_users as the agent, mapped to the
// stack coderd's first user (an owner), against coderd, and as a
// ServiceAccount no mapping names: whoami is an isError result saying why,
// list_users an empty page.
func testMCPUsers(t *testing.T, env *mcpEnv) {
	ctx, s, agent := context.Background(), env.s, env.agent
	first, err := s.coder.Client.User(ctx, codersdk.Me)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{Email: "mcp-robot@example.com", Username: "mcp-robot",
		Name: "MCP Robot", UserLoginType: codersdk.LoginTypeNone, OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
		t.Fatal(err)
	}

	var me mcpserver.WhoAmI
	e2eMCPMust(t, agent.call(t, "whoami", nil, &me))
	if me.KubernetesUser != "system:serviceaccount:agents:agent" || len(me.Coder) != 1 {
		t.Fatalf("whoami: %+v; want the agent's ServiceAccount and one control plane", me)
	}
	id := me.Coder[0]
	if id.Namespace != s.ns || id.Username != first.Username || id.Email != first.Email || id.Status != string(first.Status) ||
		!slices.Contains(id.Roles, "owner") || len(id.Organizations) != 1 || id.Error != "" {
		t.Errorf("whoami's Coder user %+v; want %s (%s, %s, owner) in namespace %s", id, first.Username, first.Email, first.Status, s.ns)
	}
	var inNS mcpserver.WhoAmI
	e2eMCPMust(t, agent.call(t, "whoami", map[string]any{"namespace": s.ns}, &inNS))
	if len(inNS.Coder) != 1 || inNS.Coder[0].Username != first.Username {
		t.Errorf("whoami in namespace %s: %+v", s.ns, inNS)
	}

	// The user just made in Coder shows within the watch cache's age.
	var all mcpserver.UserList
	testenv.WaitFor(t, 30*time.Second, func() error {
		e2eMCPMust(t, agent.call(t, "list_users", map[string]any{"namespace": s.ns}, &all))
		if !slices.ContainsFunc(all.Items, func(r mcpserver.UserRow) bool { return r.Name == "mcp-robot" }) {
			return errNotYet("list_users does not show mcp-robot yet")
		}
		return nil
	})
	coderUsers, err := s.coder.Client.Users(ctx, codersdk.UsersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != len(coderUsers.Users) {
		t.Errorf("list_users: %d rows, coderd has %d users", len(all.Items), len(coderUsers.Users))
	}
	for _, r := range all.Items {
		i := slices.IndexFunc(coderUsers.Users, func(u codersdk.User) bool { return u.Username == r.Name })
		if i < 0 {
			t.Errorf("list_users row %+v: no such user in coderd", r)
			continue
		}
		u := coderUsers.Users[i]
		if r.Email != u.Email || r.Status != string(u.Status) || r.FullName != u.Name {
			t.Errorf("list_users row %+v; coderd: %s %s %q", r, u.Email, u.Status, u.Name)
		}
	}
	for _, c := range []struct {
		args map[string]any
		want []string
	}{
		{map[string]any{"search": "MCP-ROB"}, []string{"mcp-robot"}},
		{map[string]any{"search": "robot@example"}, []string{"mcp-robot"}},
		{map[string]any{"role": "owner", "search": first.Username}, []string{first.Username}},
		{map[string]any{"role": "auditor", "search": "mcp-robot"}, nil},
		{map[string]any{"status": "suspended"}, nil},
	} {
		c.args["namespace"] = s.ns
		var l mcpserver.UserList
		e2eMCPMust(t, agent.call(t, "list_users", c.args, &l))
		var names []string
		for _, r := range l.Items {
			names = append(names, r.Name)
		}
		if !slices.Equal(names, c.want) {
			t.Errorf("list_users %v: %v, want %v", c.args, names, c.want)
		}
	}
	var page mcpserver.UserList
	e2eMCPMust(t, agent.call(t, "list_users", map[string]any{"namespace": s.ns, "limit": 1}, &page))
	if len(page.Items) != 1 || page.Continue == "" {
		t.Errorf("list_users limit 1: %d rows, continue %q", len(page.Items), page.Continue)
	}
	if res := agent.call(t, "list_users", map[string]any{"namespace": s.ns, "status": "gone"}, nil); !res.IsError || !strings.Contains(e2eMCPText(res), "active, dormant, suspended") {
		t.Errorf("list_users with an unknown status: isError %v %q", res.IsError, e2eMCPText(res))
	}

	// A ServiceAccount no mapping names: RBAC lets it read coderusers,
	// but it has no Coder user.
	token := e2eMCPServiceAccountToken(t, s, "stranger")
	e2eMCPGrant(t, s, "stranger", "", []rbacv1.PolicyRule{
		{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderusers"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{coderv1alpha1.GroupVersion.Group}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
		{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get"}},
	}...)
	stranger := env.rec.connect(t, s.op.MCP, token)
	res := stranger.call(t, "whoami", nil, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, `"system:serviceaccount:agents:stranger" maps to no Coder user`) ||
		!strings.Contains(text, "only through an explicit mapping") {
		t.Errorf("whoami as an unmapped ServiceAccount: isError %v %q; want an error saying it maps to no Coder user and why", res.IsError, text)
	}
	res = stranger.call(t, "whoami", map[string]any{"namespace": s.ns}, nil)
	if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, "only through an explicit mapping") {
		t.Errorf("whoami in %s as an unmapped ServiceAccount: isError %v %q", s.ns, res.IsError, text)
	}
	var none mcpserver.UserList
	e2eMCPMust(t, stranger.call(t, "list_users", map[string]any{"namespace": s.ns}, &none))
	if len(none.Items) != 0 {
		t.Errorf("list_users as an unmapped ServiceAccount: %d rows, want none", len(none.Items))
	}
	// The nobody ServiceAccount may read no coderusers: kube-apiserver's
	// refusal, not a Coder one.
	nobody := env.rec.connect(t, s.op.MCP, env.nobodyToken)
	if res := nobody.call(t, "list_users", map[string]any{"namespace": s.ns}, nil); !res.IsError || !strings.Contains(e2eMCPText(res), `cannot list resource "coderusers"`) {
		t.Errorf("list_users without RBAC: isError %v %q", res.IsError, e2eMCPText(res))
	}
}

// testMCPOutputCaps checks that list_events caps rows per page and message length, and a
// request over mcp.maxRequestBytes is refused without harming the server.
func testMCPOutputCaps(t *testing.T, env *mcpEnv) {
	ctx, s, rec, agent, agentToken := context.Background(), env.s, env.rec, env.agent, env.agentToken
	// 105 events about one object, with messages far over the row cap,
	// in multi-byte characters.
	long := strings.Repeat("é", 600)
	now := time.Now()
	for i := range 105 {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("noise-%03d", i), Namespace: s.ns},
			InvolvedObject: corev1.ObjectReference{Kind: "ConfigMap", Name: "noise", Namespace: s.ns, APIVersion: "v1"},
			Reason:         "Noise", Message: fmt.Sprintf("%03d %s", i, long), Type: corev1.EventTypeWarning, Count: 1,
			FirstTimestamp: metav1.NewTime(now.Add(time.Duration(i-200) * time.Second)),
			LastTimestamp:  metav1.NewTime(now.Add(time.Duration(i-200) * time.Second)),
			Source:         corev1.EventSource{Component: "mcp-e2e"},
		}
		if err := s.c.Create(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	args := map[string]any{"namespace": s.ns, "kind": "ConfigMap", "name": "noise"}
	var page mcpserver.EventList
	e2eMCPMust(t, agent.call(t, "list_events", args, &page))
	if len(page.Items) != 20 || page.Continue == "" {
		t.Errorf("list_events without limit: %d rows, continue %q; want the default 20 and a continue token", len(page.Items), page.Continue)
	}
	args["limit"] = 1000
	res := agent.call(t, "list_events", args, &page)
	e2eMCPMust(t, res)
	if len(page.Items) != 100 || page.Continue == "" {
		t.Errorf("list_events limit 1000: %d rows, continue %q; want at most 100 and a continue token", len(page.Items), page.Continue)
	}
	for i, e := range page.Items {
		if len(e.Message) > 300 || !utf8.ValidString(e.Message) || !strings.HasSuffix(e.Message, "…") {
			t.Errorf("row %d: message of %d bytes (cap 300), valid UTF-8 %v: %.40q…", i, len(e.Message), utf8.ValidString(e.Message), e.Message)
		}
	}
	if want := "104 "; len(page.Items) > 0 && !strings.HasPrefix(page.Items[0].Message, want) {
		t.Errorf("list_events is not newest first: the first row is %.10q", page.Items[0].Message)
	}
	if n := len(e2eMCPText(res)); n > 100*600 {
		t.Errorf("100 event rows take %d bytes of text", n)
	}
	args["continue"] = page.Continue
	e2eMCPMust(t, agent.call(t, "list_events", args, &page))
	if len(page.Items) != 5 || page.Continue != "" {
		t.Errorf("the last page: %d rows, continue %q; want 5 and no token", len(page.Items), page.Continue)
	}

	// A request over mcp.maxRequestBytes (1 MiB) is refused before any
	// tool runs, and the server serves the next session.
	big := rec.connect(t, s.op.MCP, agentToken)
	_, err := big.session.CallTool(ctx, &mcp.CallToolParams{Name: "list_workspaces", Arguments: map[string]any{"owner": strings.Repeat("x", 2<<20)}})
	if err == nil || !strings.Contains(err.Error(), "Too Large") {
		t.Errorf("a 2 MiB request: %v, want 413 Request Entity Too Large", err)
	}
	next := rec.connect(t, s.op.MCP, agentToken)
	var l mcpserver.TemplateList
	e2eMCPMust(t, next.call(t, "list_templates", map[string]any{"namespace": s.ns}, &l))
}

// testMCPReadOnly checks that the read-only server offers no tool that changes anything.
func testMCPReadOnly(t *testing.T, env *mcpEnv) {
	s, roAgent, wsName := env.s, env.roAgent, env.s.workspaceName
	before := s.coderWorkspace(t, "ws-run")
	for _, tool := range []string{"set_workspace_running", "delete_workspace"} {
		res := roAgent.call(t, tool, map[string]any{"namespace": s.ns, "name": wsName("ws-run"), "running": false}, nil)
		if text := e2eMCPText(res); !res.IsError || !strings.Contains(text, fmt.Sprintf("unknown tool %q", tool)) {
			t.Errorf("%s on the read-only server: isError %v %q", tool, res.IsError, text)
		}
	}
	if after := s.coderWorkspace(t, "ws-run"); after.LatestBuild.ID != before.LatestBuild.ID {
		t.Errorf("the read-only server changed ws-run: build %d", after.LatestBuild.BuildNumber)
	}
	var d mcpserver.WorkspaceDetail
	e2eMCPMust(t, roAgent.call(t, "get_workspace", map[string]any{"namespace": s.ns, "name": wsName("ws-run")}, &d))
	if d.ID != before.ID.String() {
		t.Errorf("get_workspace on the read-only server: %+v", d)
	}
}

// testMCPNoCredentials checks that no tool result of the whole test carried a credential (the
// operator's Coder token, the owner token it was made from, an agent's
// bearer token) and no MCP server logged a panic; it runs last.
func testMCPNoCredentials(t *testing.T, env *mcpEnv) {
	ctx, s, full, readOnly, rec, agentToken, nobodyToken, readerToken := context.Background(), env.s, env.full, env.readOnly, env.rec, env.agentToken, env.nobodyToken, env.readerToken
	var ccp coderv1alpha1.CoderControlPlane
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: "coder"}, &ccp); err != nil {
		t.Fatal(err)
	}
	ref := ccp.Status.OperatorTokenSecretRef
	if ref == nil {
		t.Fatal("the control plane has no status.operatorTokenSecretRef")
	}
	var secret corev1.Secret
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: ref.Name}, &secret); err != nil {
		t.Fatal(err)
	}
	operatorToken := string(secret.Data[ref.Key])
	if len(operatorToken) < 16 {
		t.Fatalf("operator token Secret %s key %s holds %d bytes", ref.Name, ref.Key, len(operatorToken))
	}
	secrets := map[string]string{"the operator token": operatorToken, "the owner token": s.coder.SessionToken,
		"an agent's bearer token": agentToken, "the nobody agent's bearer token": nobodyToken, "the reader agent's bearer token": readerToken}
	// The token's secret half alone must not show either.
	if _, after, ok := strings.Cut(operatorToken, "-"); ok && len(after) >= 16 {
		secrets["the operator token's secret"] = after
	}
	if len(rec.outputs) < 50 {
		t.Errorf("only %d tool results recorded", len(rec.outputs))
	}
	for _, out := range rec.outputs {
		for what, v := range secrets {
			if strings.Contains(out, v) {
				t.Errorf("a tool result contains %s: %.300s", what, out)
			}
		}
	}
	for _, op := range []*Operator{s.op, full, readOnly} {
		if log := testenv.LogTail(op.LogPath, 100000); strings.Contains(log, "panic") {
			t.Errorf("an MCP server logged a panic:\n%s", op.LogTail(60))
		}
	}
}

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
