package storage

import (
	"fmt"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// A workspace's agents and what they make of its Ready condition. All of
// it comes from the workspace as coderd's list and read return it (the
// latest build's resources carry their agents), so a list makes no
// request per workspace. The view stays deterministic: no field or
// message holds a time that moves while nothing changes (such as an
// agent's last heartbeat), so a poll reports a workspace changed only when
// its agents did.

// toAgents is the status of the agents of the latest build's resources.
func toAgents(t target, w *codersdk.Workspace) []aggv1.WorkspaceAgent {
	var out []aggv1.WorkspaceAgent
	for _, r := range w.LatestBuild.Resources {
		for _, a := range r.Agents {
			agent := aggv1.WorkspaceAgent{
				Name:           a.Name,
				ID:             uuidString(a.ID),
				Status:         string(a.Status),
				LifecycleState: string(a.LifecycleState),
				Healthy:        a.Health.Healthy,
				HealthReason:   a.Health.Reason,
			}
			for _, app := range a.Apps {
				if app.Hidden {
					continue
				}
				agent.Apps = append(agent.Apps, aggv1.WorkspaceApp{
					Slug:          app.Slug,
					DisplayName:   app.DisplayName,
					URL:           appURL(t, w, a.Name, app),
					SubdomainName: app.SubdomainName,
					Health:        string(app.Health),
				})
			}
			out = append(out, agent)
		}
	}
	return out
}

// appURL is where a user opens app: an external app's own URL, or the
// path coderd proxies it under (/@owner/workspace.agent/apps/slug/).
// Command apps have none; a subdomain app's host needs coderd's wildcard
// access URL, which the workspace does not carry.
func appURL(t target, w *codersdk.Workspace, agent string, app codersdk.WorkspaceApp) string {
	switch {
	case app.External:
		return app.URL
	case app.Subdomain, app.URL == "", t.URL == nil:
		return ""
	}
	u := *t.URL
	// Path is the unescaped path: String escapes it.
	u.Path = "/@" + w.OwnerName + "/" + w.Name + "." + agent + "/apps/" + app.Slug + "/"
	return u.String()
}

// agentProblem is why one agent keeps the workspace from being ready.
type agentProblem struct {
	reason  string
	message string
	// failed: the agent will not become ready without a change (Stalled).
	failed bool
	// rank orders problems: the worst decides the condition's reason.
	rank int
}

// agentProblemOf says what keeps a of being usable, or ok.
func agentProblemOf(a *codersdk.WorkspaceAgent) (agentProblem, bool) {
	name := "agent " + a.Name
	switch a.Status {
	case codersdk.WorkspaceAgentTimeout:
		return agentProblem{aggv1.ReasonAgentTimeout, fmt.Sprintf("%s has not connected within %s of its creation at %s", name,
			time.Duration(a.ConnectionTimeoutSeconds)*time.Second, stamp(a.CreatedAt)), true, 1}, false
	case codersdk.WorkspaceAgentDisconnected:
		since := ""
		if a.DisconnectedAt != nil {
			since = " at " + stamp(*a.DisconnectedAt)
		} else if a.LastConnectedAt != nil {
			since = " (last connected at " + stamp(*a.LastConnectedAt) + ")"
		}
		return agentProblem{aggv1.ReasonAgentDisconnected, name + " lost its connection to coderd" + since, true, 2}, false
	case codersdk.WorkspaceAgentConnecting:
		return agentProblem{aggv1.ReasonAgentConnecting, fmt.Sprintf("%s has not connected since its creation at %s (Coder waits %s)", name,
			stamp(a.CreatedAt), time.Duration(a.ConnectionTimeoutSeconds)*time.Second), false, 5}, false
	}
	switch a.LifecycleState {
	case codersdk.WorkspaceAgentLifecycleReady:
		return agentProblem{}, true
	case codersdk.WorkspaceAgentLifecycleStartError:
		return agentProblem{aggv1.ReasonAgentStartError, name + "'s startup script failed (lifecycle start_error); its log is in the agent's logs", true, 3}, false
	case codersdk.WorkspaceAgentLifecycleStartTimeout:
		return agentProblem{aggv1.ReasonAgentStartTimeout, name + "'s startup scripts did not finish in time (lifecycle start_timeout)", true, 4}, false
	case codersdk.WorkspaceAgentLifecycleCreated, codersdk.WorkspaceAgentLifecycleStarting:
		msg := name + " is connected and running its startup scripts"
		if a.StartedAt != nil {
			msg += " since " + stamp(*a.StartedAt)
		}
		return agentProblem{aggv1.ReasonAgentStarting, msg, false, 6}, false
	}
	return agentProblem{aggv1.ReasonAgentNotReady, fmt.Sprintf("%s is %s", name, a.LifecycleState), false, 7}, false
}

// stamp is a time as a condition message shows it.
func stamp(t time.Time) string { return t.UTC().Truncate(time.Second).Format(time.RFC3339) }

// agentsCondition decides Ready for a workspace whose start build
// succeeded: True when every agent is connected and ready (an agent
// without startup scripts is ready as soon as it connects), else False
// with the worst problem's reason and every problem in the message.
func agentsCondition(w *codersdk.Workspace, ready *metav1.Condition) (failed bool) {
	var (
		worst    agentProblem
		messages []string
		agents   int
	)
	for _, r := range w.LatestBuild.Resources {
		for i := range r.Agents {
			agents++
			p, ok := agentProblemOf(&r.Agents[i])
			if ok {
				continue
			}
			messages = append(messages, p.message)
			if worst.reason == "" || p.rank < worst.rank {
				worst = p
			}
			failed = failed || p.failed
		}
	}
	if worst.reason == "" {
		ready.Status, ready.Reason = metav1.ConditionTrue, aggv1.ReasonAgentsReady
		switch agents {
		case 0:
			ready.Reason, ready.Message = "Running", "the workspace is running (it has no agents)"
		case 1:
			ready.Message = "the workspace is running and its agent is connected and ready"
		default:
			ready.Message = fmt.Sprintf("the workspace is running and its %d agents are connected and ready", agents)
		}
		return false
	}
	ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, worst.reason, strings.Join(messages, "; ")
	return failed
}

// agentsSummary is "ready/total" agents for the table.
func agentsSummary(agents []aggv1.WorkspaceAgent) string {
	if len(agents) == 0 {
		return "0"
	}
	ready := 0
	for _, a := range agents {
		if a.Status == string(codersdk.WorkspaceAgentConnected) && a.LifecycleState == string(codersdk.WorkspaceAgentLifecycleReady) {
			ready++
		}
	}
	return fmt.Sprintf("%d/%d", ready, len(agents))
}
