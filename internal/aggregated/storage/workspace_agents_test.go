package storage

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// testdata/agents holds workspaces as a real coderd v2.30.0 returned them
// (GET /api/v2/users/me/workspace/{name}), built from a template with one
// coder_agent "main" (connection_timeout 20) and a coder_app "hello" with
// a health check, whose agent ran as `coder agent` on the machine:
//   - ready: the agent connected and its startup script succeeded;
//   - failing: the startup script exited 3 (lifecycle start_error);
//   - noagent: no agent ran, read just after the build (connecting);
//   - noagent-timeout: the same workspace past the 20 s timeout.

func readAgentsFixture(t *testing.T, name string) *codersdk.Workspace {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "agents", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var w codersdk.Workspace
	if err := json.Unmarshal(raw, &w); err != nil {
		t.Fatal(err)
	}
	return &w
}

func TestToWorkspaceAgentsFromCoderd(t *testing.T) {
	type want struct {
		status, lifecycle  string
		healthy            bool
		healthReason       string
		ready              metav1.ConditionStatus
		reason, message    string
		reconciling, stall bool
		agents             string
	}
	for _, tc := range []struct {
		fixture string
		want    want
	}{
		{"ready", want{status: "connected", lifecycle: "ready", healthy: true, ready: metav1.ConditionTrue,
			reason: aggv1.ReasonAgentsReady, message: "the workspace is running and its agent is connected and ready", agents: "1/1"}},
		{"failing", want{status: "connected", lifecycle: "start_error", healthReason: "agent startup script exited with an error",
			ready: metav1.ConditionFalse, reason: aggv1.ReasonAgentStartError,
			message: "agent main's startup script failed (lifecycle start_error); its log is in the agent's logs", stall: true, agents: "0/1"}},
		{"noagent", want{status: "connecting", lifecycle: "created", healthy: true, ready: metav1.ConditionFalse, reason: aggv1.ReasonAgentConnecting,
			message: "agent main has not connected since its creation at 2026-11-29T18:10:26Z (Coder waits 20s)", reconciling: true, agents: "0/1"}},
		{"noagent-timeout", want{status: "timeout", lifecycle: "created", healthReason: "agent is taking too long to connect",
			ready: metav1.ConditionFalse, reason: aggv1.ReasonAgentTimeout,
			message: "agent main has not connected within 20s of its creation at 2026-11-29T18:10:26Z", stall: true, agents: "0/1"}},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			w := readAgentsFixture(t, tc.fixture)
			got := toWorkspace(fxTarget(t, "prod", false), w, nil)
			if len(got.Status.Agents) != 1 {
				t.Fatalf("agents = %+v, want one", got.Status.Agents)
			}
			a := got.Status.Agents[0]
			wantAgent := aggv1.WorkspaceAgent{
				Name: "main", ID: w.LatestBuild.Resources[0].Agents[0].ID.String(), Status: tc.want.status, LifecycleState: tc.want.lifecycle,
				Healthy: tc.want.healthy, HealthReason: tc.want.healthReason,
				Apps: []aggv1.WorkspaceApp{{Slug: "hello", DisplayName: "Hello", Health: "initializing",
					URL: "https://coder.example.com/@admin/" + w.Name + ".main/apps/hello/"}},
			}
			if !reflect.DeepEqual(a, wantAgent) {
				t.Errorf("agent =\n%+v\nwant\n%+v", a, wantAgent)
			}
			ready := conditionOf(got.Status.Conditions, aggv1.ConditionReady)
			if ready.Status != tc.want.ready || ready.Reason != tc.want.reason || ready.Message != tc.want.message {
				t.Errorf("Ready = {%s %s %q}, want {%s %s %q}", ready.Status, ready.Reason, ready.Message, tc.want.ready, tc.want.reason, tc.want.message)
			}
			for typ, on := range map[string]bool{aggv1.ConditionReconciling: tc.want.reconciling, aggv1.ConditionStalled: tc.want.stall} {
				c := conditionOf(got.Status.Conditions, typ)
				wantStatus := metav1.ConditionFalse
				if on {
					wantStatus = metav1.ConditionTrue
				}
				if c.Status != wantStatus {
					t.Errorf("%s = %s, want %s", typ, c.Status, wantStatus)
				}
				if on && (c.Reason != ready.Reason || c.Message != ready.Message) {
					t.Errorf("%s = {%s %q}, want Ready's reason and message", typ, c.Reason, c.Message)
				}
			}
			if s := agentsSummary(got.Status.Agents); s != tc.want.agents {
				t.Errorf("agents column = %q, want %q", s, tc.want.agents)
			}
			if !reflect.DeepEqual(got, toWorkspace(fxTarget(t, "prod", false), readAgentsFixture(t, tc.fixture), nil)) {
				t.Error("two conversions of the same JSON differ")
			}
		})
	}
}

// A ready workspace's Ready condition changed when its last agent became
// ready, not when the build finished.
func TestToWorkspaceReadySinceAgentReady(t *testing.T) {
	w := readAgentsFixture(t, "ready")
	got := toWorkspace(fxTarget(t, "prod", false), w, nil)
	ready := conditionOf(got.Status.Conditions, aggv1.ConditionReady)
	want := w.LatestBuild.Resources[0].Agents[0].ReadyAt.Truncate(time.Second)
	if !ready.LastTransitionTime.Time.Equal(want) {
		t.Errorf("Ready lastTransitionTime = %v, want the agent's ready_at %v", ready.LastTransitionTime, want)
	}
}

// Several agents: the worst problem gives the reason, every problem is in
// the message; a disconnected agent and a starting one are told apart.
func TestAgentsConditionSeveralAgents(t *testing.T) {
	w := readAgentsFixture(t, "ready")
	good := w.LatestBuild.Resources[0].Agents[0]
	starting, gone := good, good
	starting.Name, starting.LifecycleState = "sidecar", codersdk.WorkspaceAgentLifecycleStarting
	disconnectedAt := time.Date(2026, 11, 29, 18, 30, 0, 500, time.UTC)
	gone.Name, gone.Status, gone.DisconnectedAt = "gpu", codersdk.WorkspaceAgentDisconnected, &disconnectedAt
	w.LatestBuild.Resources[0].Agents = []codersdk.WorkspaceAgent{good, starting, gone}
	got := toWorkspace(fxTarget(t, "prod", false), w, nil)
	ready := conditionOf(got.Status.Conditions, aggv1.ConditionReady)
	wantMsg := "agent sidecar is connected and running its startup scripts since 2026-11-29T18:10:26Z; agent gpu lost its connection to coderd at 2026-11-29T18:30:00Z"
	if ready.Reason != aggv1.ReasonAgentDisconnected || ready.Message != wantMsg {
		t.Errorf("Ready = {%s %q}, want {%s %q}", ready.Reason, ready.Message, aggv1.ReasonAgentDisconnected, wantMsg)
	}
	if s := agentsSummary(got.Status.Agents); s != "1/3" {
		t.Errorf("agents column = %q, want 1/3", s)
	}
	// The same agents, only starting: in progress, not stalled.
	w.LatestBuild.Resources[0].Agents = []codersdk.WorkspaceAgent{good, starting}
	got = toWorkspace(fxTarget(t, "prod", false), w, nil)
	if c := conditionOf(got.Status.Conditions, aggv1.ConditionReconciling); c.Status != metav1.ConditionTrue || c.Reason != aggv1.ReasonAgentStarting {
		t.Errorf("Reconciling = %+v, want True AgentStarting", c)
	}
	if c := conditionOf(got.Status.Conditions, aggv1.ConditionStalled); c.Status != metav1.ConditionFalse {
		t.Errorf("Stalled = %+v, want False", c)
	}
}

// A stopped workspace's agents are listed as coderd shows them (the stop
// build's resources have none), and Ready is Stopped whatever they were.
func TestToWorkspaceAgentsStopped(t *testing.T) {
	w := readAgentsFixture(t, "ready")
	w.LatestBuild.Transition, w.LatestBuild.Status = codersdk.WorkspaceTransitionStop, codersdk.WorkspaceStatusStopped
	w.LatestBuild.Resources = nil
	got := toWorkspace(fxTarget(t, "prod", false), w, nil)
	if got.Status.Agents != nil {
		t.Errorf("agents = %+v, want none", got.Status.Agents)
	}
	if c := conditionOf(got.Status.Conditions, aggv1.ConditionReady); c.Status != metav1.ConditionFalse || c.Reason != "Stopped" {
		t.Errorf("Ready = %+v, want False Stopped", c)
	}
	for _, typ := range []string{aggv1.ConditionReconciling, aggv1.ConditionStalled} {
		if c := conditionOf(got.Status.Conditions, typ); c.Status != metav1.ConditionFalse {
			t.Errorf("%s = %+v, want False: a stopped workspace asked to stop is settled", typ, c)
		}
	}
}

func TestAppURL(t *testing.T) {
	w := readAgentsFixture(t, "ready")
	tgt := fxTarget(t, "prod", false)
	for _, tc := range []struct {
		name string
		app  codersdk.WorkspaceApp
		want string
	}{
		{"path app", codersdk.WorkspaceApp{Slug: "code server", URL: "http://localhost:8080"}, "https://coder.example.com/@admin/ready.main/apps/code%20server/"},
		{"external", codersdk.WorkspaceApp{Slug: "docs", URL: "https://docs.example.com", External: true}, "https://docs.example.com"},
		{"subdomain", codersdk.WorkspaceApp{Slug: "web", URL: "http://localhost:3000", Subdomain: true}, ""},
		{"command", codersdk.WorkspaceApp{Slug: "shell", Command: "bash"}, ""},
	} {
		if got := appURL(tgt, w, "main", tc.app); got != tc.want {
			t.Errorf("%s: url = %q, want %q", tc.name, got, tc.want)
		}
	}
}
