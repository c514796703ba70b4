package storage

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// Templates build in the background. A create or file update uploads the
// files, creates the version and returns: no request waits for Coder's
// import. The version goes in the template's record (spec.build); the
// served object shows the files as applied and Ready=False reason
// Building, and the promoter (promoter.go) makes the version active once
// its import succeeds, or marks the build failed. A new template is
// created in Coder at once with its still-importing version (coderd v2.30
// accepts that), so its record is keyed by the template's UUID from the
// start.

// startBuild uploads files and creates a template version from them (of
// templateID, or of no template yet) without waiting for its import. It
// returns the version and the build record describing it.
//
// reuse, when not nil, is a file coderd already has with these files (a
// version of the same files with other variables or tags): it is used
// rather than uploading the files again, since coderd lets a user upload
// only 12 files a minute. Should the caller not be allowed that file, the
// files are uploaded after all.
func (s *TemplateStorage) startBuild(ctx context.Context, t target, orgID, templateID uuid.UUID, files map[string]string, vars appliedVariables, spec *aggv1.CoderTemplateSpec, name string, reuse uuid.UUID) (codersdk.TemplateVersion, *coderv1alpha1.TemplateBuildRecord, error) {
	create := func(fileID uuid.UUID) (codersdk.TemplateVersion, error) {
		return t.Client.CreateTemplateVersion(ctx, orgID, codersdk.CreateTemplateVersionRequest{
			TemplateID:    templateID,
			StorageMethod: codersdk.ProvisionerStorageMethodFile,
			FileID:        fileID,
			Provisioner:   codersdk.ProvisionerTypeTerraform,
			// Every variable the files declare, so that none is inherited
			// from the active version (template_variables.go).
			UserVariableValues: vars.values,
			Name:               spec.VersionName,
			Message:            spec.VersionMessage,
			ProvisionerTags:    spec.ProvisionerTags,
		})
	}
	var v codersdk.TemplateVersion
	var err error
	if reuse != uuid.Nil {
		v, err = create(reuse)
	}
	if code := coderapi.StatusCode(err); reuse == uuid.Nil || code == http.StatusNotFound || code == http.StatusForbidden {
		fileID, uerr := s.uploadFiles(ctx, &s.genericStore, t, files, name)
		if uerr != nil {
			return codersdk.TemplateVersion{}, nil, uerr
		}
		v, err = create(fileID)
	}
	if err != nil {
		if coderapi.StatusCode(err) == http.StatusConflict {
			// The name is taken (check refuses most such writes first).
			return v, nil, s.versionNameTaken(name, coderapi.Message(err))
		}
		return v, nil, s.requestErr(ctx, t, err, name, "coderd to create the template version")
	}
	b := &coderv1alpha1.TemplateBuildRecord{
		VersionID:     v.ID.String(),
		FilesHash:     templatesource.FilesHash(files),
		VariablesHash: vars.hash(),
		Organization:  orgID.String(),
		DisplayName:   spec.DisplayName,
		Description:   spec.Description,
		Icon:          spec.Icon,
		StartedAt:     metav1.NewTime(time.Now().Truncate(time.Second)),
	}
	return v, b, nil
}

// uploadFiles stores files in coderd for the object called name of r's
// kind: a file the limits refuse is a 422 naming its path.
func (s *TemplateStorage) uploadFiles(ctx context.Context, r *genericStore, t target, files map[string]string, name string) (uuid.UUID, error) {
	fileID, err := templatesource.Upload(ctx, t.Client, files, s.opts.Limits)
	if err != nil {
		var fe *templatesource.FileError
		if errors.As(err, &fe) {
			return uuid.Nil, r.invalid(name, field.ErrorList{field.Invalid(specPath.Child("files").Key(fe.Path), "", fe.Reason)})
		}
		return uuid.Nil, r.requestErr(ctx, t, err, name, "coderd to store the template files")
	}
	return fileID, nil
}

// previewCreate shows on dry, the object a dry-run create answers, the
// build the real create would show: from spec.files, a new version that
// is still to build (its name and ID exist only once it is created); from
// spec.versionID, that version as the active one, with its files.
func (s *TemplateStorage) previewCreate(ctx context.Context, t target, dry *aggv1.CoderTemplate) error {
	if len(dry.Spec.Files) > 0 {
		dry.Status.BuildStatus = string(codersdk.ProvisionerJobPending)
		setReady(dry, metav1.Condition{Type: aggv1.ConditionReady, Status: metav1.ConditionFalse, Reason: aggv1.ReasonBuilding,
			LastTransitionTime: dry.CreationTimestamp,
			Message:            "the files are uploaded and imported as a new template version (job pending), which is active once it builds (dry run: nothing was uploaded)"})
		return nil
	}
	id := uuid.MustParse(dry.Spec.VersionID) // validated
	_, err := s.orgs.get(ctx, t, dry.Spec.Organization)
	if err != nil {
		return s.coderErr(t, err, dry.Name)
	}
	var v codersdk.TemplateVersion
	if t.caller != nil {
		// As the caller, not from what the operator read: the real
		// create reads it as them.
		v, err = t.Client.TemplateVersion(ctx, id)
	} else {
		v, err = s.versions.get(ctx, t, id)
	}
	if err != nil {
		return s.coderErr(t, err, dry.Name)
	}
	if v.TemplateID != nil && *v.TemplateID != uuid.Nil {
		// coderd refuses it so (400), which the real create answers as
		// this Invalid status (coderstatus); coderd reports a version of
		// no template with the zero ID.
		errs := field.ErrorList{field.Invalid(specPath.Child("versionID"), field.OmitValueType{}, "Template version is already part of a template")}
		st := apierrors.NewInvalid(aggv1.SchemeGroupVersion.WithKind(s.kind).GroupKind(), dry.Name, errs)
		st.ErrStatus.Message = fmt.Sprintf("%s %q is invalid: Template version %s is already part of a template: %v",
			aggv1.SchemeGroupVersion.WithKind(s.kind).GroupKind(), dry.Name, id, errs.ToAggregate())
		return st
	}
	files, err := s.sources.Files(ctx, t.coderdKey(), t.Client, v.Job.FileID, s.opts.Limits)
	if err != nil {
		var fe *templatesource.FileError
		if !errors.As(err, &fe) {
			return s.coderErr(t, fmt.Errorf("source of template version %s: %w", id, err), dry.Name)
		}
		files = nil
	}
	dry.Spec.Files = files
	dry.Status.ActiveVersionID = id.String()
	showActive(dry, &v, dry.CreationTimestamp.Time)
	return nil
}

// requestErr is coderErr for a call the request made to coderd, except
// that a request whose own context ended (kube-apiserver's or
// k8s.io/apiserver's request timeout, or the client going away) gets a 504
// Timeout saying what it waited for: coderd was not necessarily at fault.
func (r *genericStore) requestErr(ctx context.Context, t target, err error, name, waitedFor string) error {
	if ctx.Err() != nil {
		return apierrors.NewTimeoutError(fmt.Sprintf("the request for %s %s ended (%v) while it waited for %s; retry it",
			r.kind, name, context.Cause(ctx), waitedFor), 0)
	}
	return r.coderErr(t, err, name)
}

// abandonVersion cancels the import of a version nothing will use (its
// template could not be created, or newer files replaced it), so that
// coderd's provisioners do not spend time on it. Best effort, and done
// even when the request that abandons it ends.
func (s *TemplateStorage) abandonVersion(ctx context.Context, t target, id uuid.UUID) {
	if id == uuid.Nil {
		return
	}
	if err := s.cancelImport(context.WithoutCancel(ctx), t, id); err != nil {
		s.log.V(1).Info("could not cancel an abandoned template version's import", "templateVersion", id.String(), "error", err.Error())
	}
}

// cancelImportTimeout bounds a request to cancel an import.
const cancelImportTimeout = 10 * time.Second

// cancelImport asks coderd to cancel template version id's import.
// coderd refuses (400) to cancel an import that has ended, which is no
// error here.
func (s *TemplateStorage) cancelImport(ctx context.Context, t target, id uuid.UUID) error {
	ctx, cancel := context.WithTimeout(ctx, cancelImportTimeout)
	defer cancel()
	if err := t.Client.CancelTemplateVersion(ctx, id); err != nil && coderapi.StatusCode(err) != http.StatusBadRequest {
		return fmt.Errorf("cancel the import of template version %s: %w", id, err)
	}
	return nil
}

// buildPlan is what a write does to the template's background build:
// set it to build (nil clears it) when set, else leave it; a new build
// records the variables applied to its version (vars), keeping those of
// the active version (keep) besides.
type buildPlan struct {
	set   bool
	build *coderv1alpha1.TemplateBuildRecord
	vars  []coderv1alpha1.TemplateVariableRecord
	keep  uuid.UUID
	// given, when set, is what the spec gave the version the template
	// shows after the write (template_identity.go), active being the
	// active version then.
	given  *coderv1alpha1.TemplateVersionGiven
	active uuid.UUID
}

// apply changes the record the write saves.
func (p buildPlan) apply(rec *records.Record) {
	if p.set {
		rec.Spec.Build = p.build.DeepCopy()
		if p.build != nil {
			withApplied(rec, p.build.VersionID, p.vars, p.keep)
		}
	}
	if p.given != nil {
		withGiven(rec, *p.given, p.active)
	}
}

// shownVersion is the version a template whose active version is active
// shows after the write: the one building, else the active one.
func (p buildPlan) shownVersion(prev *records.Record, active uuid.UUID) uuid.UUID {
	if b := p.shown(prev).Spec.Build; b != nil {
		if id, err := uuid.Parse(b.VersionID); err == nil {
			return id
		}
	}
	return active
}

// shown is the record whose build the write's answer shows: prev (nil:
// none yet) with the plan applied.
func (p buildPlan) shown(prev *records.Record) *records.Record {
	rec := &records.Record{}
	if prev != nil {
		rec = prev.DeepCopy()
	}
	p.apply(rec)
	return rec
}

// planFiles plans an update whose spec.files or spec.variables differ
// from those shown, vars being the variables resolved for it: it reuses
// the pending build or the active version when either has the same files
// and variables (uploading nothing), and otherwise starts a new build
// that replaces a pending or failed one. prev is the template's record
// (nil when none).
func (s *TemplateStorage) planFiles(ctx context.Context, t target, tpl *codersdk.Template, spec *aggv1.CoderTemplateSpec, vars appliedVariables, name string, prev *records.Record) (buildPlan, error) {
	hash, varsHash := templatesource.FilesHash(spec.Files), vars.hash()
	var pending *coderv1alpha1.TemplateBuildRecord
	if prev != nil {
		pending = prev.Spec.Build
	}
	// The pending version, when it has these files: reused as it is
	// with the same variables and tags, else its coderd file is.
	var building *codersdk.TemplateVersion
	if pending != nil && pending.FilesHash == hash {
		if id, err := uuid.Parse(pending.VersionID); err == nil {
			v, err := s.versions.get(ctx, t, id)
			switch {
			case err == nil:
				building = &v
			case !coderapi.IsNotFound(err): // deleted in Coder: build anew
				return buildPlan{}, s.requestErr(ctx, t, err, name, "coderd to return the building version")
			}
		}
	}
	if building != nil && pending.VariablesHash == varsHash && sameTags(building, spec) {
		// The same files, variables and tags again (a failed build
		// too: its files are what the object shows, so GitOps tools
		// see no drift to re-apply).
		return buildPlan{}, nil
	}
	active, err := s.versions.get(ctx, t, tpl.ActiveVersionID)
	if err != nil {
		return buildPlan{}, s.requestErr(ctx, t, err, name, "coderd to return the active version")
	}
	activeHash, err := s.filesHashOf(ctx, t, &active)
	if err != nil {
		return buildPlan{}, s.requestErr(ctx, t, err, name, "coderd to return the active version's source")
	}
	if activeHash == hash && sameTags(&active, spec) {
		same, err := s.activeHasVariables(ctx, t, tpl, prev, varsHash)
		if err != nil {
			return buildPlan{}, s.requestErr(ctx, t, err, name, "coderd to return the active version's variables")
		}
		if same {
			// Back to what is active: drop the build.
			return s.planDrop(ctx, t, prev), nil
		}
	}
	// A version of the same files (other variables or tags) lends its
	// coderd file.
	reuse := uuid.Nil
	switch {
	case activeHash == hash:
		reuse = active.Job.FileID
	case building != nil:
		reuse = building.Job.FileID
	}
	_, b, err := s.startBuild(ctx, t, tpl.OrganizationID, tpl.ID, spec.Files, vars, spec, name, reuse)
	if err != nil {
		return buildPlan{}, err
	}
	if pending != nil && !pending.Failed && pending.VersionID != b.VersionID {
		s.abandonVersion(ctx, t, uuid.MustParse(pending.VersionID))
	}
	return buildPlan{set: true, build: b, vars: vars.record, keep: tpl.ActiveVersionID}, nil
}

// activeHasVariables reports whether the active version of tpl has the
// variables whose variablesHash is varsHash: those applied to it through
// Kubernetes (rec's), or, for a version made in Coder, none listed and
// every variable at its default.
func (s *TemplateStorage) activeHasVariables(ctx context.Context, t target, tpl *codersdk.Template, rec *records.Record, varsHash string) (bool, error) {
	if a := appliedTo(rec, tpl.ActiveVersionID); a != nil {
		return variablesHash(a.Variables) == varsHash, nil
	}
	if varsHash != "" {
		return false, nil
	}
	v, err := s.versions.get(ctx, t, tpl.ActiveVersionID)
	if err != nil {
		return false, err
	}
	vars, err := s.vars.get(ctx, t, &v)
	if err != nil {
		return false, err
	}
	for _, cv := range vars {
		if cv.Sensitive || cv.Value != cv.DefaultValue {
			return false, nil
		}
	}
	return true, nil
}

// planDrop forgets the template's pending build (cancelling its import),
// because the request chose another version or went back to the active
// one's files.
func (s *TemplateStorage) planDrop(ctx context.Context, t target, prev *records.Record) buildPlan {
	if prev == nil || prev.Spec.Build == nil {
		return buildPlan{}
	}
	if !prev.Spec.Build.Failed {
		if id, err := uuid.Parse(prev.Spec.Build.VersionID); err == nil {
			s.abandonVersion(ctx, t, id)
		}
	}
	return buildPlan{set: true}
}

// filesHashOf is the FilesHash of version v's source, "" when it cannot
// be shown as spec.files.
func (s *TemplateStorage) filesHashOf(ctx context.Context, t target, v *codersdk.TemplateVersion) (string, error) {
	files, err := s.sources.Files(ctx, t.coderdKey(), t.Client, v.Job.FileID, s.opts.Limits)
	if err != nil {
		var fe *templatesource.FileError
		if errors.As(err, &fe) {
			return "", nil
		}
		return "", err
	}
	return templatesource.FilesHash(files), nil
}

// templateRecord reads a template's record (this server's own writes
// included); nil when there is none.
func (s *TemplateStorage) templateRecord(ctx context.Context, t target, templateID uuid.UUID) (*records.Record, error) {
	rec, err := s.records.get(ctx, s.recordKey(t, templateID.String()))
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	return rec, nil
}

// showBuild shows the template's background build on obj, its view of
// the Coder template tpl: spec.files as applied (the building version's
// files), status.buildingVersionID and the Ready condition. rec is the
// template's record (nil: none). It returns the building version whose
// files obj shows, nil when it shows the active version's.
func (s *TemplateStorage) showBuild(ctx context.Context, t target, tpl *codersdk.Template, obj *aggv1.CoderTemplate, rec *records.Record) (*codersdk.TemplateVersion, error) {
	var b *coderv1alpha1.TemplateBuildRecord
	if rec != nil {
		b = rec.Spec.Build
	}
	if b == nil {
		// The active version itself may still be importing (a template
		// made in Coder, or a record not saved yet).
		if buildInProgress(codersdk.ProvisionerJobStatus(obj.Status.BuildStatus)) {
			setReady(obj, metav1.Condition{Type: aggv1.ConditionReady, Status: metav1.ConditionFalse, Reason: aggv1.ReasonBuilding,
				Message:            fmt.Sprintf("the active version %s is building (job %s)", obj.Status.ActiveVersionName, obj.Status.BuildStatus),
				LastTransitionTime: readyCondition(obj).LastTransitionTime})
		}
		return nil, nil
	}
	id, err := uuid.Parse(b.VersionID)
	if err != nil {
		return nil, nil // not a record this server wrote
	}
	v, err := s.versions.get(ctx, t, id)
	if err != nil {
		if coderapi.IsNotFound(err) {
			// The version was deleted in Coder: nothing to show.
			return nil, nil
		}
		return nil, fmt.Errorf("building version %s of template %s: %w", id, tpl.Name, err)
	}
	files, err := s.sources.Files(ctx, t.coderdKey(), t.Client, v.Job.FileID, s.opts.Limits)
	if err != nil {
		var fe *templatesource.FileError
		if !errors.As(err, &fe) {
			return nil, fmt.Errorf("source of building version %s of template %s: %w", id, tpl.Name, err)
		}
		files = nil
	}
	obj.Spec.Files = files
	if id != tpl.ActiveVersionID || b.Failed {
		obj.Status.BuildingVersionID = b.VersionID
	}
	if c, ok := buildCondition(b, &v, tpl.ActiveVersionID); ok {
		setReady(obj, c)
	}
	return &v, nil
}

// buildCondition is the Ready condition of a template whose applied files
// build as version v (recorded as b) while activeID is active; false when
// the active version's own condition stands (v is active and built).
func buildCondition(b *coderv1alpha1.TemplateBuildRecord, v *codersdk.TemplateVersion, activeID uuid.UUID) (metav1.Condition, bool) {
	c := metav1.Condition{Type: aggv1.ConditionReady, Status: metav1.ConditionFalse, LastTransitionTime: b.StartedAt}
	if v.Job.CompletedAt != nil {
		c.LastTransitionTime = metav1.NewTime(v.Job.CompletedAt.Truncate(time.Second))
	}
	stays := ""
	if v.ID != activeID {
		stays = "; the active version " + activeID.String() + " stays active"
	}
	failed := b.Failed || v.Job.Status == codersdk.ProvisionerJobFailed || v.Job.Status == codersdk.ProvisionerJobCanceled
	switch {
	case failed:
		msg := b.Error
		if msg == "" {
			msg = v.Job.Error
		}
		if msg == "" {
			msg = "the import ended with status " + string(v.Job.Status)
		}
		c.Reason = aggv1.ReasonBuildFailed
		c.Message = fmt.Sprintf("template version %s (%s) did not build: %s%s", v.Name, v.ID, msg, stays)
		if b.Log != "" {
			c.Message += "\nlast log lines:\n" + b.Log
		}
	case v.Job.Status == codersdk.ProvisionerJobSucceeded && v.ID == activeID:
		return c, false
	case v.Job.Status == codersdk.ProvisionerJobSucceeded:
		c.Reason = aggv1.ReasonBuilding
		c.Message = fmt.Sprintf("template version %s (%s) built; it is being made the active version", v.Name, v.ID)
	default:
		c.Reason = aggv1.ReasonBuilding
		c.LastTransitionTime = b.StartedAt
		c.Message = fmt.Sprintf("template version %s (%s) is building (job %s)%s%s", v.Name, v.ID, v.Job.Status, waitingFor(v), stays)
	}
	return c, true
}

// readyCondition returns obj's Ready condition (toTemplate always sets
// one).
func readyCondition(obj *aggv1.CoderTemplate) metav1.Condition {
	for _, c := range obj.Status.Conditions {
		if c.Type == aggv1.ConditionReady {
			return c
		}
	}
	return metav1.Condition{}
}

// setReady replaces obj's Ready condition.
func setReady(obj *aggv1.CoderTemplate, c metav1.Condition) {
	for i := range obj.Status.Conditions {
		if obj.Status.Conditions[i].Type == aggv1.ConditionReady {
			c.ObservedGeneration = obj.Status.Conditions[i].ObservedGeneration
			obj.Status.Conditions[i] = c
			return
		}
	}
	obj.Status.Conditions = append(obj.Status.Conditions, c)
}
