package storage

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/identity"
)

// WorkspaceStorage serves coderworkspaces.
type WorkspaceStorage struct {
	genericStore
	params *buildParams
	// versions holds the parameters and presets of the versions
	// workspaces were built from.
	versions versionParamCache
	orgs     orgIDs
	memo     listMemo[*memoEntry]
	// pageSize is how many workspaces a list asks coderd for at once
	// (Options.WorkspacePageSize).
	pageSize int
	// kube reads the workspaces' pods and events (workspace_pods.go).
	kube SecretReader
}

// NewWorkspaces returns the coderworkspaces storage. Run must run for
// watches to see changes.
func NewWorkspaces(o Options) (*WorkspaceStorage, error) {
	s := &WorkspaceStorage{
		genericStore: genericStore{
			gr:       aggv1.Resource("coderworkspaces"),
			kind:     "CoderWorkspace",
			backends: o.Backends,
			ident:    o.Identity,
			access:   workspaceAccess,
			// A member's list of their 10 workspaces among thousands costs
			// coderd 10, as coderd's own list does.
			callerLists: true,
			log:         o.Log.WithName("coderworkspaces"),
			fields: map[string]string{
				"name":                  "metadata.name",
				"template_id":           "spec.templateName",
				"template_version_id":   "spec.templateVersionID",
				"ttl_ms":                "spec.ttlMillis",
				"autostart_schedule":    "spec.autostartSchedule",
				"schedule":              "spec.autostartSchedule",
				"rich_parameter_values": "spec.parameters",
			},
		},
		params:   newBuildParams(20000),
		versions: newVersionParamCache(),
		pageSize: o.WorkspacePageSize,
		kube:     o.Kube,
	}
	s.sourcesListed = s.memo.retain
	if err := startCache(&s.genericStore, o, s.listWorkspaces, aggv1.WorkspaceFields); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *WorkspaceStorage) New() runtime.Object     { return &aggv1.CoderWorkspace{} }
func (s *WorkspaceStorage) NewList() runtime.Object { return &aggv1.CoderWorkspaceList{} }
func (s *WorkspaceStorage) GetSingularName() string { return "coderworkspace" }
func (s *WorkspaceStorage) ShortNames() []string    { return []string{"cws"} }

// read fetches one workspace from coderd, merges its record and records
// it in the cache.
func (s *WorkspaceStorage) read(ctx context.Context, t target, n workspaceName, name string) (*aggv1.CoderWorkspace, error) {
	obj, err := s.readCoder(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	out, err := s.publishRead(ctx, t, obj)
	if err != nil {
		return nil, err
	}
	return out.(*aggv1.CoderWorkspace), nil
}

// readCoder fetches one workspace from coderd: Coder's view, without
// its Kubernetes metadata.
func (s *WorkspaceStorage) readCoder(ctx context.Context, t target, n workspaceName, name string) (*aggv1.CoderWorkspace, error) {
	w, err := t.Client.WorkspaceByOwnerAndName(ctx, n.Owner, n.Name, codersdk.WorkspaceOptions{})
	if err != nil {
		if code := coderapi.StatusCode(err); code == http.StatusNotFound || code == http.StatusGone {
			s.cache.Delete(t.Key(), name)
		}
		return nil, s.coderErr(t, err, name)
	}
	if w.OrganizationName != n.Org {
		return nil, s.notFound(name, fmt.Sprintf("workspace %s/%s belongs to organization %q", n.Owner, n.Name, w.OrganizationName))
	}
	params, err := s.params.fill(ctx, t, []uuid.UUID{w.LatestBuild.ID})
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	obj := toWorkspace(t, &w, params[w.LatestBuild.ID])
	v, err := s.versions.get(ctx, t, w.LatestBuild.TemplateVersionID)
	if err != nil {
		return nil, s.coderErr(t, err, name)
	}
	v.specView(&obj.Spec, w.LatestBuild.TemplateVersionPresetID)
	return obj, nil
}

// lookup parses name and finds its backend.
func (s *WorkspaceStorage) lookup(ctx context.Context, name string) (target, workspaceName, error) {
	return lookupName(ctx, &s.genericStore, name, parseWorkspaceName)
}

// Get reads the workspace from coderd. When its agents keep it from
// being ready, the Ready message says what its pods and their events
// show, as far as the caller may read them (workspace_pods.go).
func (s *WorkspaceStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	obj, err := getObject(ctx, s, name)
	if err != nil {
		return nil, err
	}
	return s.withPods(ctx, obj.(*aggv1.CoderWorkspace)), nil
}

// List reads the workspaces of the namespace (or of every namespace) from
// coderd. A list at resourceVersion 0 — what informers send — is served
// from the watch cache while the poller keeps it fresh.
func (s *WorkspaceStorage) List(ctx context.Context, opts *metainternalversion.ListOptions) (runtime.Object, error) {
	return listObjects(ctx, s, opts)
}

// Create creates the workspace in coderd.
func (s *WorkspaceStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, opts *metav1.CreateOptions) (runtime.Object, error) {
	return createObject(ctx, s, obj, createValidation, opts)
}

func (s *WorkspaceStorage) validateCreate(ws *aggv1.CoderWorkspace) (workspaceName, field.ErrorList) {
	return validateWorkspaceCreate(ws)
}

func (s *WorkspaceStorage) createdView(ws *aggv1.CoderWorkspace, t target, n workspaceName) *aggv1.CoderWorkspace {
	return dryRunWorkspace(ws, t, n)
}

// planCreate checks the template (and version) the workspace is built
// from; a dry run asks coderd whether the caller may create it.
func (s *WorkspaceStorage) planCreate(ctx context.Context, t target, n workspaceName, ws, dry *aggv1.CoderWorkspace, dryRun bool) (createCall, error) {
	orgID, err := s.orgs.get(ctx, t, n.Org)
	if err != nil {
		return nil, s.coderErr(t, err, ws.Name)
	}
	tpl, err := t.Client.TemplateByName(ctx, orgID, ws.Spec.TemplateName)
	if err != nil {
		if coderapi.IsNotFound(err) {
			return nil, s.invalid(ws.Name, field.ErrorList{
				field.NotFound(field.NewPath("spec", "templateName"), ws.Spec.TemplateName)})
		}
		return nil, s.coderErr(t, err, ws.Name)
	}
	req := codersdk.CreateWorkspaceRequest{
		Name:                n.Name,
		TTLMillis:           ws.Spec.TTLMillis,
		AutostartSchedule:   ws.Spec.AutostartSchedule,
		RichParameterValues: fromParameters(ws.Spec.Parameters),
		AutomaticUpdates:    codersdk.AutomaticUpdates(ws.Spec.AutomaticUpdates),
	}
	version := tpl.ActiveVersionID
	if ws.Spec.TemplateVersionID != "" {
		version = uuid.MustParse(ws.Spec.TemplateVersionID) // validated above
		if err := s.checkVersionOf(ctx, t, tpl, version, ws.Name); err != nil {
			return nil, err
		}
		req.TemplateVersionID = version
	} else {
		req.TemplateID = tpl.ID
	}
	if len(ws.Spec.Parameters) > 0 || ws.Spec.Preset != "" {
		preset, err := s.checkParameters(ctx, t, &ws.Spec, version, ws.Name, true)
		if err != nil {
			return nil, err
		}
		req.TemplateVersionPresetID = preset
	}
	if dryRun {
		if t.caller != nil {
			// coderd is not asked to create: ask whether it would let the
			// caller, for the owner the name gives.
			// Looked up as the operator: a member may not read other users,
			// and the real create is refused for the create, not the lookup.
			ownerName := n.Owner
			if ownerName == codersdk.Me {
				ownerName = t.caller.UserID.String()
			}
			owner, err := t.operatorClient().User(ctx, ownerName)
			if err != nil {
				return nil, s.coderErr(t, err, ws.Name)
			}
			if err := s.mayCreate(ctx, t, identity.Check{Resource: codersdk.ResourceWorkspace, Action: codersdk.ActionCreate, OrganizationID: orgID, OwnerID: owner.ID}, ws.Name); err != nil {
				return nil, err
			}
		}
		// What the real create would show: the version it builds (the
		// template's active one unless given). The template was checked
		// as the real create checks it; nothing is written.
		if dry.Spec.TemplateVersionID == "" {
			dry.Spec.TemplateVersionID = tpl.ActiveVersionID.String()
		}
		if dry.Spec.AutomaticUpdates == "" {
			dry.Spec.AutomaticUpdates = string(codersdk.AutomaticUpdatesNever)
		}
		return nil, nil
	}
	return func(ctx context.Context) (object, func(*records.Record), error) {
		w, err := t.Client.CreateUserWorkspace(ctx, n.Owner, req)
		if err != nil {
			return nil, nil, s.buildErr(t, err, ws.Name, true)
		}
		if !ws.Spec.Running {
			if err := s.stopNew(ctx, t, &w); err != nil {
				return nil, nil, s.coderErr(t, fmt.Errorf("workspace %s was created, but stopping it failed: %w", ws.Name, err), ws.Name)
			}
		}
		out, err := s.readCoder(ctx, t, n, ws.Name)
		if err != nil {
			return nil, nil, err
		}
		return out, nil, nil
	}, nil
}

// checkParameters checks spec's parameters and preset against the
// template version a build uses and returns the preset's ID.
func (s *WorkspaceStorage) checkParameters(ctx context.Context, t target, spec *aggv1.CoderWorkspaceSpec, version uuid.UUID, name string, strict bool) (uuid.UUID, error) {
	// Not the cache: a version still importing has no parameters yet.
	v, err := fetchVersionParameters(ctx, t.Client, version)
	if err != nil {
		return uuid.Nil, s.coderErr(t, err, name)
	}
	preset, errs := v.check(spec, version, strict)
	if len(errs) > 0 {
		return uuid.Nil, s.invalid(name, errs)
	}
	return preset, nil
}

func (s *WorkspaceStorage) checkVersionOf(ctx context.Context, t target, tpl codersdk.Template, id uuid.UUID, name string) error {
	v, err := t.Client.TemplateVersion(ctx, id)
	if err != nil {
		if coderapi.IsNotFound(err) {
			return s.invalid(name, field.ErrorList{
				field.NotFound(field.NewPath("spec", "templateVersionID"), id.String())})
		}
		return s.coderErr(t, err, name)
	}
	if v.TemplateID == nil || *v.TemplateID != tpl.ID {
		return s.invalid(name, field.ErrorList{
			field.Invalid(field.NewPath("spec", "templateVersionID"), id.String(), fmt.Sprintf("not a version of template %q", tpl.Name))})
	}
	return nil
}

// stopNew leaves a just-created workspace stopped. coderd always queues a
// start build with a new workspace; it is canceled at once (before a
// provisioner picks it up, unless one already has) and a stop build
// follows, so the workspace does not stay running.
func (s *WorkspaceStorage) stopNew(ctx context.Context, t target, w *codersdk.Workspace) error {
	id := w.LatestBuild.ID
	if err := t.Client.CancelWorkspaceBuild(ctx, id, codersdk.CancelWorkspaceBuildParams{}); err != nil &&
		coderapi.StatusCode(err) != http.StatusBadRequest { // 400: the job already finished
		return fmt.Errorf("cancel the initial start build: %w", err)
	}
	if _, err := waitBuildDone(ctx, t.Client, id); err != nil {
		return err
	}
	if _, err := t.Client.CreateWorkspaceBuild(ctx, w.ID, codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionStop}); err != nil {
		return fmt.Errorf("queue the stop build: %w", err)
	}
	return nil
}

// waitBuildDone polls a build until its job has ended.
func waitBuildDone(ctx context.Context, client *codersdk.Client, id uuid.UUID) (codersdk.WorkspaceBuild, error) {
	tick := 200 * time.Millisecond
	for {
		b, err := client.WorkspaceBuild(ctx, id)
		if err != nil {
			return b, fmt.Errorf("read build %s: %w", id, err)
		}
		if !buildInProgress(b.Job.Status) {
			return b, nil
		}
		select {
		case <-ctx.Done():
			return b, fmt.Errorf("wait for build %s: %w", id, ctx.Err())
		case <-time.After(tick):
		}
		if tick < 2*time.Second {
			tick *= 2
		}
	}
}

// Update changes the workspace: schedule fields through their endpoints,
// run state, version and parameters through a build. With
// forceAllowCreate (server-side apply) a missing workspace is created.
func (s *WorkspaceStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc, updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, opts *metav1.UpdateOptions) (runtime.Object, bool, error) {
	return updateObject(ctx, s, name, objInfo, createValidation, updateValidation, forceAllowCreate, opts)
}

func (s *WorkspaceStorage) validateUpdate(next, cur *aggv1.CoderWorkspace, name string) field.ErrorList {
	return validateWorkspaceUpdate(next, cur, name)
}

// planUpdate makes a spec change in Coder: the schedule through its
// endpoints, then one build for run state, version and parameters.
func (s *WorkspaceStorage) planUpdate(n workspaceName, name string, cur, next *aggv1.CoderWorkspace) specUpdate {
	ch := workspaceChanges(&cur.Spec, &next.Spec)
	return specUpdate{changed: !ch.none(), apply: func(ctx context.Context, w *write) (object, func(*records.Record), error) {
		t, id := w.t, uuid.MustParse(cur.Status.ID)
		if ch.ttl {
			if err := t.Client.UpdateWorkspaceTTL(ctx, id, codersdk.UpdateWorkspaceTTLRequest{TTLMillis: next.Spec.TTLMillis}); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
		}
		if ch.autostart {
			if err := t.Client.UpdateWorkspaceAutostart(ctx, id, codersdk.UpdateWorkspaceAutostartRequest{Schedule: next.Spec.AutostartSchedule}); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
		}
		if ch.autoUpdates {
			if err := t.Client.UpdateWorkspaceAutomaticUpdates(ctx, id, codersdk.UpdateWorkspaceAutomaticUpdatesRequest{AutomaticUpdates: codersdk.AutomaticUpdates(next.Spec.AutomaticUpdates)}); err != nil {
				return nil, nil, s.coderErr(t, err, name)
			}
		}
		if ch.build() {
			req := codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionStop}
			if next.Spec.Running {
				req.Transition = codersdk.WorkspaceTransitionStart
			}
			version := uuid.MustParse(cur.Spec.TemplateVersionID)
			if ch.version {
				version = uuid.MustParse(next.Spec.TemplateVersionID) // validated
				req.TemplateVersionID = version
			}
			if ch.parameters {
				req.RichParameterValues = fromParameters(next.Spec.Parameters)
			}
			if spec := next.Spec; ch.parameters || ch.preset || cur.Spec.Preset != "" {
				// A build names the workspace's preset, or coderd would
				// record none and the next read would differ from the
				// spec; left out, it is the current one, dropped if the
				// new values differ from its own. Only the values the
				// update changes are checked against it: the others are
				// what a read showed.
				if !ch.preset {
					spec.Preset = cur.Spec.Preset
				}
				spec.Parameters = changedParameters(cur.Spec.Parameters, next.Spec.Parameters)
				preset, err := s.checkParameters(ctx, t, &spec, version, name, ch.preset)
				if err != nil {
					return nil, nil, err
				}
				req.TemplateVersionPresetID = preset
			}
			if _, err := t.Client.CreateWorkspaceBuild(ctx, id, req); err != nil {
				return nil, nil, s.buildErr(t, err, name, false)
			}
		}
		out, err := s.readCoder(ctx, t, n, name)
		if err != nil {
			return nil, nil, err
		}
		return out, nil, nil
	}}
}

// releaseDelete starts the delete build the last finalizer held.
func (s *WorkspaceStorage) releaseDelete(ctx context.Context, w *write, n workspaceName, name string, cur, next *aggv1.CoderWorkspace, dryRun bool) (runtime.Object, error) {
	if dryRun {
		return w.preview(next, withSpecOf(cur, next), nil), nil
	}
	t := w.t
	if err := s.startDeleteBuild(ctx, t, cur, name); err != nil {
		return nil, err
	}
	out, err := s.readCoder(ctx, t, n, name)
	if apierrors.IsNotFound(err) {
		return w.preview(next, cur.DeepCopy(), nil), w.forget(ctx)
	}
	if err != nil {
		return nil, err
	}
	return w.commit(ctx, next, out, nil)
}

// Delete starts a delete build. The workspace stays visible, with a
// deletionTimestamp, until coderd has finished it.
func (s *WorkspaceStorage) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, opts *metav1.DeleteOptions) (runtime.Object, bool, error) {
	return deleteObject(ctx, s, name, deleteValidation, opts)
}

// deleteUnderWay: a delete build is under way, or finalizers hold the
// deletion. (A deletionTimestamp without either is a deletion whose
// build failed: deleting again retries it.)
func (s *WorkspaceStorage) deleteUnderWay(cur *aggv1.CoderWorkspace) bool {
	return cur.DeletionTimestamp != nil && (slices.Contains(cur.Finalizers, FinalizerDeleteBuild) || heldByFinalizers(cur))
}

// deletePreview shows the delete build under way.
func (s *WorkspaceStorage) deletePreview(cur *aggv1.CoderWorkspace) (runtime.Object, bool) {
	out := cur.DeepCopy()
	now := metav1.Now()
	out.DeletionTimestamp = &now
	out.Finalizers = []string{FinalizerDeleteBuild}
	return out, false
}

func (s *WorkspaceStorage) deleteInCoder(ctx context.Context, w *write, n workspaceName, name string, cur *aggv1.CoderWorkspace) (runtime.Object, bool, error) {
	t := w.t
	if err := s.startDeleteBuild(ctx, t, cur, name); err != nil {
		return nil, false, err
	}
	out, err := s.read(ctx, t, n, name)
	if apierrors.IsNotFound(err) {
		// The delete build has already finished.
		return cur, true, w.forget(ctx)
	}
	return out, false, err
}

// startDeleteBuild queues cur's delete build in Coder: what a delete
// does, at once or once the last finalizer holding it is removed.
func (s *WorkspaceStorage) startDeleteBuild(ctx context.Context, t target, cur *aggv1.CoderWorkspace, name string) error {
	if _, err := t.Client.CreateWorkspaceBuild(ctx, uuid.MustParse(cur.Status.ID), codersdk.CreateWorkspaceBuildRequest{Transition: codersdk.WorkspaceTransitionDelete}); err != nil {
		return s.coderErr(t, err, name)
	}
	return nil
}

// workspaceChange says which parts of the spec an update changes.
type workspaceChange struct {
	ttl, autostart, autoUpdates, running, version, parameters, preset bool
}

func (c workspaceChange) none() bool {
	return !c.ttl && !c.autostart && !c.autoUpdates && !c.build()
}

func (c workspaceChange) build() bool { return c.running || c.version || c.parameters || c.preset }

func workspaceChanges(cur, next *aggv1.CoderWorkspaceSpec) workspaceChange {
	return workspaceChange{
		ttl:        !equalPtr(cur.TTLMillis, next.TTLMillis),
		autostart:  !equalPtr(cur.AutostartSchedule, next.AutostartSchedule),
		running:    cur.Running != next.Running,
		version:    next.TemplateVersionID != "" && next.TemplateVersionID != cur.TemplateVersionID,
		parameters: parametersChanged(cur.Parameters, next.Parameters),
		// Omitted, the preset and the automatic updates keep Coder's.
		preset:      next.Preset != "" && next.Preset != cur.Preset,
		autoUpdates: next.AutomaticUpdates != "" && next.AutomaticUpdates != cur.AutomaticUpdates,
	}
}

// parametersChanged reports whether next sets a value that differs from
// cur; parameters left out keep their value, as in Coder.
func parametersChanged(cur, next []aggv1.WorkspaceParameter) bool {
	return len(changedParameters(cur, next)) > 0
}

// changedParameters is the values of next that differ from cur's.
func changedParameters(cur, next []aggv1.WorkspaceParameter) []aggv1.WorkspaceParameter {
	var out []aggv1.WorkspaceParameter
	for _, p := range next {
		i := slices.IndexFunc(cur, func(c aggv1.WorkspaceParameter) bool { return c.Name == p.Name })
		if i < 0 || cur[i].Value != p.Value {
			out = append(out, p)
		}
	}
	return out
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

func fromParameters(in []aggv1.WorkspaceParameter) []codersdk.WorkspaceBuildParameter {
	if len(in) == 0 {
		return nil
	}
	out := make([]codersdk.WorkspaceBuildParameter, len(in))
	for i, p := range in {
		out[i] = codersdk.WorkspaceBuildParameter{Name: p.Name, Value: p.Value}
	}
	return out
}

// dryRunWorkspace is what a create would return, without asking coderd.
func dryRunWorkspace(ws *aggv1.CoderWorkspace, t target, n workspaceName) *aggv1.CoderWorkspace {
	out := ws.DeepCopy()
	out.Namespace = t.Namespace
	out.Spec.Organization = n.Org
	out.Labels = objectLabels(t, n.Org, map[string]string{aggv1.LabelOwner: n.Owner, aggv1.LabelTemplate: ws.Spec.TemplateName})
	out.CreationTimestamp = metav1.Now()
	out.Status = aggv1.CoderWorkspaceStatus{Owner: n.Owner, Organization: n.Org, Template: ws.Spec.TemplateName}
	return out
}
