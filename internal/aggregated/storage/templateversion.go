package storage

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/aggregated/watchcache"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/jsonskim"
)

// codertemplateversions: every non-archived version of every template,
// one object per version, named <org>.<template>.<version>. The kind is a
// third strategy of the shared registry (registry.go); what it shares
// with templates (the sources cache, the versions' variables, the
// organizations, variable resolution with its SubjectAccessReviews, file
// upload) it uses from the TemplateStorage it is built with. Reads are
// the operator's, shown to a mapped caller as the template is (coderd
// authorizes a version as its template): templateVersionAccess.

// TemplateVersionStorage serves codertemplateversions.
type TemplateVersionStorage struct {
	genericStore
	// coderd archives a version at once.
	deletedAtOnce[*aggv1.CoderTemplateVersion]
	// known holds, per coderd (target.coderdKey), what its last
	// templates list found (knownSet).
	known sync.Map
	// memo holds the versions the last list of each backend decoded.
	memo listMemo[codersdk.TemplateVersion]
	tpls *TemplateStorage
	// params holds the parameters and presets of built versions.
	params versionParamCache
}

// NewTemplateVersions returns the codertemplateversions storage, sharing
// tpls' caches of coderd's answers. Run must run for watches to see
// changes.
func NewTemplateVersions(o Options, tpls *TemplateStorage) (*TemplateVersionStorage, error) {
	s := &TemplateVersionStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("codertemplateversions"),
			kind:     "CoderTemplateVersion",
			backends: o.Backends,
			ident:    o.Identity,
			access:   templateVersionAccess,
			log:      o.Log.WithName("codertemplateversions"),
			fields: map[string]string{
				"name":             "metadata.name",
				"message":          "spec.message",
				"file_id":          "spec.files",
				"provisioner_tags": "spec.provisionerTags",
			},
		},
		tpls:   tpls,
		params: newVersionParamCache(),
	}
	if err := startCache(&s.genericStore, o, s.listVersions, aggv1.TemplateVersionFields); err != nil {
		return nil, err
	}
	s.sourcesListed = s.memo.retain
	return s, nil
}

func (s *TemplateVersionStorage) New() runtime.Object     { return &aggv1.CoderTemplateVersion{} }
func (s *TemplateVersionStorage) NewList() runtime.Object { return &aggv1.CoderTemplateVersionList{} }
func (s *TemplateVersionStorage) GetSingularName() string { return "codertemplateversion" }
func (s *TemplateVersionStorage) ShortNames() []string    { return []string{"ctv"} }

// listVersions reads every non-archived version of every template of one
// coderd: each template's versions (one request each: coderd's versions
// list is unpaginated without a limit), as coderd holds them now. The
// templates themselves (which there are, their names and active
// versions) come from coderd's templates list, which costs coderd more
// than the versions lists of a few templates together (it prepares an
// authorization filter on every call; reading a template by ID costs
// about as much again per template): it is read when the last read is
// older than the poll interval or a template changed through coder-k8s
// since (the templates' cache moved). So a template made, renamed or
// promoted in Coder outside coder-k8s shows in a LIST within the poll
// interval, when a watch would see it too; a version added, changed or
// archived, and a template deleted, show at once; a GET reads everything
// from coderd. Sources and ended versions' variables come from the
// caches templates share.
func (s *TemplateVersionStorage) listVersions(ctx context.Context, t target) ([]watchcache.Object, error) {
	started := time.Now()
	known, current := s.knownTemplates(t)
	d := &versionDecoder{prev: s.memo.get(t), next: map[uint64]codersdk.TemplateVersion{}}
	var (
		tpls []codersdk.Template
		read map[uuid.UUID][]codersdk.TemplateVersion
		err  error
	)
	if current {
		tpls, read, err = s.readKnown(ctx, t, known.templates, d)
	} else {
		tpls, read, err = s.discover(ctx, t, known.templates, d)
	}
	if err != nil {
		return nil, err
	}
	// Converted per template at once: a version seen for the first time
	// costs a request for its variables.
	perTemplate := make([][]watchcache.Object, len(tpls))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for i := range tpls {
		g.Go(func() error {
			vs := read[tpls[i].ID]
			for j := range vs {
				obj, err := s.convert(gctx, t, &tpls[i], &vs[j], nil)
				if err != nil {
					return err
				}
				if obj != nil {
					perTemplate[i] = append(perTemplate[i], obj)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	var out []watchcache.Object
	for _, objs := range perTemplate {
		out = append(out, objs...)
	}
	if err := s.mergeListed(ctx, t, out, started, true, nil); err != nil {
		return nil, err
	}
	s.memo.set(t, d.next)
	return out, nil
}

// discover reads coderd's templates list and the versions of every
// template it finds, recording the templates as known. The versions of
// the templates known before are read while the list runs; a template it
// finds that is new is read after it. What is served is as of the
// templates list: a template gone since has no versions.
func (s *TemplateVersionStorage) discover(ctx context.Context, t target, known []codersdk.Template, d *versionDecoder) ([]codersdk.Template, map[uuid.UUID][]codersdk.TemplateVersion, error) {
	tplRV := s.tpls.cache.ResourceVersion()
	at := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel + 1)
	var mu sync.Mutex
	read := map[uuid.UUID][]codersdk.TemplateVersion{}
	listOf := func(id uuid.UUID) func() error {
		return func() error {
			vs, _, err := s.versionsOf(gctx, t, id, d)
			if err != nil {
				return err
			}
			mu.Lock()
			read[id] = vs
			mu.Unlock()
			return nil
		}
	}
	var tpls []codersdk.Template
	g.Go(func() error {
		var err error
		if tpls, err = t.Client.Templates(gctx, codersdk.TemplateFilter{}); err != nil {
			return fmt.Errorf("list templates: %w", err)
		}
		return nil
	})
	for _, tpl := range known {
		g.Go(listOf(tpl.ID))
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	var missing []uuid.UUID
	for _, tpl := range tpls {
		if _, ok := read[tpl.ID]; !ok {
			missing = append(missing, tpl.ID)
		}
	}
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for _, id := range missing {
		g.Go(listOf(id))
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	s.known.Store(t.coderdKey(), knownSet{templates: tpls, at: at, tplRV: tplRV})
	return tpls, read, nil
}

// readKnown reads the versions of each known template, the templates as
// the last templates list read them. A template coderd no longer has is
// left out.
func (s *TemplateVersionStorage) readKnown(ctx context.Context, t target, known []codersdk.Template, d *versionDecoder) ([]codersdk.Template, map[uuid.UUID][]codersdk.TemplateVersion, error) {
	vss := make([][]codersdk.TemplateVersion, len(known))
	found := make([]bool, len(known))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(coderapi.MaxParallel)
	for i := range known {
		g.Go(func() error {
			var err error
			vss[i], found[i], err = s.versionsOf(gctx, t, known[i].ID, d)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, nil, err
	}
	out := make([]codersdk.Template, 0, len(known))
	read := make(map[uuid.UUID][]codersdk.TemplateVersion, len(known))
	for i, tpl := range known {
		if found[i] {
			out = append(out, tpl)
			read[tpl.ID] = vss[i]
		}
	}
	return out, read, nil
}

// versionsOf lists template id's versions; found is false for a template
// deleted meanwhile. Each version is decoded only if its JSON is not one the last
// list decoded (d): coderd's versions rarely change, and decoding them
// was most of a list's work.
func (s *TemplateVersionStorage) versionsOf(ctx context.Context, t target, id uuid.UUID, d *versionDecoder) (vs []codersdk.TemplateVersion, found bool, err error) {
	res, err := t.Client.Request(ctx, http.MethodGet, fmt.Sprintf("/api/v2/templates/%s/versions", id), nil)
	if err != nil {
		return nil, false, fmt.Errorf("list versions of template %s: %w", id, err)
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode == http.StatusNotFound {
		return nil, false, nil
	}
	if res.StatusCode != http.StatusOK {
		return nil, false, fmt.Errorf("list versions of template %s: %w", id, codersdk.ReadBodyAsError(res))
	}
	if err := elements(jsonskim.NewReader(res.Body), func(raw []byte) error {
		v, err := d.decode(raw)
		vs = append(vs, v)
		return err
	}); err != nil {
		return nil, false, fmt.Errorf("list versions of template %s: %w", id, err)
	}
	return vs, true, nil
}

// versionDecoder decodes the versions of one list, reusing what the last
// list decoded from the same JSON (prev) and keeping what this one
// decodes (next). Decoded versions are shared between lists: only read.
type versionDecoder struct {
	prev map[uint64]codersdk.TemplateVersion
	mu   sync.Mutex
	next map[uint64]codersdk.TemplateVersion
}

func (d *versionDecoder) decode(raw []byte) (codersdk.TemplateVersion, error) {
	h := hashBytes(raw)
	v, ok := d.prev[h]
	if !ok {
		if err := json.Unmarshal(raw, &v); err != nil {
			return v, fmt.Errorf("decode coderd's answer: %w", err)
		}
	}
	d.mu.Lock()
	d.next[h] = v
	d.mu.Unlock()
	return v, nil
}

// knownSet is what the last templates list of one coderd found: the
// templates, when it started, and the templates' cache's resource version
// then.
type knownSet struct {
	templates []codersdk.Template
	at        time.Time
	tplRV     string
}

// knownTemplates returns the templates the last list of t's coderd found,
// and whether they may be used instead of listing again: read within the
// poll interval, with no template changed through coder-k8s since.
func (s *TemplateVersionStorage) knownTemplates(t target) (knownSet, bool) {
	v, _ := s.known.Load(t.coderdKey())
	k, ok := v.(knownSet)
	if !ok {
		return knownSet{}, false
	}
	return k, time.Since(k.at) < s.interval && k.tplRV == s.tpls.cache.ResourceVersion()
}

// convert is the view of version v of tpl, showing the variables applied
// to it as rec records them (nil: read the version's record). nil for a
// version whose name is not one an object name can carry (coderd has
// validated names since v0.x; older ones may differ), or that is
// archived.
func (s *TemplateVersionStorage) convert(ctx context.Context, t target, tpl *codersdk.Template, v *codersdk.TemplateVersion, rec *records.Record) (*aggv1.CoderTemplateVersion, error) {
	n := templateVersionName{ControlPlane: t.ControlPlane, Org: tpl.OrganizationName, Template: tpl.Name, Version: v.Name}
	if v.Archived {
		return nil, nil
	}
	if err := checkCoderName("version", v.Name, versionName, maxVersionName, ""); err != nil {
		s.log.V(1).Info("template version not served: its name cannot be part of an object name", "template", tpl.Name, "version", v.Name)
		return nil, nil
	}
	files, err := s.tpls.shownFiles(ctx, t, v.Job.FileID, "template version", n.String(t.prefixed))
	if err != nil {
		return nil, err
	}
	if rec == nil {
		if rec, err = s.records.get(ctx, s.recordKey(t, v.ID.String())); err != nil {
			return nil, apierrors.NewInternalError(err)
		}
	}
	obj := toTemplateVersion(t, n, tpl, v, files)
	// The variables as templates show them, through a template view of
	// the version: one implementation of what spec.variables and
	// status.variables show.
	view := &aggv1.CoderTemplate{ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Namespace: obj.Namespace}}
	if err := s.tpls.showVariables(ctx, t, view, v, rec); err != nil {
		return nil, fmt.Errorf("template version %s: %w", obj.Name, err)
	}
	obj.Spec.Variables, obj.Status.Variables = view.Spec.Variables, view.Status.Variables
	if v.Job.Status == codersdk.ProvisionerJobSucceeded {
		params, err := s.params.get(ctx, t, v.ID)
		if err != nil {
			return nil, fmt.Errorf("template version %s: %w", obj.Name, err)
		}
		obj.Status.Parameters, obj.Status.Presets = params.status()
	}
	for _, c := range view.Status.Conditions {
		if c.Type == aggv1.ConditionSecretsCurrent && c.Reason == aggv1.ReasonSecretChanged {
			// A version is never rebuilt: say what to do instead.
			c.Message, _, _ = strings.Cut(c.Message, "; the next apply")
			c.Message += "; this version keeps the value it was built with: create a new version for the current one"
		}
		obj.Status.Conditions = append(obj.Status.Conditions, c)
	}
	return obj, nil
}

// toTemplateVersion builds the Kubernetes view of version v of tpl.
// Deterministic, like toTemplate.
func toTemplateVersion(t target, n templateVersionName, tpl *codersdk.Template, v *codersdk.TemplateVersion, files map[string]string) *aggv1.CoderTemplateVersion {
	obj := &aggv1.CoderTemplateVersion{
		TypeMeta: metav1.TypeMeta{APIVersion: aggv1.SchemeGroupVersion.String(), Kind: "CoderTemplateVersion"},
		ObjectMeta: coderObjectMeta(t, n.String(t.prefixed), v.ID.String(), v.CreatedAt,
			objectLabels(t, tpl.OrganizationName, map[string]string{aggv1.LabelTemplate: tpl.Name})),
		Spec: aggv1.CoderTemplateVersionSpec{
			Organization:    tpl.OrganizationName,
			Template:        tpl.Name,
			Message:         v.Message,
			Files:           files,
			ProvisionerTags: givenTags(v.Job.Tags),
		},
		Status: aggv1.CoderTemplateVersionStatus{
			ID:             v.ID.String(),
			TemplateID:     tpl.ID.String(),
			OrganizationID: tpl.OrganizationID.String(),
			CreatedBy:      v.CreatedBy.Username,
			CreatedAt:      timePtr(&v.CreatedAt),
			BuildStatus:    string(v.Job.Status),
			BuildError:     v.Job.Error,
			Active:         tpl.ActiveVersionID == v.ID,
		},
	}
	obj.Status.Conditions = []metav1.Condition{versionReady(v)}
	return obj
}

// versionReady is a version's Ready condition: True once built, False
// while it builds (Building) or after it failed (BuildFailed, with
// coderd's error).
func versionReady(v *codersdk.TemplateVersion) metav1.Condition {
	at := v.CreatedAt
	if v.Job.CompletedAt != nil {
		at = *v.Job.CompletedAt
	}
	c := metav1.Condition{Type: aggv1.ConditionReady, LastTransitionTime: metav1.NewTime(at.Truncate(time.Second))}
	switch {
	case v.Job.Status == codersdk.ProvisionerJobSucceeded:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "Built", "version "+v.Name+" built successfully"
	case buildInProgress(v.Job.Status):
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, aggv1.ReasonBuilding, "the version's import is "+string(v.Job.Status)
	default:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, aggv1.ReasonBuildFailed, v.Job.Error
		if c.Message == "" {
			c.Message = "the version's import " + string(v.Job.Status)
		}
	}
	return c
}

// lookup parses name as the namespace's names read (with the control
// plane prefix when it has several control planes) and finds its
// backend, acting as the caller.
func (s *TemplateVersionStorage) lookup(ctx context.Context, name string) (target, templateVersionName, error) {
	prefixed, err := s.prefixedNamespace(ctx)
	if err != nil {
		return target{}, templateVersionName{}, err
	}
	return lookupName(ctx, &s.genericStore, name, func(v string) (templateVersionName, error) {
		return parseTemplateVersionName(v, prefixed)
	})
}

// prefixedNamespace says whether the request's namespace has several
// control planes, so that its object names carry the control plane.
func (s *TemplateVersionStorage) prefixedNamespace(ctx context.Context) (bool, error) {
	ts, err := s.targets(ctx, namespaceOf(ctx))
	if err != nil {
		return false, err
	}
	return len(ts) > 1, nil
}

// fetch reads the template and the version an object name refers to. An
// archived version is NotFound: coderd's read by name still returns it
// (templateVersionByName does not filter), but it is no longer served.
func (s *TemplateVersionStorage) fetch(ctx context.Context, t target, n templateVersionName, name string) (codersdk.Template, codersdk.TemplateVersion, error) {
	orgID, err := s.tpls.orgs.get(ctx, t, n.Org)
	if err != nil {
		return codersdk.Template{}, codersdk.TemplateVersion{}, s.coderErr(t, err, name)
	}
	tpl, err := t.Client.TemplateByName(ctx, orgID, n.Template)
	if err != nil {
		if coderapi.IsNotFound(err) {
			s.cache.Delete(t.Key(), name)
			return tpl, codersdk.TemplateVersion{}, s.notFound(name, fmt.Sprintf("organization %s has no template %s", n.Org, n.Template))
		}
		return tpl, codersdk.TemplateVersion{}, s.coderErr(t, err, name)
	}
	v, err := t.Client.TemplateVersionByName(ctx, tpl.ID, n.Version)
	if err == nil && v.Archived {
		s.cache.Delete(t.Key(), name)
		return tpl, v, s.notFound(name, "the version is archived")
	}
	if err != nil {
		if coderapi.IsNotFound(err) {
			s.cache.Delete(t.Key(), name)
		}
		return tpl, v, s.coderErr(t, err, name)
	}
	return tpl, v, nil
}

// readCoder reads one version from coderd: Coder's view, without its
// Kubernetes metadata, showing the variables rec records (nil: the
// version's record).
func (s *TemplateVersionStorage) readCoder(ctx context.Context, t target, n templateVersionName, name string, rec *records.Record) (*aggv1.CoderTemplateVersion, error) {
	tpl, v, err := s.fetch(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	obj, err := s.convert(ctx, t, &tpl, &v, rec)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	if obj == nil {
		return nil, s.notFound(name, "the version is not served")
	}
	return obj, nil
}

// read fetches one version from coderd, merges its record and records it
// in the cache.
func (s *TemplateVersionStorage) read(ctx context.Context, t target, n templateVersionName, name string) (*aggv1.CoderTemplateVersion, error) {
	obj, err := s.readCoder(ctx, t, n, name, nil)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderTemplateVersion), nil
}

// Get reads the version from coderd.
func (s *TemplateVersionStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	return getObject(ctx, s, name)
}

// List reads the versions of the namespace (or every namespace).
func (s *TemplateVersionStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// versionID is the Coder ID of a served version (set on every object read
// from coderd).
func versionID(v *aggv1.CoderTemplateVersion) uuid.UUID {
	id, _ := uuid.Parse(v.Status.ID)
	return id
}
