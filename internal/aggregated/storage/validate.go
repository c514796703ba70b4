package storage

import (
	"fmt"
	"slices"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

var (
	specPath = field.NewPath("spec")
	namePath = field.NewPath("metadata", "name")
)

// validateWorkspaceCreate checks a new workspace and returns its parsed
// name.
func validateWorkspaceCreate(ws *aggv1.CoderWorkspace) (workspaceName, field.ErrorList) {
	var errs field.ErrorList
	if ws.Name == "" && ws.GenerateName != "" {
		return workspaceName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names map to Coder objects; give metadata.name")}
	}
	n, err := parseWorkspaceName(ws.Name)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, ws.Name, err.Error())}
	}
	if ws.Spec.Organization != "" && ws.Spec.Organization != n.Org {
		errs = append(errs, field.Invalid(specPath.Child("organization"), ws.Spec.Organization, "must match the organization in the name ("+n.Org+")"))
	}
	if ws.Spec.TemplateName == "" {
		errs = append(errs, field.Required(specPath.Child("templateName"), "the template to build the workspace from"))
	}
	errs = append(errs, validateWorkspaceSpec(&ws.Spec)...)
	return n, errs
}

// validateWorkspaceUpdate checks an update against the current object.
func validateWorkspaceUpdate(next, cur *aggv1.CoderWorkspace, name string) field.ErrorList {
	errs := validateSameObject("workspace", name, next.Name, cur.Spec.Organization, next.Spec.Organization)
	if next.Spec.TemplateName != cur.Spec.TemplateName {
		errs = append(errs, field.Forbidden(specPath.Child("templateName"), "a workspace cannot move to another template; pick a version of "+cur.Spec.TemplateName+" with spec.templateVersionID"))
	}
	errs = append(errs, validateWorkspaceSpec(&next.Spec)...)
	return errs
}

func validateWorkspaceSpec(s *aggv1.CoderWorkspaceSpec) field.ErrorList {
	var errs field.ErrorList
	if s.TemplateVersionID != "" {
		if _, err := uuid.Parse(s.TemplateVersionID); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("templateVersionID"), s.TemplateVersionID, "must be a template version ID (a UUID)"))
		}
	}
	if s.TTLMillis != nil && *s.TTLMillis < 0 {
		errs = append(errs, field.Invalid(specPath.Child("ttlMillis"), *s.TTLMillis, "must not be negative"))
	}
	switch codersdk.AutomaticUpdates(s.AutomaticUpdates) {
	case "", codersdk.AutomaticUpdatesAlways, codersdk.AutomaticUpdatesNever:
	default:
		errs = append(errs, field.NotSupported(specPath.Child("automaticUpdates"), s.AutomaticUpdates, []string{string(codersdk.AutomaticUpdatesAlways), string(codersdk.AutomaticUpdatesNever)}))
	}
	seen := map[string]bool{}
	for i, p := range s.Parameters {
		fp := specPath.Child("parameters").Index(i)
		if p.Name == "" {
			errs = append(errs, field.Required(fp.Child("name"), ""))
		} else if seen[p.Name] {
			errs = append(errs, field.Duplicate(fp.Child("name"), p.Name))
		}
		seen[p.Name] = true
	}
	return errs
}

// validateTemplateUpdate checks an update against the current object.
func validateTemplateUpdate(next, cur *aggv1.CoderTemplate, name string) field.ErrorList {
	errs := validateSameObject("template", name, next.Name, cur.Spec.Organization, next.Spec.Organization)
	if next.Spec.VersionID != "" {
		if _, err := uuid.Parse(next.Spec.VersionID); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("versionID"), next.Spec.VersionID, "must be a template version ID (a UUID)"))
		}
	}
	if next.Spec.VersionID != cur.Spec.VersionID && next.Spec.VersionID != "" && !apiequality.Semantic.DeepEqual(next.Spec.Files, cur.Spec.Files) && next.Spec.Files != nil {
		errs = append(errs, field.Forbidden(specPath.Child("versionID"), "change either spec.files (which uploads a new version) or spec.versionID (which promotes an existing one), not both"))
	}
	errs = append(errs, validateSettings(&next.Spec, &cur.Spec)...)
	return errs
}

// validateSameObject checks what an update of a what ("workspace",
// "template") cannot change: the name, which is the Coder object's
// identity and must match the URL's, and the organization (an empty
// spec.organization keeps it).
func validateSameObject(what, name, nextName, curOrg, nextOrg string) field.ErrorList {
	var errs field.ErrorList
	if nextName != name {
		errs = append(errs, field.Invalid(namePath, nextName, "must match the name in the URL ("+name+")"))
	}
	if nextOrg != "" && nextOrg != curOrg {
		errs = append(errs, field.Forbidden(specPath.Child("organization"), "a "+what+" cannot move to another organization"))
	}
	return errs
}

// checkInNameOrder refuses a set whose names are not in order. coderd
// keeps no order for role sets, members and access entries, so a read
// shows them sorted; a write in another order would read back changed,
// and a GitOps tool comparing lists in order would see drift forever.
func checkInNameOrder(p *field.Path, names []string) *field.Error {
	if slices.IsSorted(names) {
		return nil
	}
	return field.Invalid(p, names, fmt.Sprintf("list them in name order (%s): Coder keeps no order, so reads show them sorted", strings.Join(slices.Sorted(slices.Values(names)), ", ")))
}
