package storage

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// Writes of template versions. A create uploads a staging version that
// builds in the background and is never promoted (CoderTemplate's
// spec.versionName or spec.versionID promotes); an update changes only
// spec.message (a version's files, variables and tags are what coderd
// built, and its name is the object's name, which Kubernetes never
// changes); a delete archives it in Coder.

// versionCreate is the strategy of one create: the version storage, with
// how the request's namespace reads names (a version name may contain
// dots, so a name alone does not say whether it starts with a control
// plane).
type versionCreate struct {
	*TemplateVersionStorage
	prefixed bool
}

func (c versionCreate) validateCreate(v *aggv1.CoderTemplateVersion) (templateVersionName, field.ErrorList) {
	return c.validateNew(v, c.prefixed)
}

// Create uploads the files and creates the version in its template; it
// returns at once, while the version builds.
func (s *TemplateVersionStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	prefixed, err := s.prefixedNamespace(ctx)
	if err != nil {
		return nil, err
	}
	return createObject(ctx, versionCreate{s, prefixed}, obj, createValidation, opts)
}

// validateCreate reads names as a namespace with one control plane does;
// Create validates through versionCreate, which knows the namespace.
func (s *TemplateVersionStorage) validateCreate(v *aggv1.CoderTemplateVersion) (templateVersionName, field.ErrorList) {
	return s.validateNew(v, false)
}

// validateNew checks a new version before coderd is asked: its name, the
// organization and template agreeing with it, the files and variables.
func (s *TemplateVersionStorage) validateNew(v *aggv1.CoderTemplateVersion, prefixed bool) (templateVersionName, field.ErrorList) {
	if v.Name == "" && v.GenerateName != "" {
		return templateVersionName{}, field.ErrorList{field.Forbidden(field.NewPath("metadata", "generateName"), "names map to Coder objects; give metadata.name")}
	}
	n, err := parseTemplateVersionName(v.Name, prefixed)
	if err != nil {
		return n, field.ErrorList{field.Invalid(namePath, v.Name, err.Error())}
	}
	var errs field.ErrorList
	if v.Spec.Organization != "" && v.Spec.Organization != n.Org {
		errs = append(errs, field.Invalid(specPath.Child("organization"), v.Spec.Organization, "must match the organization in the name ("+n.Org+")"))
	}
	if v.Spec.Template != "" && v.Spec.Template != n.Template {
		errs = append(errs, field.Invalid(specPath.Child("template"), v.Spec.Template, "must match the template in the name ("+n.Template+")"))
	}
	if len(v.Spec.Files) == 0 {
		errs = append(errs, field.Required(specPath.Child("files"), "a new template version needs its source files"))
	} else {
		errs = append(errs, templatesource.Validate(v.Spec.Files, s.tpls.opts.Limits, specPath.Child("files"))...)
	}
	errs = append(errs, validateVariables(v.Spec.Variables)...)
	errs = append(errs, validateProvisionerTags(v.Spec.ProvisionerTags)...)
	return n, errs
}

func (s *TemplateVersionStorage) createdView(v *aggv1.CoderTemplateVersion, t target, n templateVersionName) *aggv1.CoderTemplateVersion {
	dry := v.DeepCopy()
	dry.Namespace = t.Namespace
	dry.Spec.Organization, dry.Spec.Template = n.Org, n.Template
	dry.Labels = objectLabels(t, n.Org, map[string]string{aggv1.LabelTemplate: n.Template})
	dry.CreationTimestamp = metav1.Now()
	dry.Status = aggv1.CoderTemplateVersionStatus{}
	return dry
}

// planCreate makes the checks the real create meets (the template exists
// for the caller, the variables' Secrets may be read, the name is free)
// and returns the create; a dry run then asks coderd whether the caller
// may update the template and completes dry instead.
func (s *TemplateVersionStorage) planCreate(ctx context.Context, t target, n templateVersionName, v, dry *aggv1.CoderTemplateVersion, dryRun bool) (createCall, error) {
	orgID, err := s.tpls.orgs.get(ctx, t, n.Org)
	if err != nil {
		return nil, s.coderErr(t, err, v.Name)
	}
	tpl, err := t.Client.TemplateByName(ctx, orgID, n.Template)
	if err != nil {
		if coderapi.IsNotFound(err) {
			return nil, s.notFound(v.Name, fmt.Sprintf("organization %s has no template %s", n.Org, n.Template))
		}
		return nil, s.coderErr(t, err, v.Name)
	}
	vars, err := s.tpls.resolveVariablesOf(ctx, &s.genericStore, t, v.Spec.Files, v.Spec.Variables, v.Name)
	if err != nil {
		return nil, err
	}
	// coderd's names are unique per template, archived versions
	// included (its 409 on create).
	if err := s.nameTaken(ctx, t, tpl.ID, n, v.Name); err != nil {
		return nil, err
	}
	if dryRun {
		// coderd authorizes a version of a template as an update of it
		// (dbauthz InsertTemplateVersion).
		if err := s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceTemplate, Action: codersdk.ActionUpdate, ResourceID: tpl.ID}, v.Name); err != nil {
			return nil, err
		}
		me, err := t.Client.User(ctx, codersdk.Me)
		if err != nil {
			return nil, s.coderErr(t, err, v.Name)
		}
		dry.Status = aggv1.CoderTemplateVersionStatus{TemplateID: tpl.ID.String(), OrganizationID: orgID.String(), CreatedBy: me.Username,
			CreatedAt: &dry.CreationTimestamp, BuildStatus: string(codersdk.ProvisionerJobPending)}
		dry.Status.Conditions = []metav1.Condition{{Type: aggv1.ConditionReady, Status: metav1.ConditionFalse, Reason: aggv1.ReasonBuilding,
			LastTransitionTime: dry.CreationTimestamp, Message: "the version's import is pending (dry run: nothing was uploaded)"}}
		return nil, nil
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		fileID, err := s.tpls.uploadFiles(ctx, &s.genericStore, t, v.Spec.Files, v.Name)
		if err != nil {
			return nil, nil, err
		}
		created, err := t.Client.CreateTemplateVersion(ctx, orgID, codersdk.CreateTemplateVersionRequest{
			Name:            n.Version,
			Message:         v.Spec.Message,
			TemplateID:      tpl.ID,
			StorageMethod:   codersdk.ProvisionerStorageMethodFile,
			FileID:          fileID,
			Provisioner:     codersdk.ProvisionerTypeTerraform,
			ProvisionerTags: v.Spec.ProvisionerTags,
			// Every declared variable, so that none is inherited from the
			// active version (template_variables.go).
			UserVariableValues: vars.values,
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil, s.requestErr(ctx, t, err, v.Name, "coderd to create the template version")
			}
			return nil, nil, s.createRefused(t, err, v.Name)
		}
		applied := func(rec *records.Record) { withApplied(rec, created.ID.String(), vars.record, uuid.Nil) }
		shown := &records.Record{}
		applied(shown)
		out, err := s.convert(ctx, t, &tpl, &created, shown)
		if err != nil {
			return nil, nil, s.coderErr(t, err, v.Name)
		}
		return out, applied, nil
	}, nil
}

// createRefused is createErr for a version's create. coderd v2.30
// answers a caller who may not update the template with a 500 whose
// detail is dbauthz's "unauthorized: rbac: forbidden"
// (postTemplateVersionsByOrganization does not map it), which is the 403
// it means here, naming the caller as coderErr does.
func (s *TemplateVersionStorage) createRefused(t target, err error, name string) error {
	if coderapi.StatusCode(err) == http.StatusInternalServerError && strings.Contains(err.Error(), "rbac: forbidden") {
		who := "coder-k8s"
		if t.caller != nil {
			who = fmt.Sprintf("Coder user %q", t.caller.Username)
		}
		return apierrors.NewForbidden(s.gr, name, &identity.Refused{Reason: fmt.Sprintf("coderd of %s refused %s: they may not add versions to the template (coderd: %s)",
			t.describe(), who, coderapi.Message(err))})
	}
	return s.createErr(t, err, name)
}

// nameTaken is the 409 the real create gets from coderd when the
// template has a version of that name (archived ones too).
func (s *TemplateVersionStorage) nameTaken(ctx context.Context, t target, templateID uuid.UUID, n templateVersionName, name string) error {
	v, err := t.Client.TemplateVersionByName(ctx, templateID, n.Version)
	switch {
	case err == nil:
		st := apierrors.NewAlreadyExists(s.gr, name)
		if v.Archived {
			st.ErrStatus.Message += fmt.Sprintf(" (an archived version of template %s has the name %s; Coder keeps version names unique, archived ones included)", n.Template, n.Version)
		}
		return st
	case coderapi.IsNotFound(err):
		return nil
	}
	return s.coderErr(t, err, name)
}

// Update changes the version's message (or only its Kubernetes
// metadata). With forceAllowCreate (server-side apply) a missing version
// is created.
func (s *TemplateVersionStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

// immutableVersion says what cannot change and what to do instead.
const immutableVersion = "a template version's files, variables and provisioner tags are what coderd built and cannot change; create a new CoderTemplateVersion (delete this one to archive it). Its name is its object name: rename it in Coder (PATCH /api/v2/templateversions/{id} with a new name), and it is served under that name"

func (s *TemplateVersionStorage) validateUpdate(next, cur *aggv1.CoderTemplateVersion, name string) field.ErrorList {
	errs := validateSameObject("template version", name, next.Name, cur.Spec.Organization, next.Spec.Organization)
	if next.Spec.Template != "" && next.Spec.Template != cur.Spec.Template {
		errs = append(errs, field.Forbidden(specPath.Child("template"), "a template version cannot move to another template"))
	}
	// Unset files or tags keep what is shown: a caller who may not see
	// the files writes the object without them.
	if next.Spec.Files != nil && !maps.Equal(next.Spec.Files, cur.Spec.Files) {
		errs = append(errs, field.Forbidden(specPath.Child("files"), immutableVersion))
	}
	if !sameVariables(next.Spec.Variables, cur.Spec.Variables) {
		errs = append(errs, field.Forbidden(variablesPath, immutableVersion))
	}
	if next.Spec.ProvisionerTags != nil && !maps.Equal(next.Spec.ProvisionerTags, cur.Spec.ProvisionerTags) {
		errs = append(errs, field.Forbidden(specPath.Child("provisionerTags"), immutableVersion))
	}
	return errs
}

// planUpdate changes the message in Coder (PATCH
// /api/v2/templateversions/{id}) as the caller.
func (s *TemplateVersionStorage) planUpdate(n templateVersionName, name string, cur, next *aggv1.CoderTemplateVersion) specUpdate {
	u := specUpdate{changed: next.Spec.Message != cur.Spec.Message}
	u.apply = func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		msg := next.Spec.Message
		if _, err := w.t.Client.UpdateTemplateVersion(ctx, versionID(cur), codersdk.PatchTemplateVersionRequest{Message: &msg}); err != nil {
			return nil, nil, s.coderErr(w.t, err, name)
		}
		out, err := s.readCoder(ctx, w.t, n, name, nil)
		return out, nil, err
	}
	return u
}

// releaseDelete archives the version: the last finalizer holding its
// deletion is gone.
func (s *TemplateVersionStorage) releaseDelete(ctx context.Context, w *write, _ templateVersionName, name string, cur, next *aggv1.CoderTemplateVersion, dryRun bool) (runtime.Object, error) {
	return releaseAtOnce(ctx, w, cur, next, dryRun, func(ctx context.Context) error { return s.archive(ctx, w.t, cur, name) })
}

// Delete archives the version in Coder. coderd refuses to archive the
// active version, or one a workspace's latest build uses: 409.
func (s *TemplateVersionStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	validate := func(ctx context.Context, obj runtime.Object) error {
		// Refused before anything is asked, so that a dry run answers
		// the real delete's 409.
		if v := obj.(*aggv1.CoderTemplateVersion); v.Status.Active {
			return s.archiveRefused(name, fmt.Sprintf("version %s is the active version of template %s; promote another version first", v.Name, v.Spec.Template))
		}
		if deleteValidation != nil {
			return deleteValidation(ctx, obj)
		}
		return nil
	}
	return deleteObject(ctx, s, name, validate, opts)
}

func (s *TemplateVersionStorage) deleteInCoder(ctx context.Context, w *write, _ templateVersionName, name string, cur *aggv1.CoderTemplateVersion) (runtime.Object, bool, error) {
	return deleteAtOnce(ctx, w, cur, func(ctx context.Context) error { return s.archive(ctx, w.t, cur, name) })
}

// archive archives cur in Coder and drops it from the watch cache.
// coderd v2.30 answers a version it will not archive (active, or used by
// a workspace) with a 500 (setArchiveTemplateVersion: "Unable to archive
// specified version..."), which is a 409 here with its message; and one
// already archived with a 400, which is the NotFound of a version no
// longer served.
func (s *TemplateVersionStorage) archive(ctx context.Context, t target, cur *aggv1.CoderTemplateVersion, name string) error {
	err := t.Client.SetArchiveTemplateVersion(ctx, versionID(cur), true)
	switch {
	case err == nil:
	case coderapi.StatusCode(err) == http.StatusInternalServerError && strings.Contains(coderapi.Message(err), "Unable to archive"):
		return s.archiveRefused(name, coderapi.Message(err))
	case coderapi.StatusCode(err) == http.StatusBadRequest && strings.Contains(coderapi.Message(err), "already archived"):
		s.cache.Delete(t.Key(), name)
		return s.notFound(name, "the version is archived")
	default:
		return s.coderErr(t, err, name)
	}
	s.cache.Delete(t.Key(), name)
	return nil
}

// archiveRefused is the 409 of a version Coder will not archive.
func (s *TemplateVersionStorage) archiveRefused(name, why string) error {
	return apierrors.NewConflict(s.gr, name, fmt.Errorf("coderd does not archive it: %s", why))
}
