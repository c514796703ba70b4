package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/types"

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
	t.Parallel()
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
