package storage

import (
	"context"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// Creating a template: the checks of a new object (its name, its source
// and settings), what a create shows before coderd is asked, and the
// calls that make it in Coder (or, on a dry run, check it as the real
// create would).

// validateCreate checks a new template before coderd is asked: its
// name, its source (spec.files or spec.versionID), settings and variables.
func (s *TemplateStorage) validateCreate(tpl *aggv1.CoderTemplate) (templateObjectName, field.ErrorList) {
	if tpl.Name == "" && tpl.GenerateName != "" {
		return templateObjectName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names map to Coder objects; give metadata.name")}
	}
	n, err := parseTemplateName(tpl.Name)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, tpl.Name, err.Error())}
	}
	var errs field.ErrorList
	if strings.Contains(n.Name, "_") {
		// Older coderd versions allowed underscores, so such templates
		// can be read; coderd refuses them for new templates.
		errs = append(errs, field.Invalid(namePath, tpl.Name, "new Coder template names use letters, digits and single hyphens"))
	}
	if tpl.Spec.Organization != "" && tpl.Spec.Organization != n.Org {
		errs = append(errs, field.Invalid(specPath.Child("organization"), tpl.Spec.Organization, "must match the organization in the name ("+n.Org+")"))
	}
	switch {
	case len(tpl.Spec.Files) > 0 && tpl.Spec.VersionID != "":
		errs = append(errs, field.Forbidden(specPath.Child("versionID"), "give either spec.files (a new version) or spec.versionID (an existing one)"))
	case len(tpl.Spec.Files) > 0:
		errs = append(errs, templatesource.Validate(tpl.Spec.Files, s.opts.Limits, specPath.Child("files"))...)
	case tpl.Spec.VersionID != "":
		if _, err := uuid.Parse(tpl.Spec.VersionID); err != nil {
			errs = append(errs, field.Invalid(specPath.Child("versionID"), tpl.Spec.VersionID, "must be a template version ID (a UUID)"))
		}
	default:
		errs = append(errs, field.Required(specPath.Child("files"), "a new template needs its source files (or spec.versionID of an existing version)"))
	}
	errs = append(errs, validateSettings(&tpl.Spec, nil)...)
	errs = append(errs, validateVariables(tpl.Spec.Variables)...)
	errs = append(errs, validateVersionIdentity(&tpl.Spec)...)
	if len(tpl.Spec.ProvisionerTags) > 0 && len(tpl.Spec.Files) == 0 {
		errs = append(errs, field.Forbidden(provisionerTagPath, "tags are given to the version spec.files builds; an existing version (spec.versionID) keeps its own"))
	}
	if len(tpl.Spec.Variables) > 0 && len(tpl.Spec.Files) == 0 {
		errs = append(errs, field.Forbidden(variablesPath, "variables are given to the version spec.files builds; an existing version (spec.versionID) keeps its own"))
	}
	return n, errs
}

// Create uploads the files and creates the template with the new version
// while it still imports (the promoter follows its build); or creates it
// from an existing version.
func (s *TemplateStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	return createObject(ctx, s, obj, createValidation, opts)
}

func (s *TemplateStorage) createdView(tpl *aggv1.CoderTemplate, t target, n templateObjectName) *aggv1.CoderTemplate {
	dry := tpl.DeepCopy()
	dry.Namespace = t.Namespace
	dry.Spec.Organization = n.Org
	dry.Labels = objectLabels(t, n.Org, map[string]string{aggv1.LabelTemplate: n.Name})
	dry.CreationTimestamp = metav1.Now()
	dry.Status = aggv1.CoderTemplateStatus{Organization: n.Org}
	return dry
}

// planCreate finds the organization; a dry run makes the real create's
// checks instead, in the order the real create meets them. Both first
// refuse licensed settings coderd cannot honour.
func (s *TemplateStorage) planCreate(ctx context.Context, t target, n templateObjectName, tpl, dry *aggv1.CoderTemplate, dryRun bool) (createCall, error) {
	defaults, err := s.checkCreateSettings(ctx, t, tpl, dryRun)
	if err != nil {
		return nil, err
	}
	var access accessIDs
	if accessDiffers(&tpl.Spec, &defaults) {
		// Before anything reaches coderd: a user or group Coder does not
		// know refuses the create.
		orgID, err := s.orgs.get(ctx, t, n.Org)
		if err != nil {
			return nil, s.coderErr(t, err, tpl.Name)
		}
		if access, err = s.resolveAccess(ctx, t, orgID, tpl.Spec.Access, tpl.Name); err != nil {
			return nil, err
		}
	}
	var vars appliedVariables
	if len(tpl.Spec.Files) > 0 {
		// Before anything reaches coderd: a variable the caller may not
		// read, or that the files do not declare, refuses the create.
		if vars, err = s.resolveVariables(ctx, t, &tpl.Spec, tpl.Name); err != nil {
			return nil, err
		}
	}
	if dryRun {
		keepSettings(&dry.Spec, &defaults)
		orgID, err := s.orgs.get(ctx, t, n.Org)
		if err != nil {
			return nil, s.coderErr(t, err, tpl.Name)
		}
		may := func() error {
			return s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionCreate, OrganizationID: orgID}, tpl.Name)
		}
		if len(tpl.Spec.Files) > 0 {
			// The real create stores a version as the caller (refused
			// unless they may create templates), then the template.
			if err := may(); err != nil {
				return nil, err
			}
			if err := s.nameTaken(ctx, t, orgID, n, tpl.Name); err != nil {
				return nil, err
			}
			return nil, s.previewCreate(ctx, t, dry)
		}
		// From spec.versionID, in coderd's order
		// (postTemplateByOrganization): the name, then the version, read
		// as the caller, and only then whether they may create, so that a
		// member naming another template's version is told what the real
		// create tells them.
		if err := s.nameTaken(ctx, t, orgID, n, tpl.Name); err != nil {
			return nil, err
		}
		if err := s.previewCreate(ctx, t, dry); err != nil {
			return nil, err
		}
		return nil, may()
	}
	orgID, err := s.orgs.get(ctx, t, n.Org)
	if err != nil {
		return nil, s.coderErr(t, err, tpl.Name)
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		var versionID uuid.UUID
		var build *coderv1alpha1.TemplateBuildRecord
		if len(tpl.Spec.Files) > 0 {
			v, b, err := s.startBuild(ctx, t, orgID, uuid.Nil, tpl.Spec.Files, vars, &tpl.Spec, tpl.Name, uuid.Nil)
			if err != nil {
				return nil, nil, err
			}
			versionID, build = v.ID, b
		} else {
			versionID = uuid.MustParse(tpl.Spec.VersionID) // validated
		}
		req := codersdk.CreateTemplateRequest{
			Name:        n.Name,
			DisplayName: tpl.Spec.DisplayName,
			Description: tpl.Spec.Description,
			Icon:        tpl.Spec.Icon,
			VersionID:   versionID,
		}
		setCreate(&req, &tpl.Spec, &defaults)
		// A list without Everyone: the template is never usable by every
		// member, not even until accessCreated sets the list.
		req.DisableEveryoneGroupAccess = tpl.Spec.Access != nil && tpl.Spec.Access.Everyone == ""
		created, err := t.Client.CreateTemplate(ctx, orgID, req)
		if err != nil {
			if build != nil {
				s.abandonVersion(ctx, t, versionID)
			}
			if ctx.Err() != nil {
				return nil, nil, s.requestErr(ctx, t, err, tpl.Name, "coderd to create the template")
			}
			return nil, nil, s.createErr(t, err, tpl.Name)
		}
		s.deprecateCreated(ctx, t, &created, &tpl.Spec)
		s.accessCreated(ctx, t, &created, &tpl.Spec, access)
		if build == nil {
			// An existing version takes the name and message given.
			if err := s.identify(ctx, t, versionID, tpl.Spec.VersionName, tpl.Spec.VersionMessage, tpl.Name); err != nil {
				return nil, nil, err
			}
		}
		// The record does not exist yet: show the build the write records.
		plan := buildPlan{set: build != nil, build: build, given: given(versionID, &tpl.Spec), active: versionID}
		if build != nil {
			plan.vars = vars.record
		}
		out, err := s.readCoder(ctx, t, n, tpl.Name, plan.shown(nil))
		if err != nil {
			return nil, nil, err
		}
		return out, plan.apply, nil
	}, nil
}

// nameTaken is the 409 the real create gets from coderd when the
// organization has a template of that name the caller can see.
func (s *TemplateStorage) nameTaken(ctx context.Context, t target, orgID uuid.UUID, n templateObjectName, name string) error {
	_, err := t.Client.TemplateByName(ctx, orgID, n.Name)
	switch {
	case err == nil:
		return apierrors.NewAlreadyExists(s.gr, name)
	case coderapi.IsNotFound(err):
		return nil
	}
	return s.coderErr(t, err, name)
}
