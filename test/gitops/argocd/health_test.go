package argocd

import (
	"testing"

	"github.com/argoproj/gitops-engine/pkg/health"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestWorkspaceHealth runs docs/gitops.md's health script on workspaces
// in the states coder-k8s reports (their conditions as
// internal/aggregated/storage writes them), and checks that Argo CD's
// health agrees with kstatus (Reconciling True: InProgress, Stalled
// True: Failed, else Current) and with kubectl wait --for=condition=Ready.
func TestWorkspaceHealth(t *testing.T) {
	h := luaHealth{script: docsHealthScript(t)}
	cond := func(typ, status, reason, msg string) any {
		return map[string]any{"type": typ, "status": status, "reason": reason, "message": msg}
	}
	for _, tc := range []struct {
		name       string
		running    bool
		phase      string
		conditions []any
		want       health.HealthStatusCode
		message    string
	}{
		{"agents ready", true, "running", []any{
			cond("Ready", "True", "AgentsReady", "the workspace is running and its agent is connected and ready"),
			cond("Reconciling", "False", "Settled", "no build runs and the agents are settled"), cond("Stalled", "False", "NotStalled", "nothing failed"),
		}, health.HealthStatusHealthy, "AgentsReady: the workspace is running and its agent is connected and ready"},
		{"agent connecting", true, "running", []any{
			cond("Ready", "False", "AgentConnecting", "agent main has not connected since its creation at 2026-11-29T18:10:26Z (Coder waits 2m0s); pod ws/p (Pending): container dev waiting: ImagePullBackOff"),
			cond("Reconciling", "True", "AgentConnecting", "agent main has not connected"), cond("Stalled", "False", "NotStalled", "nothing failed"),
		}, health.HealthStatusProgressing, "AgentConnecting: agent main has not connected since its creation at 2026-11-29T18:10:26Z (Coder waits 2m0s); pod ws/p (Pending): container dev waiting: ImagePullBackOff"},
		{"agent timed out", true, "running", []any{
			cond("Ready", "False", "AgentTimeout", "agent main has not connected within 2m0s of its creation at 2026-11-29T18:10:26Z"),
			cond("Reconciling", "False", "Settled", "no build runs and the agents are settled"),
			cond("Stalled", "True", "AgentTimeout", "agent main has not connected within 2m0s of its creation at 2026-11-29T18:10:26Z"),
		}, health.HealthStatusDegraded, "AgentTimeout: agent main has not connected within 2m0s of its creation at 2026-11-29T18:10:26Z"},
		{"startup script failed", true, "running", []any{
			cond("Ready", "False", "AgentStartError", "agent main's startup script failed"),
			cond("Stalled", "True", "AgentStartError", "agent main's startup script failed"),
		}, health.HealthStatusDegraded, "AgentStartError: agent main's startup script failed"},
		{"building", true, "starting", []any{
			cond("Ready", "False", "Starting", "the workspace is starting"), cond("Reconciling", "True", "Running", "a start build is running"),
			cond("Stalled", "False", "NotStalled", "nothing failed"),
		}, health.HealthStatusProgressing, "Starting: the workspace is starting"},
		{"build failed", true, "failed", []any{
			cond("Ready", "False", "BuildFailed", "terraform apply: boom"), cond("Stalled", "True", "BuildFailed", "terraform apply: boom"),
		}, health.HealthStatusDegraded, "BuildFailed: terraform apply: boom"},
		{"stopped as asked", false, "stopped", []any{
			cond("Ready", "False", "Stopped", "the workspace is stopped"), cond("Reconciling", "False", "Settled", "no build runs and the agents are settled"),
			cond("Stalled", "False", "NotStalled", "nothing failed"),
		}, health.HealthStatusHealthy, "stopped, as spec.running asks"},
		{"stopped but asked to run", true, "stopped", []any{
			cond("Ready", "False", "Stopped", "the workspace is stopped"),
		}, health.HealthStatusProgressing, "Stopped: the workspace is stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "aggregation.coder.com/v1alpha1", "kind": "CoderWorkspace",
				"metadata": map[string]any{"name": "coder.alice.dev", "generation": int64(2)},
				"spec":     map[string]any{"running": tc.running},
				"status":   map[string]any{"observedGeneration": int64(2), "phase": tc.phase, "conditions": tc.conditions},
			}}
			got, err := h.GetResourceHealth(u)
			if err != nil {
				t.Fatal(err)
			}
			if got.Status != tc.want || got.Message != tc.message {
				t.Errorf("health = %s %q, want %s %q", got.Status, got.Message, tc.want, tc.message)
			}
		})
	}
}
