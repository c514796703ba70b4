package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestMCPWorkspaceLifecycle drives list_template_parameters,
// create_workspace and update_workspace over MCP against a template with
// Coder's parameters (testenv.ParameterTemplate), as a ServiceAccount
// mapped to Coder member alice and as one mapped to the owner, and checks
// each change in coderd and each refusal's coderd message.
func TestMCPWorkspaceLifecycle(t *testing.T) {
	t.Parallel()
	env := newMCPLifecycleEnv(t)
	runSubtests(t, env, []subtest[*mcpLifecycleEnv]{
		{"list_template_parameters shows options, validation, mutability, ephemeral, defaults and presets", testMCPListTemplateParameters},
		{"create_workspace builds with the values as the mapped member; coderd's refusals are isError results", testMCPCreateWorkspace},
		{"update_workspace changes parameters and the version; immutable and unknown values refused", testMCPUpdateWorkspace},
		{"a ServiceAccount mapped to the owner creates and updates with a preset", testMCPLifecycleServiceAccount},
	})
}

type mcpLifecycleEnv struct {
	s   *aggStack
	ctx context.Context
	// alice is a ServiceAccount mapped to Coder member alice, owner one
	// mapped to the stack's first user (an owner).
	alice, owner *e2eMCPAgent
	tpl          codersdk.Template
}

func newMCPLifecycleEnv(t *testing.T) *mcpLifecycleEnv {
	s, ctx, tpl := newParamsStack(t)
	aliceToken := e2eMCPServiceAccountToken(t, s, "alice-agent")
	ownerToken := e2eMCPServiceAccountToken(t, s, "agent")
	for _, sa := range []string{"alice-agent", "agent"} {
		e2eMCPGrant(t, s, sa, s.ns, rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName},
			Resources: []string{"coderworkspaces", "codertemplates", "codertemplateversions"}, Verbs: []string{"get", "list", "create", "patch"}})
	}
	mapServiceAccount(t, ctx, s, "system:serviceaccount:"+e2eMCPAgentNamespace+":alice-agent", "alice")
	s.op.WaitOK(t, s.op.MCP+"/readyz")
	rec := &e2eMCPRecorder{}
	return &mcpLifecycleEnv{s: s, ctx: ctx, alice: rec.connect(t, s.op.MCP, aliceToken), owner: rec.connect(t, s.op.MCP, ownerToken), tpl: tpl}
}

// mapServiceAccount adds a mapping of Kubernetes user to Coder user to the
// stack's control plane and waits until the controller reports it.
func mapServiceAccount(t *testing.T, ctx context.Context, s *aggStack, user, coderUser string) {
	t.Helper()
	ccp := &coderv1alpha1.CoderControlPlane{ObjectMeta: metav1.ObjectMeta{Name: "coder", Namespace: s.ns}}
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/identity/mappings/-","value":{"kubernetesUser":%q,"coderUser":%q}}]`, user, coderUser)
	if err := s.c.Patch(ctx, ccp, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
	waitIdentityMapped(t, ctx, s, ccp)
}

// wantToolError checks that a tool call was an isError result whose text
// holds every part.
func wantToolError(t *testing.T, res *mcp.CallToolResult, parts ...string) {
	t.Helper()
	if !res.IsError {
		t.Fatalf("tool succeeded, want an error with %q: %s", parts, e2eMCPText(res))
	}
	for _, p := range parts {
		if !strings.Contains(e2eMCPText(res), p) {
			t.Errorf("tool error %q lacks %q", e2eMCPText(res), p)
		}
	}
}

func testMCPListTemplateParameters(t *testing.T, env *mcpLifecycleEnv) {
	var out mcpserver.TemplateParameters
	var res *mcp.CallToolResult
	// The template version's parameters are read once the poller has seen
	// the template.
	testenv.WaitFor(t, 30*time.Second, func() error {
		out = mcpserver.TemplateParameters{}
		if res = env.alice.call(t, "list_template_parameters", map[string]any{"namespace": env.s.ns, "template": env.s.org + ".params"}, &out); res.IsError {
			return fmt.Errorf("list_template_parameters: %s", e2eMCPText(res))
		}
		return nil
	})
	if out.VersionID != env.tpl.ActiveVersionID.String() {
		t.Errorf("version %s, want the active version %s", out.VersionID, env.tpl.ActiveVersionID)
	}
	byName := map[string]aggv1.TemplateParameter{}
	for _, p := range out.Parameters {
		byName[p.Name] = p
	}
	cpu, memory, disk, greeting, debug := byName["cpu"], byName["memory"], byName["home_disk_size"], byName["greeting"], byName["debug"]
	var options []string
	for _, o := range cpu.Options {
		options = append(options, o.Name+"="+o.Value)
	}
	if len(out.Parameters) != 5 || !slices.Equal(options, []string{"2 Cores=2", "4 Cores=4", "8 Cores=8"}) || cpu.Default != "2" || !cpu.Mutable || cpu.Type != "number" {
		t.Errorf("parameters %+v; want five, cpu a mutable number defaulting to 2 with options 2, 4, 8", out.Parameters)
	}
	if v := memory.Validation; v == nil || v.Min == nil || *v.Min != 1 || v.Max == nil || *v.Max != 16 {
		t.Errorf("memory's validation %+v, want 1 to 16", memory.Validation)
	}
	if disk.Mutable || disk.Default != "10" {
		t.Errorf("home_disk_size %+v, want immutable with default 10", disk)
	}
	if v := greeting.Validation; v == nil || v.Regex != "^[a-z ]+$" || v.Error != "Use lower-case letters and spaces only." {
		t.Errorf("greeting's validation %+v", greeting.Validation)
	}
	if !debug.Ephemeral || debug.Type != "bool" {
		t.Errorf("debug %+v, want an ephemeral bool", debug)
	}
	presets := map[string]map[string]string{}
	for _, p := range out.Presets {
		presets[p.Name] = paramMap(p.Parameters)
	}
	if len(presets) != 2 || !sameMap(presets["small"], map[string]string{"cpu": "2", "memory": "2"}) || !sameMap(presets["large"], map[string]string{"cpu": "8", "memory": "16"}) {
		t.Errorf("presets %v", presets)
	}
	res = env.alice.call(t, "list_template_parameters", map[string]any{"namespace": env.s.ns, "template": env.s.org + ".nope"}, nil)
	wantToolError(t, res, "not found")
}

func testMCPCreateWorkspace(t *testing.T, env *mcpLifecycleEnv) {
	name := env.s.org + ".alice.m1"
	var d mcpserver.WorkspaceDetail
	res := env.alice.call(t, "create_workspace", map[string]any{"namespace": env.s.ns, "name": name, "template": "params",
		"parameters": map[string]string{"cpu": "4", "greeting": "hello world"}}, &d)
	e2eMCPMust(t, res)
	if d.Name != name || d.Owner != "alice" || d.Parameters["cpu"] != "4" {
		t.Errorf("create_workspace answered %+v", d)
	}
	w, params := settledBuild(t, env.ctx, env.s, "alice", "m1")
	want := map[string]string{"cpu": "4", "memory": "2", "home_disk_size": "10", "greeting": "hello world", "debug": "false"}
	if w.LatestBuild.InitiatorUsername != "alice" || !sameMap(params, want) {
		t.Errorf("coderd's build by %q with %v, want by alice with %v", w.LatestBuild.InitiatorUsername, params, want)
	}
	res = env.alice.call(t, "create_workspace", map[string]any{"namespace": env.s.ns, "name": env.s.org + ".alice.bad", "template": "params",
		"parameters": map[string]string{"cpu": "3"}}, nil)
	wantToolError(t, res, "spec.parameters[cpu]", `Value must be a valid option; the value "3" must be defined as one of options`)
	res = env.alice.call(t, "create_workspace", map[string]any{"namespace": env.s.ns, "name": env.s.org + ".alice.bad", "template": "params", "preset": "huge"}, nil)
	wantToolError(t, res, "spec.preset", `supported values: "large", "small"`)
	if _, err := env.s.coder.Client.WorkspaceByOwnerAndName(env.ctx, "alice", "bad", codersdk.WorkspaceOptions{}); err == nil {
		t.Error("coderd has workspace alice/bad after refused creates")
	}
}

func testMCPUpdateWorkspace(t *testing.T, env *mcpLifecycleEnv) {
	args := func(extra map[string]any) map[string]any {
		m := map[string]any{"namespace": env.s.ns, "name": env.s.org + ".alice.m1"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	before, _ := settledBuild(t, env.ctx, env.s, "alice", "m1")
	var r mcpserver.UpdateWorkspaceResult
	e2eMCPMust(t, env.alice.call(t, "update_workspace", args(map[string]any{"parameters": map[string]string{"memory": "12"}}), &r))
	w, params := settledBuild(t, env.ctx, env.s, "alice", "m1")
	if !r.Changed || w.LatestBuild.BuildNumber != before.LatestBuild.BuildNumber+1 || params["memory"] != "12" || params["cpu"] != "4" {
		t.Errorf("changed %v; coderd's build %d with %v, want build %d with memory 12 and cpu 4", r.Changed, w.LatestBuild.BuildNumber, params, before.LatestBuild.BuildNumber+1)
	}
	// The same values again: no build. Reads follow coderd's poll.
	testenv.WaitFor(t, 30*time.Second, func() error {
		r = mcpserver.UpdateWorkspaceResult{}
		e2eMCPMust(t, env.alice.call(t, "update_workspace", args(map[string]any{"parameters": map[string]string{"memory": "12"}}), &r))
		if r.Changed {
			return errNotYet("update_workspace changed memory again")
		}
		return nil
	})
	wantToolError(t, env.alice.call(t, "update_workspace", args(map[string]any{"parameters": map[string]string{"home_disk_size": "50"}}), nil),
		"spec.parameters[home_disk_size]", `Parameter "home_disk_size" is not mutable, so it can't be updated after creating a workspace.`)
	wantToolError(t, env.alice.call(t, "update_workspace", args(map[string]any{"parameters": map[string]string{"debug": "true"}}), nil),
		"spec.parameters[debug]", `parameter "debug" is ephemeral`)
	wantToolError(t, env.alice.call(t, "update_workspace", args(nil), nil), "nothing to update")

	// A new active version: toActiveVersion builds it.
	tpl, err := env.s.coder.PushTemplate(env.ctx, "params", testenv.ParameterTemplate())
	if err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		r = mcpserver.UpdateWorkspaceResult{}
		e2eMCPMust(t, env.alice.call(t, "update_workspace", args(map[string]any{"toActiveVersion": true}), &r))
		if !r.Changed {
			return errNotYet("update_workspace does not see the new active version yet")
		}
		return nil
	})
	w, params = settledBuild(t, env.ctx, env.s, "alice", "m1")
	if w.LatestBuild.TemplateVersionID != tpl.ActiveVersionID || params["memory"] != "12" {
		t.Errorf("coderd's build of version %s with %v, want version %s keeping memory 12", w.LatestBuild.TemplateVersionID, params, tpl.ActiveVersionID)
	}
}

func testMCPLifecycleServiceAccount(t *testing.T, env *mcpLifecycleEnv) {
	owner := env.s.coder.Username
	name := env.s.org + "." + owner + ".s1"
	e2eMCPMust(t, env.owner.call(t, "create_workspace", map[string]any{"namespace": env.s.ns, "name": name, "template": "params", "preset": "large"}, nil))
	w, params := settledBuild(t, env.ctx, env.s, owner, "s1")
	if w.LatestBuild.InitiatorUsername != owner || params["cpu"] != "8" || params["memory"] != "16" || w.LatestBuild.TemplateVersionPresetID == nil {
		t.Errorf("coderd's build by %q with %v (preset %v), want by %s with preset large's values", w.LatestBuild.InitiatorUsername, params, w.LatestBuild.TemplateVersionPresetID, owner)
	}
	wantToolError(t, env.owner.call(t, "update_workspace", map[string]any{"namespace": env.s.ns, "name": name, "parameters": map[string]string{"memory": "40"}}, nil),
		"spec.parameters[memory]", "value 40 is more than the maximum 16")
	var r mcpserver.UpdateWorkspaceResult
	e2eMCPMust(t, env.owner.call(t, "update_workspace", map[string]any{"namespace": env.s.ns, "name": name, "preset": "small"}, &r))
	w, params = settledBuild(t, env.ctx, env.s, owner, "s1")
	if !r.Changed || params["cpu"] != "2" || params["memory"] != "2" {
		t.Errorf("after preset small: changed %v, coderd's build with %v", r.Changed, params)
	}
}
