package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// The tools that create a workspace and change its parameters, and the
// one that says which parameters a template takes. They write
// CoderWorkspace objects as the caller, so coderd validates the values
// and refuses what it refuses for kubectl, with the same message.

// TemplateParametersInput names a template and, optionally, one of its
// versions.
type TemplateParametersInput struct {
	Namespace string `json:"namespace" jsonschema:"Kubernetes namespace of the template"`
	Template  string `json:"template" jsonschema:"<organization>.<template>"`
	Version   string `json:"version,omitempty" jsonschema:"a version name; empty for the active version"`
}

// TemplateParameters is what a workspace of a template version may set.
type TemplateParameters struct {
	Template   string                    `json:"template"`
	Version    string                    `json:"version"`
	VersionID  string                    `json:"versionID"`
	Parameters []aggv1.TemplateParameter `json:"parameters" jsonschema:"set them with create_workspace or update_workspace; ephemeral ones cannot be set there, immutable ones only at create"`
	Presets    []aggv1.TemplatePreset    `json:"presets,omitempty"`
}

// CreateWorkspaceInput is a new workspace.
type CreateWorkspaceInput struct {
	Namespace  string            `json:"namespace" jsonschema:"Kubernetes namespace of the control plane"`
	Name       string            `json:"name" jsonschema:"<organization>.<owner>.<workspace>"`
	Template   string            `json:"template" jsonschema:"the template's name (without the organization)"`
	Parameters map[string]string `json:"parameters,omitempty" jsonschema:"parameter values by name (list_template_parameters shows them); those left out get the template's defaults"`
	Preset     string            `json:"preset,omitempty" jsonschema:"a preset of the template's active version"`
	Stopped    bool              `json:"stopped,omitempty" jsonschema:"create the workspace stopped instead of starting it"`
}

// UpdateWorkspaceInput changes a workspace's version or parameters.
type UpdateWorkspaceInput struct {
	Namespace       string            `json:"namespace" jsonschema:"Kubernetes namespace of the workspace"`
	Name            string            `json:"name" jsonschema:"<organization>.<owner>.<workspace>"`
	ToActiveVersion bool              `json:"toActiveVersion,omitempty" jsonschema:"build the template's active version"`
	Parameters      map[string]string `json:"parameters,omitempty" jsonschema:"new values by name; parameters left out keep theirs"`
	Preset          string            `json:"preset,omitempty" jsonschema:"a preset to apply"`
}

// UpdateWorkspaceResult is the workspace after the update.
type UpdateWorkspaceResult struct {
	Workspace WorkspaceDetail `json:"workspace"`
	Changed   bool            `json:"changed" jsonschema:"false when the workspace already had this version and these values (no build)"`
}

func (s *Server) workspaceLifecycleTools() []tool {
	return []tool{
		define(s, "list_template_parameters", toolMeta{
			Title:       "List a template's parameters and presets",
			Description: "Shows the rich parameters of a Coder template's active version (or a given version): type, default, options, validation (min, max, regex and its message), whether each is mutable or ephemeral, and the version's presets with their values.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, listTemplateParameters),
		define(s, "create_workspace", toolMeta{
			Title:       "Create a Coder workspace",
			Description: "Creates a Coder workspace from a template, with parameter values and/or a preset, and starts it (unless stopped). coderd validates the values; a bad one is refused with coderd's message naming the parameter. Returns at once; get_workspace shows the build.",
			OpenWorld:   true,
		}, createWorkspace),
		define(s, "update_workspace", toolMeta{
			Title:       "Update a Coder workspace's version or parameters",
			Description: "Builds a Coder workspace with the template's active version and/or new parameter values or a preset, keeping its run state. Immutable parameters cannot change (coderd refuses). Calling it again with the same values changes nothing.",
			Idempotent:  true, OpenWorld: true,
		}, updateWorkspace),
	}
}

func listTemplateParameters(ctx context.Context, c *call, in TemplateParametersInput) (TemplateParameters, error) {
	if err := requireNamed(in.Namespace, "template", in.Template); err != nil {
		return TemplateParameters{}, err
	}
	version := in.Version
	if version == "" {
		var tpl aggv1.CoderTemplate
		if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: in.Namespace, Name: in.Template}, &tpl); err != nil {
			return TemplateParameters{}, fmt.Errorf("get codertemplate %s/%s: %w", in.Namespace, in.Template, err)
		}
		if version = tpl.Status.ActiveVersionName; version == "" {
			return TemplateParameters{}, fmt.Errorf("template %s/%s has no active version yet (its first version is still building)", in.Namespace, in.Template)
		}
	}
	var v aggv1.CoderTemplateVersion
	name := in.Template + "." + version
	if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: in.Namespace, Name: name}, &v); err != nil {
		return TemplateParameters{}, fmt.Errorf("get codertemplateversion %s/%s: %w", in.Namespace, name, err)
	}
	if v.Status.BuildStatus != "succeeded" {
		return TemplateParameters{}, fmt.Errorf("template version %s/%s has not built (build status %q): its parameters are known once it has", in.Namespace, name, v.Status.BuildStatus)
	}
	out := TemplateParameters{Template: in.Template, Version: version, VersionID: v.Status.ID, Parameters: v.Status.Parameters, Presets: v.Status.Presets}
	if out.Parameters == nil {
		out.Parameters = []aggv1.TemplateParameter{}
	}
	return out, nil
}

func createWorkspace(ctx context.Context, c *call, in CreateWorkspaceInput) (WorkspaceDetail, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return WorkspaceDetail{}, err
	}
	if in.Template == "" {
		return WorkspaceDetail{}, fmt.Errorf("template is required: the template's name, as list_templates shows it after the organization")
	}
	w := &aggv1.CoderWorkspace{
		TypeMeta:   metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderWorkspace"},
		ObjectMeta: metav1.ObjectMeta{Namespace: in.Namespace, Name: in.Name},
		Spec:       aggv1.CoderWorkspaceSpec{TemplateName: in.Template, Running: !in.Stopped, Parameters: toSpecParameters(in.Parameters), Preset: in.Preset},
	}
	if err := c.kube.Direct.Create(ctx, w); err != nil {
		return WorkspaceDetail{}, fmt.Errorf("create coderworkspace %s/%s: %w", in.Namespace, in.Name, err)
	}
	return workspaceDetail(w), nil
}

func updateWorkspace(ctx context.Context, c *call, in UpdateWorkspaceInput) (UpdateWorkspaceResult, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return UpdateWorkspaceResult{}, err
	}
	if !in.ToActiveVersion && len(in.Parameters) == 0 && in.Preset == "" {
		return UpdateWorkspaceResult{}, fmt.Errorf("nothing to update: set toActiveVersion, parameters or preset")
	}
	w, err := c.getWorkspace(ctx, in.Namespace, in.Name)
	if err != nil {
		return UpdateWorkspaceResult{}, err
	}
	spec := map[string]any{}
	if in.ToActiveVersion {
		var tpl aggv1.CoderTemplate
		// The template's object name is the workspace's without owner and
		// workspace (Coder names have no dots), plus the template's.
		parts := strings.Split(w.Name, ".")
		name := strings.Join(append(parts[:len(parts)-2:len(parts)-2], w.Spec.TemplateName), ".")
		if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: in.Namespace, Name: name}, &tpl); err != nil {
			return UpdateWorkspaceResult{}, fmt.Errorf("get codertemplate %s/%s: %w", in.Namespace, name, err)
		}
		if tpl.Status.ActiveVersionID != w.Spec.TemplateVersionID {
			spec["templateVersionID"] = tpl.Status.ActiveVersionID
		}
	}
	cur := map[string]string{}
	for _, p := range w.Spec.Parameters {
		cur[p.Name] = p.Value
	}
	var changed []aggv1.WorkspaceParameter
	for _, p := range toSpecParameters(in.Parameters) {
		if v, ok := cur[p.Name]; !ok || v != p.Value {
			changed = append(changed, p)
		}
	}
	if len(changed) > 0 {
		spec["parameters"] = changed // left out, the others keep their values
	}
	if in.Preset != "" && in.Preset != w.Spec.Preset {
		spec["preset"] = in.Preset
	}
	if len(spec) == 0 {
		return UpdateWorkspaceResult{Workspace: workspaceDetail(w)}, nil
	}
	patch, err := json.Marshal(map[string]any{"spec": spec})
	if err != nil {
		return UpdateWorkspaceResult{}, err
	}
	if err := c.kube.Direct.Patch(ctx, w, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return UpdateWorkspaceResult{}, fmt.Errorf("update coderworkspace %s/%s: %w", in.Namespace, in.Name, err)
	}
	return UpdateWorkspaceResult{Workspace: workspaceDetail(w), Changed: true}, nil
}

// toSpecParameters is a name → value map as spec.parameters, in name
// order so the request does not depend on map order.
func toSpecParameters(m map[string]string) []aggv1.WorkspaceParameter {
	if len(m) == 0 {
		return nil
	}
	out := make([]aggv1.WorkspaceParameter, 0, len(m))
	for name, value := range m {
		out = append(out, aggv1.WorkspaceParameter{Name: name, Value: value})
	}
	slices.SortFunc(out, func(a, b aggv1.WorkspaceParameter) int { return strings.Compare(a.Name, b.Name) })
	return out
}
