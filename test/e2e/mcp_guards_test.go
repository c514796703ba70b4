package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/mcpserver"
	"github.com/coder/coder-k8s/internal/testenv"
)

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
