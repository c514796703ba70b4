package storage

import (
	"net/url"
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// FinalizerDeleteBuild marks a workspace whose delete build is under way:
// Kubernetes clients expect an object with a deletionTimestamp to hold a
// finalizer until it disappears.
const FinalizerDeleteBuild = aggv1.GroupName + "/delete-build"

// toWorkspace builds the Kubernetes view of a Coder workspace. It is
// deterministic: the same coderd state gives the same object, so the watch
// cache reports a change only when coderd changed something.
func toWorkspace(t target, w *codersdk.Workspace, params []aggv1.WorkspaceParameter) *aggv1.CoderWorkspace {
	name := workspaceName{ControlPlane: t.ControlPlane, Org: w.OrganizationName, Owner: w.OwnerName, Name: w.Name}
	b := &w.LatestBuild
	// One string for each ID, however many fields show it: 10,000 cached
	// workspaces hold them.
	id, versionID := w.ID.String(), uuidString(b.TemplateVersionID)
	obj := &aggv1.CoderWorkspace{
		TypeMeta: metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderWorkspace"},
		ObjectMeta: coderObjectMeta(t, name.String(t.prefixed), id, w.CreatedAt,
			objectLabels(t, w.OrganizationName, map[string]string{aggv1.LabelOwner: w.OwnerName, aggv1.LabelTemplate: w.TemplateName})),
		Spec: aggv1.CoderWorkspaceSpec{
			Organization:      w.OrganizationName,
			TemplateName:      w.TemplateName,
			TemplateVersionID: versionID,
			Running:           b.Transition == codersdk.WorkspaceTransitionStart,
			TTLMillis:         w.TTLMillis,
			AutostartSchedule: w.AutostartSchedule,
			Parameters:        params,
			AutomaticUpdates:  string(w.AutomaticUpdates),
		},
		Status: aggv1.CoderWorkspaceStatus{
			ID:                  id,
			Owner:               w.OwnerName,
			OwnerID:             uuidString(w.OwnerID),
			Organization:        w.OrganizationName,
			OrganizationID:      uuidString(w.OrganizationID),
			Template:            w.TemplateName,
			TemplateDisplayName: w.TemplateDisplayName,
			Phase:               string(b.Status),
			Outdated:            w.Outdated,
			Healthy:             w.Health.Healthy,
			Agents:              toAgents(t, w),
			LastUsedAt:          timePtr(&w.LastUsedAt),
			URL:                 workspaceURL(t, w),
		},
	}
	if b.ID.String() != zeroUUID {
		obj.Status.LatestBuild = &aggv1.WorkspaceBuild{
			ID:                  b.ID.String(),
			Number:              b.BuildNumber,
			Transition:          string(b.Transition),
			JobStatus:           string(b.Job.Status),
			Error:               b.Job.Error,
			TemplateVersionID:   versionID,
			TemplateVersionName: b.TemplateVersionName,
			Initiator:           b.InitiatorUsername,
			CreatedAt:           metav1.NewTime(b.CreatedAt.Truncate(time.Second)),
			CompletedAt:         timePtr(b.Job.CompletedAt),
		}
		if b.Deadline.Valid && b.Transition == codersdk.WorkspaceTransitionStart {
			obj.Status.AutoShutdownDeadline = timePtr(&b.Deadline.Time)
		}
	}
	obj.Status.Conditions = workspaceConditions(w)
	if deleting(b) {
		// Visible until coderd has finished the delete build.
		ts := metav1.NewTime(b.CreatedAt.Truncate(time.Second))
		obj.DeletionTimestamp = &ts
		obj.Finalizers = []string{FinalizerDeleteBuild}
	}
	return obj
}

// deleting reports a delete build that is queued, running or done: the
// workspace is going away. A failed or canceled delete leaves it in place,
// and its deletionTimestamp goes away again: Coder lets a delete be undone.
func deleting(b *codersdk.WorkspaceBuild) bool {
	if b.Transition != codersdk.WorkspaceTransitionDelete {
		return false
	}
	switch b.Job.Status {
	case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
		return false
	}
	return true
}

func buildInProgress(s codersdk.ProvisionerJobStatus) bool {
	switch s {
	case codersdk.ProvisionerJobPending, codersdk.ProvisionerJobRunning, codersdk.ProvisionerJobCanceling:
		return true
	}
	return false
}

// workspaceConditions are Ready (a usable workspace: the start build
// succeeded and every agent is connected and ready), Building, and the
// kstatus pair Reconciling and Stalled, so that kubectl wait, kstatus and
// Argo CD's health (docs/gitops.md) agree on what ready means.
func workspaceConditions(w *codersdk.Workspace) []metav1.Condition {
	b := &w.LatestBuild
	at := metav1.NewTime(b.CreatedAt.Truncate(time.Second))
	if b.Job.CompletedAt != nil {
		at = metav1.NewTime(b.Job.CompletedAt.Truncate(time.Second))
	}
	ready := metav1.Condition{Type: aggv1.ConditionReady, LastTransitionTime: at}
	agentFailed := false
	switch {
	case b.Transition == codersdk.WorkspaceTransitionStart && b.Job.Status == codersdk.ProvisionerJobSucceeded:
		agentFailed = agentsCondition(w, &ready)
		if ready.Status == metav1.ConditionTrue {
			ready.LastTransitionTime = latestAgentReady(w, at)
		}
	case b.Job.Status == codersdk.ProvisionerJobFailed:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, "BuildFailed", b.Job.Error
	default:
		ready.Status, ready.Reason = metav1.ConditionFalse, reasonFor(string(b.Status))
		ready.Message = "the workspace is " + string(b.Status)
	}
	building := metav1.Condition{Type: aggv1.ConditionBuilding, LastTransitionTime: at}
	inProgress := buildInProgress(b.Job.Status)
	if inProgress {
		building.Status, building.Reason = metav1.ConditionTrue, reasonFor(string(b.Job.Status))
		building.Message = "a " + string(b.Transition) + " build is " + string(b.Job.Status)
	} else {
		building.Status, building.Reason = metav1.ConditionFalse, reasonFor(string(b.Job.Status))
		building.Message = "the last " + string(b.Transition) + " build " + string(b.Job.Status)
	}
	stalled := metav1.Condition{Type: aggv1.ConditionStalled, Status: metav1.ConditionFalse, Reason: "NotStalled", Message: "nothing failed", LastTransitionTime: at}
	reconciling := metav1.Condition{Type: aggv1.ConditionReconciling, Status: metav1.ConditionFalse, Reason: "Settled", Message: "no build runs and the agents are settled", LastTransitionTime: at}
	switch {
	case b.Job.Status == codersdk.ProvisionerJobFailed || agentFailed:
		stalled.Status, stalled.Reason, stalled.Message = metav1.ConditionTrue, ready.Reason, ready.Message
	case inProgress:
		reconciling.Status, reconciling.Reason, reconciling.Message = metav1.ConditionTrue, building.Reason, building.Message
	case ready.Status == metav1.ConditionFalse && b.Transition == codersdk.WorkspaceTransitionStart && b.Job.Status == codersdk.ProvisionerJobSucceeded:
		// Agents connecting or running their startup scripts.
		reconciling.Status, reconciling.Reason, reconciling.Message = metav1.ConditionTrue, ready.Reason, ready.Message
	}
	return []metav1.Condition{ready, building, reconciling, stalled}
}

// latestAgentReady is when the last agent became ready, or at when that
// is earlier or unknown.
func latestAgentReady(w *codersdk.Workspace, at metav1.Time) metav1.Time {
	for _, r := range w.LatestBuild.Resources {
		for _, a := range r.Agents {
			if a.ReadyAt != nil && a.ReadyAt.Truncate(time.Second).After(at.Time) {
				at = metav1.NewTime(a.ReadyAt.Truncate(time.Second))
			}
		}
	}
	return at
}

// reasonFor turns a Coder status into a condition reason (CamelCase).
func reasonFor(s string) string {
	if s == "" {
		return "Unknown"
	}
	out := make([]byte, 0, len(s))
	upper := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || c == '-' || c == ' ' {
			upper = true
			continue
		}
		if upper && c >= 'a' && c <= 'z' {
			c -= 'a' - 'A'
		}
		upper = false
		out = append(out, c)
	}
	return string(out)
}

func workspaceURL(t target, w *codersdk.Workspace) string {
	if t.URL == nil {
		return ""
	}
	u := *t.URL
	u.Path = "/@" + url.PathEscape(w.OwnerName) + "/" + url.PathEscape(w.Name)
	return u.String()
}

// coderObjectMeta is the metadata of the view of a Coder object: the UID
// is the Coder ID and the creation time is Coder's, at the second
// precision the API serializes, so the view is the same on every read.
func coderObjectMeta(t target, name, uid string, created time.Time, labels map[string]string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:              name,
		Namespace:         t.Namespace,
		ManagedFields:     coderdOwnsStatus(),
		UID:               types.UID(uid),
		CreationTimestamp: metav1.NewTime(created.Truncate(time.Second)),
		Labels:            labels,
	}
}

func objectLabels(t target, org string, extra map[string]string) map[string]string {
	l := map[string]string{aggv1.LabelOrganization: org}
	if t.ControlPlane != "" {
		l[aggv1.LabelControlPlane] = t.ControlPlane
	}
	for k, v := range extra {
		if v != "" {
			l[k] = v
		}
	}
	return l
}

const zeroUUID = "00000000-0000-0000-0000-000000000000"

func uuidString(id interface{ String() string }) string {
	if s := id.String(); s != zeroUUID {
		return s
	}
	return ""
}

// timePtr converts to a metav1.Time at second precision (what the API
// serializes), nil for unset times.
func timePtr(t *time.Time) *metav1.Time {
	if t == nil || t.IsZero() {
		return nil
	}
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

func toParameters(in []codersdk.WorkspaceBuildParameter) []aggv1.WorkspaceParameter {
	if len(in) == 0 {
		return nil
	}
	out := make([]aggv1.WorkspaceParameter, len(in))
	for i, p := range in {
		out[i] = aggv1.WorkspaceParameter{Name: p.Name, Value: p.Value}
	}
	return out
}
