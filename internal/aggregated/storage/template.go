package storage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// TemplateOptions adds what only templates need.
type TemplateOptions struct {
	// BuildWait tunes the background wait for new versions' builds (the
	// promoter's poll schedule and when it gives up).
	BuildWait templatesource.WaitConfig
	// Limits bound spec.files.
	Limits templatesource.Limits
	// SourceCacheBytes bounds the memory held by downloaded template
	// sources.
	SourceCacheBytes int64
	// Kube reads the Secrets that spec.variables take values from, and
	// asks kube-apiserver whether the caller may (SubjectAccessReviews);
	// nil: no variable can be read from a Secret.
	Kube SecretReader
}

// TemplateStorage serves codertemplates.
type TemplateStorage struct {
	genericStore
	// coderd deletes a template at once.
	deletedAtOnce[*aggv1.CoderTemplate]
	opts     TemplateOptions
	sources  *templatesource.SourceCache
	versions versionCache
	vars     versionVariables
	// secretRevs are the revisions of the Secrets variables were read
	// from, for the SecretsCurrent condition.
	secretRevs secretRevisions
	orgs       orgIDs
	features   featureCache
	acls       templateACLs
}

// NewTemplates returns the codertemplates storage. Run must run for
// watches to see changes.
func NewTemplates(o Options, to TemplateOptions) (*TemplateStorage, error) {
	if to.SourceCacheBytes <= 0 {
		to.SourceCacheBytes = 64 << 20
	}
	s := &TemplateStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("codertemplates"),
			kind:     "CoderTemplate",
			backends: o.Backends,
			ident:    o.Identity,
			access:   templateAccess,
			log:      o.Log.WithName("codertemplates"),
			fields: map[string]string{
				"name":                "metadata.name",
				"display_name":        "spec.displayName",
				"description":         "spec.description",
				"icon":                "spec.icon",
				"template_version_id": "spec.versionID",
				"id":                  "spec.versionID",
				"file_id":             "spec.files",
				"user_perms":          "spec.access.users",
				"group_perms":         "spec.access.groups",
			},
		},
		opts:     to,
		sources:  templatesource.NewSourceCache(to.SourceCacheBytes),
		versions: newVersionCache(),
		vars:     newVersionVariables(),
		features: newFeatureCache(),
		acls:     newTemplateACLs(),
	}
	if err := startCache(&s.genericStore, o, s.listTemplates, aggv1.TemplateFields); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *TemplateStorage) New() runtime.Object     { return &aggv1.CoderTemplate{} }
func (s *TemplateStorage) NewList() runtime.Object { return &aggv1.CoderTemplateList{} }
func (s *TemplateStorage) GetSingularName() string { return "codertemplate" }
func (s *TemplateStorage) ShortNames() []string    { return []string{"ctpl"} }

// listTemplates reads every template of one coderd with its active version
// and source. Versions whose build has ended and sources (content
// addressed) are remembered, so a steady-state poll is one request.
func (s *TemplateStorage) listTemplates(ctx context.Context, t target) ([]watchcache.Object, error) {
	started := time.Now()
	// The records before the templates: see convert.
	recs, err := s.records.list(ctx, t.Namespace, s.gr.Resource, t.ControlPlane)
	if err != nil {
		return nil, fmt.Errorf("list template records: %w", err)
	}
	tpls, err := t.Client.Templates(ctx, codersdk.TemplateFilter{})
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	out := make([]watchcache.Object, len(tpls))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for i := range tpls {
		g.Go(func() error {
			obj, err := s.convert(gctx, t, &tpls[i], recs[tpls[i].ID.String()])
			out[i] = obj
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if err := s.mergeListed(ctx, t, out, started, true, nil); err != nil {
		return nil, err
	}
	return out, nil
}

// convert reads what a template's view needs besides the template and
// its record rec (nil: none). The poller's, it serves access lists read
// within accessTTL.
//
// rec must have been read before tpl. The promoter makes a built version
// active in Coder first and clears the build from the record after; a
// record read after the clearing paired with a template read before the
// promotion would show the old version active and no build running, and
// nothing would show the promotion until the next poll. Read the other
// way round, a record without its build always meets the promoted
// template.
func (s *TemplateStorage) convert(ctx context.Context, t target, tpl *codersdk.Template, rec *records.Record) (*aggv1.CoderTemplate, error) {
	return s.convertWith(ctx, t, tpl, rec, false)
}

// convertWith is convert for a request's answer: freshACL reads the
// access list from coderd. rec is read before tpl, or the record a write
// just saved.
func (s *TemplateStorage) convertWith(ctx context.Context, t target, tpl *codersdk.Template, rec *records.Record, freshACL bool) (*aggv1.CoderTemplate, error) {
	v, err := s.versions.get(ctx, t, tpl.ActiveVersionID)
	if err != nil {
		return nil, fmt.Errorf("active version of template %s: %w", tpl.Name, err)
	}
	files, err := s.shownFiles(ctx, t, v.Job.FileID, "template", tpl.Name)
	if err != nil {
		return nil, err
	}
	obj := toTemplate(t, tpl, &v, files)
	if err := s.showAccess(ctx, t, obj, tpl, freshACL); err != nil {
		return nil, err
	}
	shown, err := s.showBuild(ctx, t, tpl, obj, rec)
	if err != nil {
		return nil, err
	}
	if shown == nil {
		shown = &v
	}
	showIdentity(obj, shown, rec)
	if err := s.showVariables(ctx, t, obj, shown, rec); err != nil {
		return nil, fmt.Errorf("template %s: %w", tpl.Name, err)
	}
	return obj, nil
}

// shownFiles reads the source a version was built from (file fileID),
// as spec.files shows it, for the object called name of kind what.
func (s *TemplateStorage) shownFiles(ctx context.Context, t target, fileID uuid.UUID, what, name string) (map[string]string, error) {
	files, err := s.sources.Files(ctx, t.coderdKey(), t.Client, fileID, s.opts.Limits)
	if err != nil {
		var fe *templatesource.FileError
		if !errors.As(err, &fe) {
			return nil, fmt.Errorf("source of %s %s: %w", what, name, err)
		}
		// A source made outside Kubernetes may exceed spec.files' limits;
		// the object is still listed, without files.
		s.log.V(1).Info("source not shown in spec.files", what, name, "reason", err.Error())
		return nil, nil
	}
	return files, nil
}

func (s *TemplateStorage) lookup(ctx context.Context, name string) (target, templateObjectName, error) {
	return lookupName(ctx, &s.genericStore, name, parseTemplateName)
}

// fetch reads the Coder template an object name refers to.
func (s *TemplateStorage) fetch(ctx context.Context, t target, n templateObjectName, name string) (codersdk.Template, error) {
	orgID, err := s.orgs.get(ctx, t, n.Org)
	if err != nil {
		return codersdk.Template{}, s.coderErr(t, err, name)
	}
	tpl, err := t.Client.TemplateByName(ctx, orgID, n.Name)
	if err != nil {
		if coderapi.IsNotFound(err) {
			s.cache.Delete(t.Key(), name)
		}
		return tpl, s.coderErr(t, err, name)
	}
	return tpl, nil
}

// read fetches one template from coderd, merges its record and records it
// in the cache.
func (s *TemplateStorage) read(ctx context.Context, t target, n templateObjectName, name string) (*aggv1.CoderTemplate, error) {
	obj, err := s.readCoder(ctx, t, n, name, nil)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderTemplate), nil
}

// readCoder fetches one template from coderd: Coder's view, without its
// Kubernetes metadata, showing the background build of rec (nil: of the
// template's record, read before the template as convert says).
func (s *TemplateStorage) readCoder(ctx context.Context, t target, n templateObjectName, name string, rec *records.Record) (*aggv1.CoderTemplate, error) {
	// The record of the template the cache knows by this name, if any.
	var known *records.Record
	var knownID uuid.UUID
	if rec == nil {
		if o, ok := s.cache.Get(t.Key(), name); ok {
			if id, err := uuid.Parse(string(o.GetUID())); err == nil {
				knownID = id
				if known, err = s.templateRecord(ctx, t, id); err != nil {
					return nil, err
				}
			}
		}
	}
	tpl, err := s.fetch(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		rec = known
		if knownID != tpl.ID {
			// A template the cache did not know by this name: its
			// record is read now.
			if rec, err = s.templateRecord(ctx, t, tpl.ID); err != nil {
				return nil, err
			}
		}
	}
	obj, err := s.convertWith(ctx, t, &tpl, rec, true)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	return obj, nil
}

// Get reads the template from coderd.
func (s *TemplateStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	return getObject(ctx, s, name)
}

// List reads the templates of the namespace (or every namespace).
func (s *TemplateStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// Run polls coderd for the watch cache and promotes templates' background
// builds until ctx ends.
func (s *TemplateStorage) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.runPromoter(ctx)
	}()
	s.genericStore.Run(ctx)
	<-done
}

// Update changes the template's metadata, uploads a new version to build
// in the background when spec.files changed (the promoter makes it active
// once built), or promotes spec.versionID. With
// forceAllowCreate (server-side apply) a missing template is created.
func (s *TemplateStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

func (s *TemplateStorage) validateUpdate(next, cur *aggv1.CoderTemplate, name string) field.ErrorList {
	return validateTemplateUpdate(next, cur, name)
}

// planUpdate makes a spec change in Coder: the display fields through
// the template's metadata, then new files or variables as a version built
// in the background, or spec.versionID made active.
func (s *TemplateStorage) planUpdate(n templateObjectName, name string, cur, next *aggv1.CoderTemplate) specUpdate {
	filesChanged := next.Spec.Files != nil && !maps.Equal(next.Spec.Files, cur.Spec.Files)
	varsChanged := !sameVariables(next.Spec.Variables, cur.Spec.Variables)
	metaChanged := next.Spec.DisplayName != cur.Spec.DisplayName || next.Spec.Description != cur.Spec.Description || next.Spec.Icon != cur.Spec.Icon
	// The source a new version builds: the files given, or those shown
	// when only the variables change.
	spec := next.Spec
	if spec.Files == nil {
		spec.Files = cur.Spec.Files
	}
	tagsChanged := !maps.Equal(next.Spec.ProvisionerTags, cur.Spec.ProvisionerTags)
	rebuild := filesChanged || varsChanged || tagsChanged
	promote := !rebuild && next.Spec.VersionID != "" && next.Spec.VersionID != cur.Spec.VersionID
	// The name or message alone (template_identity.go): the version of
	// that name is made active, else the shown version renamed.
	nameChanged := next.Spec.VersionName != cur.Spec.VersionName
	renaming := !rebuild && !promote && (nameChanged || next.Spec.VersionMessage != cur.Spec.VersionMessage)
	// Settings next leaves unset keep Coder's values; a duration written
	// otherwise with the same value changes only the record.
	settingsChanged := settingsDiffer(&next.Spec, &cur.Spec)
	u := specUpdate{changed: metaChanged || rebuild || promote || renaming || settingsChanged}
	if filesChanged {
		u.invalid = templatesource.Validate(next.Spec.Files, s.opts.Limits, specPath.Child("files"))
	}
	if promote && nameChanged {
		u.invalid = append(u.invalid, field.Forbidden(versionNamePath, "promote a version either by spec.versionID or by spec.versionName, not both"))
	}
	if tagsChanged && len(spec.Files) == 0 {
		u.invalid = append(u.invalid, field.Forbidden(provisionerTagPath, "tags are given to a new version of spec.files, and this template shows none"))
	}
	u.invalid = append(u.invalid, validateVersionIdentity(&next.Spec)...)
	// promoteTo is the version of spec.versionName a name change makes
	// active (found by check); nil: the shown version is renamed.
	var promoteTo *codersdk.TemplateVersion
	if varsChanged {
		u.invalid = append(u.invalid, validateVariables(next.Spec.Variables)...)
		if len(spec.Files) == 0 {
			u.invalid = append(u.invalid, field.Forbidden(variablesPath, "variables are given to a new version of spec.files, and this template shows none"))
		}
	}
	var vars appliedVariables
	accessChanged := accessDiffers(&next.Spec, &cur.Spec)
	var access accessIDs
	u.check = func(ctx context.Context, w *write) (bool, error) {
		if settingsChanged {
			if err := s.refuseUnlicensed(ctx, w.t, name, &next.Spec, &cur.Spec); err != nil {
				return false, err
			}
		}
		if accessChanged {
			orgID, err := s.orgs.get(ctx, w.t, n.Org)
			if err != nil {
				return false, s.coderErr(w.t, err, name)
			}
			if access, err = s.resolveAccess(ctx, w.t, orgID, next.Spec.Access, name); err != nil {
				return false, err
			}
		}
		moved := false
		if !rebuild && len(spec.Files) > 0 {
			// The spec is as shown, but a Secret a value came from may
			// have changed since: then this write builds a version with
			// its current value, if the caller may read it.
			var err error
			if moved, err = s.secretsMoved(ctx, w.t, cur); err != nil {
				return false, err
			}
			if moved && !s.mayReadSecretsOf(ctx, w.t, next) {
				moved = false
			}
		}
		if renaming && nameChanged && next.Spec.VersionName != "" {
			var err error
			if promoteTo, err = s.versionByName(ctx, w.t, uuid.MustParse(cur.Status.ID), next.Spec.VersionName); err != nil {
				return false, s.requestErr(ctx, w.t, err, name, "coderd to find the version named in spec.versionName")
			}
		}
		if !rebuild && !moved {
			return false, nil
		}
		rebuild = true
		if next.Spec.VersionName != "" {
			// Refused before anything is uploaded, on a dry run too.
			taken, err := s.versionByName(ctx, w.t, uuid.MustParse(cur.Status.ID), next.Spec.VersionName)
			if err != nil {
				return false, s.requestErr(ctx, w.t, err, name, "coderd to find the version named in spec.versionName")
			}
			if taken != nil {
				// The active or building version keeps its name when the
				// write goes back to its files and tags (planFiles);
				// coderd refuses the name (409) should the variables
				// differ after all.
				same := false
				if taken.ID.String() == cur.Status.ActiveVersionID || taken.ID.String() == cur.Status.BuildingVersionID {
					hash, err := s.filesHashOf(ctx, w.t, taken)
					if err != nil {
						return false, s.requestErr(ctx, w.t, err, name, "coderd to return the named version's source")
					}
					same = hash == templatesource.FilesHash(spec.Files) && sameTags(taken, &next.Spec)
				}
				if !same {
					return false, s.nameTakenErr(name, taken.Name, taken.ID)
				}
			}
		}
		var err error
		vars, err = s.resolveVariables(ctx, w.t, &spec, name)
		return moved, err
	}
	u.dryView = func(ctx context.Context, w *write, out object) error {
		return s.promotedView(ctx, w, out.(*aggv1.CoderTemplate), cur, next, promote, promoteTo)
	}
	u.apply = func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		t := w.t
		tpl, err := s.fetch(ctx, t, n, name)
		if err != nil {
			return nil, nil, err
		}
		var now aggv1.CoderTemplateSpec
		showSettings(&now, &tpl)
		// The access list is not in the template's PATCH.
		now.Access = next.Spec.Access
		if metaChanged || settingsDiffer(&next.Spec, &now) {
			req := coderapi.TemplateMeta(&tpl)
			req.DisplayName, req.Description, req.Icon = &next.Spec.DisplayName, &next.Spec.Description, &next.Spec.Icon
			setMeta(&req, &next.Spec)
			// Unchanged (coderd's 304: another writer made the same
			// change meanwhile) is not a failure.
			if _, _, err := coderapi.UpdateTemplateMeta(ctx, t.Client, tpl.ID, req); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
		}
		if accessChanged {
			if err := s.setAccess(ctx, t, tpl.ID, tpl.OrganizationID, next.Spec.Access, access); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
		}
		var plan buildPlan
		switch {
		case rebuild:
			if plan, err = s.planFiles(ctx, t, &tpl, &spec, vars, name, w.prev); err != nil {
				return nil, nil, err
			}
		case promote, promoteTo != nil && promoteTo.ID != plan.shownVersion(w.prev, tpl.ActiveVersionID):
			plan = s.planDrop(ctx, t, w.prev)
			activate := uuid.MustParse(next.Spec.VersionID) // validated
			if !promote {
				activate = promoteTo.ID
			}
			if err := t.Client.UpdateActiveTemplateVersion(ctx, tpl.ID, codersdk.UpdateActiveTemplateVersion{ID: activate}); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
			tpl.ActiveVersionID = activate
		}
		// The version shown now carries the name and message given.
		shown := plan.shownVersion(w.prev, tpl.ActiveVersionID)
		if rebuild || renaming {
			// A new build was created with them; a version reused or
			// promoted may need them given.
			built := plan.build != nil && plan.build.VersionID == shown.String()
			if !built && (next.Spec.VersionName != "" || next.Spec.VersionMessage != "") {
				if err := s.identify(ctx, t, shown, next.Spec.VersionName, next.Spec.VersionMessage, name); err != nil {
					return nil, nil, err
				}
			}
			plan.given, plan.active = given(shown, &next.Spec), tpl.ActiveVersionID
		} else if promote {
			// Promoted by ID: the name and message shown are the
			// promoted version's own, not given by this spec.
			plan.given, plan.active = &coderv1alpha1.TemplateVersionGiven{VersionID: shown.String()}, tpl.ActiveVersionID
		}
		out, err := s.readCoder(ctx, t, n, name, plan.shown(w.prev))
		if err != nil {
			return nil, nil, err
		}
		return out, plan.apply, nil
	}
	return u
}

// releaseDelete deletes the template in Coder: the last finalizer
// holding its deletion is gone.
func (s *TemplateStorage) releaseDelete(ctx context.Context, w *write, _ templateObjectName, _ string, cur, next *aggv1.CoderTemplate, dryRun bool) (runtime.Object, error) {
	return releaseAtOnce(ctx, w, cur, next, dryRun, func(ctx context.Context) error { return s.deleteTemplate(ctx, w.t, cur, cur.Name) })
}

// Delete deletes the template in coderd; coderd refuses while workspaces
// use it.
func (s *TemplateStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return deleteObject(ctx, s, name, deleteValidation, opts)
}

func (s *TemplateStorage) deleteInCoder(ctx context.Context, w *write, _ templateObjectName, name string, cur *aggv1.CoderTemplate) (runtime.Object, bool, error) {
	return deleteAtOnce(ctx, w, cur, func(ctx context.Context) error { return s.deleteTemplate(ctx, w.t, cur, name) })
}

// deleteTemplate deletes cur in Coder and from the watch cache: what a
// delete does, at once or once the last finalizer holding it is removed.
func (s *TemplateStorage) deleteTemplate(ctx context.Context, t target, cur *aggv1.CoderTemplate, name string) error {
	if err := t.Client.DeleteTemplate(ctx, uuid.MustParse(cur.Status.ID)); err != nil {
		return s.coderErr(t, err, name)
	}
	s.cache.Delete(t.Key(), name)
	return nil
}
