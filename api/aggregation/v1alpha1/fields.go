package v1alpha1

import (
	"fmt"
	"sort"
	"strconv"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// Labels the server sets on every object from Coder's data, so that
// `kubectl get -l` selects by them.
const (
	LabelControlPlane = GroupName + "/control-plane"
	LabelOrganization = GroupName + "/organization"
	LabelOwner        = GroupName + "/owner"
	LabelTemplate     = GroupName + "/template"
)

// Condition types.
const (
	// ConditionReady: a workspace's start build succeeded and every agent
	// is connected and ready; a template's active version built
	// successfully.
	ConditionReady = "Ready"
	// ConditionBuilding: a workspace build is pending or running.
	ConditionBuilding = "Building"
	// ConditionReconciling: a workspace is on its way to what its spec
	// asks (a build runs, or its agents are connecting or starting); kstatus
	// reads it as in progress.
	ConditionReconciling = "Reconciling"
	// ConditionStalled: a workspace's build or one of its agents failed
	// and it will not become ready without a change; kstatus reads it as
	// failed.
	ConditionStalled = "Stalled"
	// ConditionSecretsCurrent: the Secrets that the variables of the
	// template version shown took values from are unchanged since
	// (reason SecretChanged when one changed; the next apply reads it
	// again). Present only when a value came from a Secret.
	ConditionSecretsCurrent = "SecretsCurrent"
)

// Reasons of a template's SecretsCurrent condition.
const (
	ReasonSecretsUnchanged = "SecretsUnchanged"
	ReasonSecretChanged    = "SecretChanged"
	ReasonSecretUnknown    = "SecretUnknown"
)

// Reasons of a template's Ready condition while the spec.files last
// applied build in the background.
const (
	// ReasonBuilding: the applied version is building (Ready=False).
	ReasonBuilding = "Building"
	// ReasonBuildFailed: the applied version did not build; the previous
	// active version stays active (Ready=False).
	ReasonBuildFailed = "BuildFailed"
)

// Reasons of a workspace's Ready condition that its agents decide (the
// start build succeeded); the others come from Coder's workspace and job
// status (Running, BuildFailed, Stopped, Starting, ...).
const (
	// ReasonAgentsReady: every agent is connected and ready (True).
	ReasonAgentsReady = "AgentsReady"
	// ReasonAgentConnecting: an agent has not connected yet.
	ReasonAgentConnecting = "AgentConnecting"
	// ReasonAgentTimeout: an agent did not connect within the template's
	// connection timeout; coderd keeps waiting, but something is wrong
	// (Stalled).
	ReasonAgentTimeout = "AgentTimeout"
	// ReasonAgentDisconnected: an agent was connected and lost its
	// connection (Stalled).
	ReasonAgentDisconnected = "AgentDisconnected"
	// ReasonAgentStarting: an agent is connected and runs its startup
	// scripts.
	ReasonAgentStarting = "AgentStarting"
	// ReasonAgentStartError: an agent's startup script failed (Stalled).
	ReasonAgentStartError = "AgentStartError"
	// ReasonAgentStartTimeout: an agent's startup scripts did not finish
	// in time (Stalled).
	ReasonAgentStartTimeout = "AgentStartTimeout"
	// ReasonAgentNotReady: an agent is in another lifecycle state
	// (shutting down, off).
	ReasonAgentNotReady = "AgentNotReady"
)

// WorkspaceFields returns the fields a CoderWorkspace can be selected by
// with --field-selector.
func WorkspaceFields(w *CoderWorkspace) fields.Set {
	return fields.Set{
		"metadata.name":      w.Name,
		"metadata.namespace": w.Namespace,
		"spec.organization":  w.Spec.Organization,
		"spec.templateName":  w.Spec.TemplateName,
		"spec.running":       strconv.FormatBool(w.Spec.Running),
		"status.owner":       w.Status.Owner,
		"status.phase":       w.Status.Phase,
		"status.id":          w.Status.ID,
	}
}

// TemplateFields returns the fields a CoderTemplate can be selected by
// with --field-selector.
func TemplateFields(t *CoderTemplate) fields.Set {
	return fields.Set{
		"metadata.name":      t.Name,
		"metadata.namespace": t.Namespace,
		"spec.organization":  t.Spec.Organization,
		"status.deprecated":  strconv.FormatBool(t.Status.Deprecated),
		"status.buildStatus": t.Status.BuildStatus,
		"status.id":          t.Status.ID,
	}
}

// TemplateVersionFields returns the fields a CoderTemplateVersion can be
// selected by with --field-selector.
func TemplateVersionFields(v *CoderTemplateVersion) fields.Set {
	return fields.Set{
		"metadata.name":      v.Name,
		"metadata.namespace": v.Namespace,
		"spec.organization":  v.Spec.Organization,
		"spec.template":      v.Spec.Template,
		"status.buildStatus": v.Status.BuildStatus,
		"status.active":      strconv.FormatBool(v.Status.Active),
		"status.id":          v.Status.ID,
		"status.templateID":  v.Status.TemplateID,
	}
}

// UserFields returns the fields a CoderUser can be selected by with
// --field-selector.
func UserFields(u *CoderUser) fields.Set {
	return fields.Set{
		"metadata.name":      u.Name,
		"metadata.namespace": u.Namespace,
		"spec.email":         u.Spec.Email,
		"spec.loginType":     u.Spec.LoginType,
		"spec.suspended":     strconv.FormatBool(u.Spec.Suspended),
		"status.status":      u.Status.Status,
		"status.id":          u.Status.ID,
	}
}

// GroupFields returns the fields a CoderGroup can be selected by with
// --field-selector.
func GroupFields(g *CoderGroup) fields.Set {
	return fields.Set{
		"metadata.name":      g.Name,
		"metadata.namespace": g.Namespace,
		"spec.organization":  g.Spec.Organization,
		"status.source":      g.Status.Source,
		"status.id":          g.Status.ID,
	}
}

// OrganizationFields returns the fields a CoderOrganization can be
// selected by with --field-selector.
func OrganizationFields(o *CoderOrganization) fields.Set {
	return fields.Set{
		"metadata.name":      o.Name,
		"metadata.namespace": o.Namespace,
		"status.default":     strconv.FormatBool(o.Status.Default),
		"status.id":          o.Status.ID,
	}
}

func addFieldLabelConversions(scheme *runtime.Scheme) error {
	for kind, set := range map[string]fields.Set{
		"CoderWorkspace":       WorkspaceFields(&CoderWorkspace{}),
		"CoderTemplate":        TemplateFields(&CoderTemplate{}),
		"CoderTemplateVersion": TemplateVersionFields(&CoderTemplateVersion{}),
		"CoderUser":            UserFields(&CoderUser{}),
		"CoderGroup":           GroupFields(&CoderGroup{}),
		"CoderOrganization":    OrganizationFields(&CoderOrganization{}),
	} {
		if err := scheme.AddFieldLabelConversionFunc(SchemeGroupVersion.WithKind(kind), fieldLabelConversion(kind, set)); err != nil {
			return err
		}
	}
	return nil
}

func fieldLabelConversion(kind string, known fields.Set) runtime.FieldLabelConversionFunc {
	return func(label, value string) (string, string, error) {
		if _, ok := known[label]; ok {
			return label, value, nil
		}
		return "", "", fmt.Errorf("field label %q is not supported for %s; supported: %s", label, kind, fieldNames(known))
	}
}

func fieldNames(s fields.Set) string {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	return fmt.Sprint(names)
}
