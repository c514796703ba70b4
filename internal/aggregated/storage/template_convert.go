package storage

import (
	"time"

	"github.com/coder/coder/v2/codersdk"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// toTemplate builds the Kubernetes view of a Coder template from the
// template, its active version and that version's source files.
// Deterministic, like toWorkspace.
func toTemplate(t target, tpl *codersdk.Template, active *codersdk.TemplateVersion, files map[string]string) *aggv1.CoderTemplate {
	name := templateObjectName{ControlPlane: t.ControlPlane, Org: tpl.OrganizationName, Name: tpl.Name}
	obj := &aggv1.CoderTemplate{
		TypeMeta: metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderTemplate"},
		ObjectMeta: coderObjectMeta(t, name.String(t.prefixed), tpl.ID.String(), tpl.CreatedAt,
			objectLabels(t, tpl.OrganizationName, map[string]string{aggv1.LabelTemplate: tpl.Name})),
		Spec: aggv1.CoderTemplateSpec{
			Organization: tpl.OrganizationName,
			DisplayName:  tpl.DisplayName,
			Description:  tpl.Description,
			Icon:         tpl.Icon,
			VersionID:    uuidString(tpl.ActiveVersionID),
			Files:        files,
		},
		Status: aggv1.CoderTemplateStatus{
			ID:                 tpl.ID.String(),
			Organization:       tpl.OrganizationName,
			OrganizationID:     tpl.OrganizationID.String(),
			ActiveVersionID:    uuidString(tpl.ActiveVersionID),
			Deprecated:         tpl.Deprecated,
			DeprecationMessage: tpl.DeprecationMessage,
			// coderd reports -1 while it has not counted yet.
			ActiveUserCount: int32(max(tpl.ActiveUserCount, 0)),
			UpdatedAt:       timePtr(&tpl.UpdatedAt),
		},
	}
	showSettings(&obj.Spec, tpl)
	showActive(obj, active, tpl.UpdatedAt)
	return obj
}

// showActive sets what obj shows of its active version (nil: it could not
// be read; updatedAt then dates the Ready condition).
func showActive(obj *aggv1.CoderTemplate, active *codersdk.TemplateVersion, updatedAt time.Time) {
	ready := metav1.Condition{Type: aggv1.ConditionReady, Status: metav1.ConditionUnknown, Reason: "VersionUnknown",
		Message: "the active version could not be read", LastTransitionTime: metav1.NewTime(updatedAt.Truncate(time.Second))}
	if active != nil {
		obj.Status.ActiveVersionName = active.Name
		obj.Status.BuildStatus = string(active.Job.Status)
		obj.Status.BuildError = active.Job.Error
		at := active.CreatedAt
		if active.Job.CompletedAt != nil {
			at = *active.Job.CompletedAt
		}
		ready.LastTransitionTime = metav1.NewTime(at.Truncate(time.Second))
		ready.Reason = reasonFor(string(active.Job.Status))
		switch active.Job.Status {
		case codersdk.ProvisionerJobSucceeded:
			ready.Status, ready.Message = metav1.ConditionTrue, "the active version "+active.Name+" built successfully"
		case codersdk.ProvisionerJobFailed:
			ready.Status, ready.Message = metav1.ConditionFalse, active.Job.Error
		default:
			ready.Status, ready.Message = metav1.ConditionFalse, "the active version's build is "+string(active.Job.Status)
		}
	}
	obj.Status.Conditions = []metav1.Condition{ready}
}
