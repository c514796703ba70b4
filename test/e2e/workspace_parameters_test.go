package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestWorkspaceParameters creates and updates workspaces of a template
// with Coder's parameters (testenv.ParameterTemplate) with kubectl, as a
// Coder member mapped by email, and checks what coderd stored and what
// kubectl reads back: coderd validates the values and its messages reach
// kubectl under spec.parameters[name].
func TestWorkspaceParameters(t *testing.T) {
	t.Parallel()
	env := newParamsEnv(t)
	runSubtests(t, env, []subtest[*paramsEnv]{
		{"a create stores the parameters in coderd and reads show them", testParamsCreate},
		{"coderd's validation messages name spec.parameters[name]", testParamsInvalid},
		{"an immutable parameter cannot change; a mutable change builds with it", testParamsUpdate},
		{"ephemeral and unknown parameters are refused", testParamsEphemeral},
		{"a preset applies its values and reads back; an unknown preset lists the presets", testParamsPreset},
		{"automaticUpdates is set and read back", testParamsAutoUpdates},
		{"a dry run stores and builds nothing", testParamsDryRun},
		{"kubectl get ctv shows the version's parameters and presets as coderd has them", testParamsVersionStatus},
	})
}

type paramsEnv struct {
	s     *aggStack
	ctx   context.Context
	alice testenv.Kubectl
	tpl   codersdk.Template
}

func newParamsEnv(t *testing.T) *paramsEnv {
	s, ctx, tpl := newParamsStack(t)
	alice := s.kubectlAs(t, "alice@example.com", "devs", "workspace-user",
		rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"*"}})
	return &paramsEnv{s: s, ctx: ctx, alice: alice, tpl: tpl}
}

// newParamsStack is the stack with template params
// (testenv.ParameterTemplate) and Coder member alice, and a context
// bounding the test.
func newParamsStack(t *testing.T) (*aggStack, context.Context, codersdk.Template) {
	s := newStack(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	t.Cleanup(cancel)
	tpl, err := s.coder.PushTemplate(ctx, "params", testenv.ParameterTemplate())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: "alice@example.com", Username: "alice", Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
		UserLoginType: codersdk.LoginTypePassword,
	}); err != nil {
		t.Fatal(err)
	}
	return s, ctx, tpl
}

// kubectl runs kubectl as alice with manifest on stdin and returns its
// combined output and error.
func (env *paramsEnv) kubectl(stdin string, args ...string) (string, error) {
	r, err := env.alice.Run(env.ctx, stdin, append(args, "-n", env.s.ns)...)
	return r.Combined, err
}

// workspaceManifest is alice's workspace name from template params with
// the given spec lines.
func (env *paramsEnv) workspaceManifest(name, spec string) string {
	return fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderWorkspace\nmetadata: {name: %s.alice.%s}\nspec:\n  templateName: params\n  running: true\n%s", env.s.org, name, indent(spec, 2))
}

// settled waits for the latest build of alice's workspace name to end
// and returns the workspace and the build's parameters as coderd has them.
func (env *paramsEnv) settled(t *testing.T, name string) (codersdk.Workspace, map[string]string) {
	t.Helper()
	return settledBuild(t, env.ctx, env.s, "alice", name)
}

// settledBuild waits for the latest build of owner's workspace name to
// succeed and returns the workspace and the build's parameters as coderd
// has them.
func settledBuild(t *testing.T, ctx context.Context, s *aggStack, owner, name string) (codersdk.Workspace, map[string]string) {
	t.Helper()
	c := s.coder.Client
	w, err := c.WorkspaceByOwnerAndName(ctx, owner, name, codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.coder.WaitBuild(ctx, w.LatestBuild.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Fatalf("build %d of %s/%s: %s %s", b.BuildNumber, owner, name, b.Job.Status, b.Job.Error)
	}
	w.LatestBuild = b
	got, err := c.WorkspaceBuildParameters(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	params := map[string]string{}
	for _, p := range got {
		params[p.Name] = p.Value
	}
	return w, params
}

// read is alice's workspace name as kubectl shows it.
func (env *paramsEnv) read(t *testing.T, name string) *aggv1.CoderWorkspace {
	t.Helper()
	out, err := env.alice.Run(env.ctx, "", "get", "cws", env.s.org+".alice."+name, "-n", env.s.ns, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var ws aggv1.CoderWorkspace
	if err := json.Unmarshal([]byte(out.Stdout), &ws); err != nil {
		t.Fatal(err)
	}
	return &ws
}

func paramMap(ps []aggv1.WorkspaceParameter) map[string]string {
	m := map[string]string{}
	for _, p := range ps {
		m[p.Name] = p.Value
	}
	return m
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// wantRefused checks that kubectl failed with a 422 naming path with
// coderd's message.
func wantRefused(t *testing.T, out string, err error, path, message string) {
	t.Helper()
	if err == nil {
		t.Fatalf("kubectl succeeded, want a 422 naming %s:\n%s", path, out)
	}
	if !strings.Contains(out, "is invalid") || !strings.Contains(out, path+": ") || !strings.Contains(out, message) {
		t.Errorf("kubectl said:\n%s\nwant an Invalid error naming %s with %q", out, path, message)
	}
}

func testParamsCreate(t *testing.T, env *paramsEnv) {
	if out, err := env.kubectl(env.workspaceManifest("w1", `parameters:
- {name: cpu, value: "4"}
- {name: memory, value: "8"}
- {name: home_disk_size, value: "20"}
- {name: greeting, value: hi there}`), "create", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	w, params := env.settled(t, "w1")
	want := map[string]string{"cpu": "4", "memory": "8", "home_disk_size": "20", "greeting": "hi there", "debug": "false"}
	if !sameMap(params, want) {
		t.Errorf("coderd's build parameters: %v, want %v", params, want)
	}
	if w.LatestBuild.InitiatorUsername != "alice" {
		t.Errorf("built by %q, want alice", w.LatestBuild.InitiatorUsername)
	}
	ws := env.read(t, "w1")
	delete(want, "debug") // ephemeral: a read does not show it
	if got := paramMap(ws.Spec.Parameters); !sameMap(got, want) {
		t.Errorf("kubectl reads spec.parameters %v, want %v", got, want)
	}
	if ws.Spec.AutomaticUpdates != "never" || ws.Spec.Preset != "" {
		t.Errorf("spec.automaticUpdates %q, spec.preset %q; want never and none", ws.Spec.AutomaticUpdates, ws.Spec.Preset)
	}
}

func testParamsInvalid(t *testing.T, env *paramsEnv) {
	for _, c := range []struct{ param, value, message string }{
		{"cpu", "3", `Invalid value: Value must be a valid option; the value "3" must be defined as one of options`},
		{"memory", "20", `Invalid value: Invalid parameter value according to 'validation' block; value 20 is more than the maximum 16`},
		{"greeting", "Hello!", `Invalid value: Invalid parameter value according to 'validation' block; Use lower-case letters and spaces only. (value "Hello!" does not match "^[a-z ]+$")`},
	} {
		out, err := env.kubectl(env.workspaceManifest("bad", fmt.Sprintf("parameters:\n- {name: %s, value: %q}", c.param, c.value)), "create", "-f", "-")
		wantRefused(t, out, err, "spec.parameters["+c.param+"]", c.message)
	}
	if _, err := env.s.coder.Client.WorkspaceByOwnerAndName(env.ctx, "alice", "bad", codersdk.WorkspaceOptions{}); err == nil {
		t.Error("coderd has workspace alice/bad after refused creates")
	}
}

func testParamsUpdate(t *testing.T, env *paramsEnv) {
	name := env.s.org + ".alice.w1"
	before, _ := env.settled(t, "w1")
	out, err := env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"parameters":[{"name":"home_disk_size","value":"30"}]}}`)
	wantRefused(t, out, err, "spec.parameters[home_disk_size]", `Parameter "home_disk_size" is not mutable, so it can't be updated after creating a workspace.`)
	if w, _ := env.settled(t, "w1"); w.LatestBuild.BuildNumber != before.LatestBuild.BuildNumber {
		t.Errorf("a refused change built: build %d, was %d", w.LatestBuild.BuildNumber, before.LatestBuild.BuildNumber)
	}
	if out, err := env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"parameters":[{"name":"cpu","value":"8"}]}}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	w, params := env.settled(t, "w1")
	want := map[string]string{"cpu": "8", "memory": "8", "home_disk_size": "20", "greeting": "hi there", "debug": "false"}
	if w.LatestBuild.BuildNumber != before.LatestBuild.BuildNumber+1 || !sameMap(params, want) {
		t.Errorf("after the cpu change: build %d with %v, want build %d with %v", w.LatestBuild.BuildNumber, params, before.LatestBuild.BuildNumber+1, want)
	}
	delete(want, "debug")
	if got := paramMap(env.read(t, "w1").Spec.Parameters); !sameMap(got, want) {
		t.Errorf("kubectl reads %v, want %v", got, want)
	}
}

func testParamsEphemeral(t *testing.T, env *paramsEnv) {
	name := env.s.org + ".alice.w1"
	out, err := env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"parameters":[{"name":"debug","value":"true"}]}}`)
	wantRefused(t, out, err, "spec.parameters[debug]", `parameter "debug" is ephemeral: it applies to one build only`)
	out, err = env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"parameters":[{"name":"region","value":"eu"}]}}`)
	wantRefused(t, out, err, "spec.parameters[region]", `Not found: template version `+env.tpl.ActiveVersionID.String()+` has no parameter "region" (it has: cpu, debug, greeting, home_disk_size, memory)`)
	// What a read shows applies back unchanged: no build.
	before, _ := env.settled(t, "w1")
	ws := env.read(t, "w1")
	ws.ResourceVersion = ""
	raw, _ := json.Marshal(ws)
	if out, err := env.kubectl(string(raw), "apply", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if w, _ := env.settled(t, "w1"); w.LatestBuild.BuildNumber != before.LatestBuild.BuildNumber {
		t.Errorf("applying what kubectl read built: build %d, was %d", w.LatestBuild.BuildNumber, before.LatestBuild.BuildNumber)
	}
}

func testParamsPreset(t *testing.T, env *paramsEnv) {
	presets, err := env.s.coder.Client.TemplateVersionPresets(env.ctx, env.tpl.ActiveVersionID)
	if err != nil {
		t.Fatal(err)
	}
	var large uuid.UUID
	for _, p := range presets {
		if p.Name == "large" {
			large = p.ID
		}
	}
	if out, err := env.kubectl(env.workspaceManifest("w2", "preset: large"), "create", "-f", "-"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	w, params := env.settled(t, "w2")
	if w.LatestBuild.TemplateVersionPresetID == nil || *w.LatestBuild.TemplateVersionPresetID != large || params["cpu"] != "8" || params["memory"] != "16" {
		t.Errorf("coderd's build: preset %v with %v, want preset large (%s) with cpu 8, memory 16", w.LatestBuild.TemplateVersionPresetID, params, large)
	}
	ws := env.read(t, "w2")
	if ws.Spec.Preset != "large" || paramMap(ws.Spec.Parameters)["cpu"] != "8" {
		t.Errorf("kubectl reads preset %q, parameters %v; want large with cpu 8", ws.Spec.Preset, ws.Spec.Parameters)
	}
	out, err := env.kubectl(env.workspaceManifest("w3", "preset: huge"), "create", "-f", "-")
	wantRefused(t, out, err, "spec.preset", `Unsupported value: "huge": supported values: "large", "small"`)
	out, err = env.kubectl(env.workspaceManifest("w3", "preset: large\nparameters:\n- {name: cpu, value: \"2\"}"), "create", "-f", "-")
	wantRefused(t, out, err, "spec.parameters[cpu]", `preset "large" sets cpu to "8"`)
	if _, err := env.s.coder.Client.WorkspaceByOwnerAndName(env.ctx, "alice", "w3", codersdk.WorkspaceOptions{}); err == nil {
		t.Error("coderd has workspace alice/w3 after refused creates")
	}
}

func testParamsAutoUpdates(t *testing.T, env *paramsEnv) {
	name := env.s.org + ".alice.w1"
	if out, err := env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"automaticUpdates":"always"}}`); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	w, _ := env.settled(t, "w1")
	if w.AutomaticUpdates != codersdk.AutomaticUpdatesAlways {
		t.Errorf("coderd's automatic_updates: %q, want always", w.AutomaticUpdates)
	}
	if got := env.read(t, "w1").Spec.AutomaticUpdates; got != "always" {
		t.Errorf("kubectl reads spec.automaticUpdates %q, want always", got)
	}
	out, err := env.kubectl("", "patch", "cws", name, "--type=merge", "-p", `{"spec":{"automaticUpdates":"sometimes"}}`)
	wantRefused(t, out, err, "spec.automaticUpdates", `Unsupported value: "sometimes": supported values: "always", "never"`)
}

func testParamsDryRun(t *testing.T, env *paramsEnv) {
	r, err := env.alice.Run(env.ctx, env.workspaceManifest("dry", "preset: small\nparameters:\n- {name: greeting, value: hi}"), "create", "--dry-run=server", "-o", "json", "-f", "-", "-n", env.s.ns)
	if err != nil {
		t.Fatal(err)
	}
	var ws aggv1.CoderWorkspace
	if err := json.Unmarshal([]byte(r.Stdout), &ws); err != nil {
		t.Fatal(err)
	}
	if ws.Spec.Preset != "small" || paramMap(ws.Spec.Parameters)["greeting"] != "hi" || ws.Spec.AutomaticUpdates != "never" || ws.Spec.TemplateVersionID != env.tpl.ActiveVersionID.String() {
		t.Errorf("dry run answered %+v", ws.Spec)
	}
	out, err := env.kubectl(env.workspaceManifest("dry", "preset: huge"), "create", "--dry-run=server", "-f", "-")
	wantRefused(t, out, err, "spec.preset", `supported values: "large", "small"`)
	if _, err := env.s.coder.Client.WorkspaceByOwnerAndName(env.ctx, "alice", "dry", codersdk.WorkspaceOptions{}); err == nil {
		t.Error("coderd has workspace alice/dry after a dry run")
	}
}

func testParamsVersionStatus(t *testing.T, env *paramsEnv) {
	c := env.s.coder.Client
	v, err := c.TemplateVersion(env.ctx, env.tpl.ActiveVersionID)
	if err != nil {
		t.Fatal(err)
	}
	params, err := c.TemplateVersionRichParameters(env.ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	presets, err := c.TemplateVersionPresets(env.ctx, v.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ctv aggv1.CoderTemplateVersion
	if err := json.Unmarshal([]byte(env.s.must(t, "get", "ctv", env.s.org+".params."+v.Name, "-n", env.s.ns, "-o", "json")), &ctv); err != nil {
		t.Fatal(err)
	}
	if len(ctv.Status.Parameters) != len(params) || len(ctv.Status.Presets) != len(presets) {
		t.Fatalf("status shows %d parameters and %d presets, coderd %d and %d", len(ctv.Status.Parameters), len(ctv.Status.Presets), len(params), len(presets))
	}
	for i, p := range params {
		got := ctv.Status.Parameters[i]
		if got.Name != p.Name || got.Type != p.Type || got.Mutable != p.Mutable || got.Ephemeral != p.Ephemeral || got.Default != p.DefaultValue || len(got.Options) != len(p.Options) {
			t.Errorf("status.parameters[%d] %+v, coderd %+v", i, got, p)
		}
	}
	for i, p := range presets {
		if got := ctv.Status.Presets[i]; got.Name != p.Name || len(got.Parameters) != len(p.Parameters) {
			t.Errorf("status.presets[%d] %+v, coderd %+v", i, got, p)
		}
	}
}
