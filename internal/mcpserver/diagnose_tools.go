package mcpserver

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/storage"
)

// diagnose_workspace answers "why is this workspace not usable" in one
// call: the workspace (build, agents, Ready), its pods with their
// containers' states and latest events, and the end of the latest build's
// log. Every read is the caller's own (their token to kube-apiserver), so
// it shows only what the caller may read; what could not be read is said
// in notes and the rest of the answer stands.

// Caps of a diagnosis.
const (
	diagnosePods        = 5
	diagnosePodEvents   = 5
	diagnoseLogLines    = 30
	diagnoseLogMaxBytes = 8 << 10
)

// WorkspaceDiagnosis is what diagnose_workspace found.
type WorkspaceDiagnosis struct {
	Workspace WorkspaceDetail `json:"workspace"`
	Usable    bool            `json:"usable" jsonschema:"the workspace is ready to use (Ready is True)"`
	Summary   string          `json:"summary" jsonschema:"the Ready condition's reason and message: what is wrong, including what its pods show"`
	Pods      []DiagnosedPod  `json:"pods" jsonschema:"the workspace's pods (label com.coder.workspace.id) in the namespaces its control plane runs workspaces in"`
	BuildLog  string          `json:"buildLog,omitempty" jsonschema:"the last lines of the latest build's log"`
	Notes     []string        `json:"notes,omitempty" jsonschema:"what could not be read and why (the rest of the answer stands)"`
}

// DiagnosedPod is one pod of a workspace.
type DiagnosedPod struct {
	Namespace  string     `json:"namespace"`
	Name       string     `json:"name"`
	Phase      string     `json:"phase"`
	Node       string     `json:"node,omitempty"`
	Problems   []string   `json:"problems,omitempty" jsonschema:"unscheduled, or containers waiting or terminated with a reason"`
	Containers []string   `json:"containers" jsonschema:"each as: name: state (reason: message), restarts N"`
	Events     []EventRow `json:"events,omitempty" jsonschema:"the pod's latest events, newest first"`
}

// Agent is a Coder agent of a workspace (CoderWorkspace status.agents).
type Agent struct {
	Name           string `json:"name"`
	Status         string `json:"status" jsonschema:"connection to coderd: connecting, connected, disconnected or timeout"`
	LifecycleState string `json:"lifecycleState" jsonschema:"created, starting, ready (startup scripts done), start_error, start_timeout, shutting_down, off, ..."`
	Healthy        bool   `json:"healthy"`
	HealthReason   string `json:"healthReason,omitempty"`
	Apps           []App  `json:"apps,omitempty"`
}

// App is an app of an agent.
type App struct {
	Slug        string `json:"slug"`
	DisplayName string `json:"displayName,omitempty"`
	URL         string `json:"url,omitempty" jsonschema:"where the app opens (through coderd, or an external app's URL); empty for command and subdomain apps"`
	Health      string `json:"health" jsonschema:"disabled (no health check), initializing, healthy or unhealthy"`
}

func agents(in []aggv1.WorkspaceAgent) []Agent {
	var out []Agent
	for _, a := range in {
		agent := Agent{Name: a.Name, Status: a.Status, LifecycleState: a.LifecycleState, Healthy: a.Healthy, HealthReason: a.HealthReason}
		for _, app := range a.Apps {
			agent.Apps = append(agent.Apps, App{Slug: app.Slug, DisplayName: app.DisplayName, URL: app.URL, Health: app.Health})
		}
		out = append(out, agent)
	}
	return out
}

func (s *Server) diagnoseTools() []tool {
	return []tool{
		define(s, "diagnose_workspace", toolMeta{
			Title:       "Diagnose a Coder workspace",
			Description: "Says why a Coder workspace is or is not usable, in one answer: its build status and error, its agents (connected? startup scripts done?), the Ready condition, its pods (container states such as ImagePullBackOff or CrashLoopBackOff, unschedulable) with their latest events, and the last lines of the latest build's log. Shows only what the caller may read.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, diagnoseWorkspace),
	}
}

func diagnoseWorkspace(ctx context.Context, c *call, in ObjectInput) (WorkspaceDiagnosis, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return WorkspaceDiagnosis{}, err
	}
	w, err := c.getWorkspace(ctx, in.Namespace, in.Name)
	if err != nil {
		return WorkspaceDiagnosis{}, err
	}
	out := WorkspaceDiagnosis{Workspace: workspaceDetail(w), Pods: []DiagnosedPod{}}
	out.Usable = out.Workspace.Ready
	for _, cond := range w.Status.Conditions {
		if cond.Type == aggv1.ConditionReady {
			out.Summary = cond.Reason + ": " + cond.Message
		}
	}
	for _, ns := range c.workspaceNamespaces(ctx, w, &out.Notes) {
		pods, err := c.workspacePods(ctx, ns, w.Status.ID)
		if err != nil {
			out.Notes = append(out.Notes, err.Error())
			continue
		}
		for i := range pods {
			if len(out.Pods) == diagnosePods {
				out.Notes = append(out.Notes, fmt.Sprintf("more than %d pods: the first %d by namespace and name are shown", diagnosePods, diagnosePods))
				break
			}
			out.Pods = append(out.Pods, c.diagnosePod(ctx, &pods[i], &out.Notes))
		}
	}
	if w.Status.LatestBuild != nil {
		log, err := c.buildLogTail(ctx, w)
		if err != nil {
			out.Notes = append(out.Notes, "build log: "+err.Error())
		}
		out.BuildLog = log
	}
	return out, nil
}

// workspaceNamespaces are where w's pods may be: the namespaces its
// control plane's workspace RBAC covers, when the caller may read the
// control plane; w's namespace otherwise.
func (c *call) workspaceNamespaces(ctx context.Context, w *aggv1.CoderWorkspace, notes *[]string) []string {
	var list coderv1alpha1.CoderControlPlaneList
	if err := c.kube.Direct.List(ctx, &list, client.InNamespace(w.Namespace)); err != nil {
		*notes = append(*notes, fmt.Sprintf("control planes of namespace %s (for the namespaces workspaces run in; only %s is searched): %v", w.Namespace, w.Namespace, err))
		return []string{w.Namespace}
	}
	out := []string{w.Namespace}
	for _, cp := range list.Items {
		if name := w.Labels[aggv1.LabelControlPlane]; name != "" && cp.Name != name {
			continue
		}
		for _, ns := range cp.Spec.WorkspaceRBAC.ExtraNamespaces {
			if !slices.Contains(out, ns) {
				out = append(out, ns)
			}
		}
	}
	return out
}

// workspacePods lists the pods of workspace id in namespace, by name.
func (c *call) workspacePods(ctx context.Context, namespace, id string) ([]corev1.Pod, error) {
	if id == "" {
		return nil, nil
	}
	var pods corev1.PodList
	if err := c.kube.Direct.List(ctx, &pods, client.InNamespace(namespace), client.MatchingLabels{storage.LabelWorkspaceID: id}); err != nil {
		return nil, fmt.Errorf("pods of namespace %s: %w", namespace, err)
	}
	sort.Slice(pods.Items, func(i, j int) bool { return pods.Items[i].Name < pods.Items[j].Name })
	return pods.Items, nil
}

// diagnosePod describes p: its containers' states and latest events.
func (c *call) diagnosePod(ctx context.Context, p *corev1.Pod, notes *[]string) DiagnosedPod {
	d := DiagnosedPod{Namespace: p.Namespace, Name: p.Name, Phase: string(p.Status.Phase), Node: p.Spec.NodeName,
		Problems: storage.PodProblems(p), Containers: []string{}}
	for _, st := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		state := "unknown"
		switch {
		case st.State.Running != nil:
			state = "running"
		case st.State.Waiting != nil:
			state = "waiting (" + reasonMessage(st.State.Waiting.Reason, st.State.Waiting.Message) + ")"
		case st.State.Terminated != nil:
			t := st.State.Terminated
			state = fmt.Sprintf("terminated (%s), exit code %d", reasonMessage(t.Reason, t.Message), t.ExitCode)
		}
		d.Containers = append(d.Containers, fmt.Sprintf("%s: %s, restarts %d", st.Name, state, st.RestartCount))
	}
	events, err := listEvents(ctx, c, EventListInput{Namespace: p.Namespace, Kind: "Pod", Name: p.Name, Limit: diagnosePodEvents})
	if err != nil {
		*notes = append(*notes, fmt.Sprintf("events of pod %s/%s: %v", p.Namespace, p.Name, err))
	}
	d.Events = events.Items
	return d
}

func reasonMessage(reason, message string) string {
	if message == "" {
		return reason
	}
	return reason + ": " + strings.Join(strings.Fields(message), " ")
}

// buildLogTail reads the last lines of w's latest build through the log
// subresource, as the caller.
func (c *call) buildLogTail(ctx context.Context, w *aggv1.CoderWorkspace) (string, error) {
	raw, err := c.kube.Clientset.Discovery().RESTClient().Get().
		AbsPath("/apis", aggv1.SchemeGroupVersion.Group, aggv1.SchemeGroupVersion.Version, "namespaces", w.Namespace, "coderworkspaces", w.Name, "log").
		Param("tailLines", strconv.Itoa(diagnoseLogLines)).
		Do(ctx).Raw()
	if err != nil {
		return "", fmt.Errorf("the log of build %d: %w", w.Status.LatestBuild.Number, err)
	}
	// The end is what tells: keep the last bytes, from a line's start.
	if len(raw) > diagnoseLogMaxBytes {
		raw = raw[len(raw)-diagnoseLogMaxBytes:]
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			raw = raw[i+1:]
		}
	}
	return string(raw), nil
}
