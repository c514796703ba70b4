package storage

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// A template's version identity: spec.versionName, spec.versionMessage
// and spec.provisionerTags describe the version spec.files builds (the
// building one while a build is under way, else the active one).
//
// Name and message are read back only when the spec gave them (the
// record's spec.versions says so): were Coder's generated name always
// shown, a server-side apply that leaves the field out would carry it
// into the next apply's new files, and coderd refuses a second version of
// one name. The tags are always read from Coder (without the owner and
// scope coderd adds to every version), since a carried-over tag set is
// what the new version would get anyway.

var (
	versionNamePath    = specPath.Child("versionName")
	versionMessagePath = specPath.Child("versionMessage")
	provisionerTagPath = specPath.Child("provisionerTags")
)

// The tags coderd gives every version (provisionersdk.MutateTags, not
// imported for four strings: it pulls in the provisioner's dependencies).
const (
	tagOwner          = "owner"
	tagScope          = "scope"
	scopeOrganization = "organization"
	scopeUser         = "user"
)

// validateVersionIdentity checks spec's version name and tags as coderd
// would, before anything is uploaded.
func validateVersionIdentity(spec *aggv1.CoderTemplateSpec) field.ErrorList {
	var errs field.ErrorList
	if spec.VersionName != "" {
		if err := codersdk.TemplateVersionNameValid(spec.VersionName); err != nil {
			errs = append(errs, field.Invalid(versionNamePath, spec.VersionName, "a Coder template version name "+err.Error()))
		}
	}
	if len(spec.VersionMessage) > 1<<20 {
		errs = append(errs, field.TooLong(versionMessagePath, "", 1<<20))
	}
	return append(errs, validateProvisionerTags(spec.ProvisionerTags)...)
}

// validateProvisionerTags refuses the tags coderd would not keep as
// given, so that they read back as written.
func validateProvisionerTags(tags map[string]string) field.ErrorList {
	var errs field.ErrorList
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		v := tags[k]
		fp := provisionerTagPath.Key(k)
		switch {
		case k == "":
			errs = append(errs, field.Invalid(fp, k, "a tag needs a key"))
		case k == tagOwner:
			errs = append(errs, field.Forbidden(fp, "coderd sets the owner tag itself (from scope)"))
		case k == tagScope && v != scopeUser:
			errs = append(errs, field.NotSupported(fp, v, []string{scopeUser}))
		case v == "":
			// coderd drops a tag with an empty value, so it could not be
			// read back.
			errs = append(errs, field.Invalid(fp, v, "must not be empty: coderd drops empty tags"))
		}
	}
	return errs
}

// givenTags is what spec.provisionerTags shows of a version's tags: those
// coderd did not add by default.
func givenTags(tags map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range tags {
		switch {
		case k == tagOwner:
		case k == tagScope && v == scopeOrganization:
		default:
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// sameTags reports whether version v has the tags spec gives.
func sameTags(v *codersdk.TemplateVersion, spec *aggv1.CoderTemplateSpec) bool {
	return maps.Equal(givenTags(v.Job.Tags), spec.ProvisionerTags)
}

// waitingFor says why a pending import waits, when coderd knows: no
// provisioner daemon has its tags, or none of those is available.
func waitingFor(v *codersdk.TemplateVersion) string {
	m := v.MatchedProvisioners
	if v.Job.Status != codersdk.ProvisionerJobPending || m == nil {
		return ""
	}
	tags := make([]string, 0, len(v.Job.Tags))
	for _, k := range slices.Sorted(maps.Keys(v.Job.Tags)) {
		tags = append(tags, k+"="+v.Job.Tags[k])
	}
	switch {
	case m.Count == 0:
		return fmt.Sprintf(": no provisioner daemon has its tags (%s), so the import waits until one does", strings.Join(tags, " "))
	case m.Available == 0:
		return fmt.Sprintf(": the %d provisioner daemons with its tags (%s) are busy or have not been seen lately", m.Count, strings.Join(tags, " "))
	}
	return ""
}

// givenTo is what rec says the spec gave version id (nil: nothing).
func givenTo(rec *records.Record, id uuid.UUID) *coderv1alpha1.TemplateVersionGiven {
	if rec == nil {
		return nil
	}
	for i := range rec.Spec.Versions {
		if rec.Spec.Versions[i].VersionID == id.String() {
			return &rec.Spec.Versions[i]
		}
	}
	return nil
}

// withGiven records g in rec, keeping besides only the entries of the
// versions the template can still show: active and the one building.
func withGiven(rec *records.Record, g coderv1alpha1.TemplateVersionGiven, active uuid.UUID) {
	building := ""
	if rec.Spec.Build != nil {
		building = rec.Spec.Build.VersionID
	}
	var out []coderv1alpha1.TemplateVersionGiven
	if g.Name || g.Message {
		out = append(out, g)
	}
	for _, e := range rec.Spec.Versions {
		if e.VersionID != g.VersionID && (e.VersionID == active.String() || e.VersionID == building) {
			out = append(out, e)
		}
	}
	rec.Spec.Versions = out
}

// given is what spec gives the version it names.
func given(id uuid.UUID, spec *aggv1.CoderTemplateSpec) *coderv1alpha1.TemplateVersionGiven {
	return &coderv1alpha1.TemplateVersionGiven{VersionID: id.String(), Name: spec.VersionName != "", Message: spec.VersionMessage != ""}
}

// showIdentity shows on obj the identity of v, the version it shows.
func showIdentity(obj *aggv1.CoderTemplate, v *codersdk.TemplateVersion, rec *records.Record) {
	obj.Spec.VersionName, obj.Spec.VersionMessage = "", ""
	if g := givenTo(rec, v.ID); g != nil {
		if g.Name {
			obj.Spec.VersionName = v.Name
		}
		if g.Message {
			obj.Spec.VersionMessage = v.Message
		}
	}
	obj.Spec.ProvisionerTags = givenTags(v.Job.Tags)
}

// versionByName finds the template's version called name; nil when it
// has none.
func (s *TemplateStorage) versionByName(ctx context.Context, t target, tplID uuid.UUID, name string) (*codersdk.TemplateVersion, error) {
	v, err := t.Client.TemplateVersionByName(ctx, tplID, name)
	if err != nil {
		if coderapi.IsNotFound(err) {
			return nil, nil
		}
		return nil, err
	}
	return &v, nil
}

// nameTakenErr is the 409 for a version name the template already has.
func (s *TemplateStorage) nameTakenErr(name, version string, id uuid.UUID) error {
	return s.versionNameTaken(name, fmt.Sprintf(
		"template version %s (%s) already has the name %q; a new version of spec.files needs a new spec.versionName (or none, and Coder names it)",
		version, id, version))
}

// versionNameTaken is a 409 saying msg about spec.versionName. Its reason
// is AlreadyExists, not Conflict: kubectl reads a Conflict answering a
// server-side apply as fields owned by other managers.
func (s *TemplateStorage) versionNameTaken(name, msg string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusConflict, Reason: metav1.StatusReasonAlreadyExists,
		Message: fmt.Sprintf("%s %q: spec.versionName: %s", s.kind, name, msg),
		Details: &metav1.StatusDetails{Group: s.gr.Group, Kind: s.gr.Resource, Name: name,
			Causes: []metav1.StatusCause{{Type: metav1.CauseTypeFieldValueDuplicate, Field: versionNamePath.String(), Message: msg}}},
	}}
}

// identify gives version id the name and message (empty: keep) through
// coderd's PATCH. A name another version has is a 409 (coderd's 400).
func (s *TemplateStorage) identify(ctx context.Context, t target, id uuid.UUID, name, message, objName string) error {
	v, err := t.Client.TemplateVersion(ctx, id)
	if err != nil {
		return s.requestErr(ctx, t, err, objName, "coderd to return the template version")
	}
	var req codersdk.PatchTemplateVersionRequest
	if name != "" && name != v.Name {
		req.Name = name
	}
	if message != "" && message != v.Message {
		req.Message = &message
	}
	if req.Name == "" && req.Message == nil {
		return nil
	}
	updated, err := t.Client.UpdateTemplateVersion(ctx, id, req)
	if err != nil {
		if coderapi.StatusCode(err) == http.StatusBadRequest && strings.Contains(coderapi.Message(err), "must be unique") {
			return s.versionNameTaken(objName, fmt.Sprintf("another version of the template is named %q", name))
		}
		return s.requestErr(ctx, t, err, objName, "coderd to rename the template version")
	}
	if !buildInProgress(updated.Job.Status) {
		// What this server reads next shows the change at once.
		s.versions.put(t.coderdKey(), id, updated)
	}
	return nil
}

// promotedView completes a dry run's answer o (cur with next's spec) as
// the real write shows it: the files shown when next leaves them out, and
// the version a promotion (by spec.versionID, or to promoteTo by
// spec.versionName) makes active, with its files, variables and tags.
func (s *TemplateStorage) promotedView(ctx context.Context, w *write, o, cur, next *aggv1.CoderTemplate, byID bool, promoteTo *codersdk.TemplateVersion) error {
	if o.Spec.Files == nil {
		o.Spec.Files = cur.Spec.Files
	}
	shown := cur.Status.BuildingVersionID
	if shown == "" {
		shown = cur.Status.ActiveVersionID
	}
	to := promoteTo
	if byID {
		v, err := w.t.Client.TemplateVersion(ctx, uuid.MustParse(next.Spec.VersionID)) // validated
		if err != nil {
			return s.coderErr(w.t, err, o.Name)
		}
		to = &v
	}
	if to == nil || to.ID.String() == shown {
		return nil
	}
	files, err := s.sources.Files(ctx, w.t.coderdKey(), w.t.Client, to.Job.FileID, s.opts.Limits)
	if err != nil {
		return s.coderErr(w.t, fmt.Errorf("source of template version %s: %w", to.ID, err), o.Name)
	}
	o.Spec.Files, o.Spec.VersionID, o.Spec.ProvisionerTags = files, to.ID.String(), givenTags(to.Job.Tags)
	o.Status.ActiveVersionID, o.Status.BuildingVersionID = to.ID.String(), ""
	showActive(o, to, o.CreationTimestamp.Time)
	if byID {
		// The promoted version's name and message are its own, not given.
		o.Spec.VersionName, o.Spec.VersionMessage = "", ""
	}
	conds := o.Status.Conditions[:0]
	for _, c := range o.Status.Conditions {
		if c.Type != aggv1.ConditionSecretsCurrent {
			conds = append(conds, c)
		}
	}
	o.Status.Conditions = conds
	if err := s.showVariables(ctx, w.t, o, to, w.prev); err != nil {
		return s.coderErr(w.t, err, o.Name)
	}
	return nil
}
