package mcpserver

// One file (over 500 lines) for the template and workspace tools: their
// input and output types are the tools' JSON schemas, so they stay next to
// the handlers that fill them.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// Source files shown by get_template are capped per file and in total.
const (
	defaultFileBytes = 4 << 10
	maxFileBytes     = 64 << 10
	maxSourceBytes   = 128 << 10
	maxWaitSeconds   = 120
)

// ListInput pages through a list.
type ListInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"Kubernetes namespace; empty means every namespace"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 500)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, for the next rows"`
}

// ObjectInput names one namespaced object.
type ObjectInput struct {
	Namespace string `json:"namespace" jsonschema:"Kubernetes namespace of the object"`
	Name      string `json:"name" jsonschema:"object name"`
}

// TemplateRow is one template in a list.
type TemplateRow struct {
	Namespace     string `json:"namespace"`
	Name          string `json:"name" jsonschema:"<organization>.<template>"`
	DisplayName   string `json:"displayName,omitempty"`
	ActiveVersion string `json:"activeVersion,omitempty"`
	BuildStatus   string `json:"buildStatus,omitempty"`
	Deprecated    bool   `json:"deprecated,omitempty"`
}

// TemplateList is a page of templates.
type TemplateList struct {
	Items    []TemplateRow `json:"items"`
	Continue string        `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

// GetTemplateInput names a template and what to show of its source.
type GetTemplateInput struct {
	Namespace    string `json:"namespace" jsonschema:"Kubernetes namespace of the template"`
	Name         string `json:"name" jsonschema:"<organization>.<template>"`
	IncludeFiles bool   `json:"includeFiles,omitempty" jsonschema:"also return the source files of the active version"`
	MaxFileBytes int    `json:"maxFileBytes,omitempty" jsonschema:"bytes shown per file (default 4096, at most 65536); longer files are cut"`
}

// TemplateDetail is one template.
type TemplateDetail struct {
	Namespace         string               `json:"namespace"`
	Name              string               `json:"name"`
	Organization      string               `json:"organization"`
	DisplayName       string               `json:"displayName,omitempty"`
	Description       string               `json:"description,omitempty"`
	ActiveVersionID   string               `json:"activeVersionID,omitempty"`
	ActiveVersionName string               `json:"activeVersionName,omitempty"`
	BuildStatus       string               `json:"buildStatus,omitempty"`
	BuildError        string               `json:"buildError,omitempty"`
	Deprecated        bool                 `json:"deprecated,omitempty"`
	ActiveUsers       int32                `json:"activeUsers"`
	UpdatedAt         string               `json:"updatedAt,omitempty"`
	Settings          map[string]any       `json:"settings,omitempty" jsonschema:"the template's settings in Coder as CoderTemplate.spec names them (defaultTTL, activityBump, requireActiveVersion, access: who may use and administer it, ...)"`
	Variables         []TemplateVariable   `json:"variables,omitempty" jsonschema:"the Terraform variables of the version the files show; a sensitive one's value is never shown"`
	FileNames         []string             `json:"fileNames,omitempty" jsonschema:"paths of the source files"`
	Files             map[string]string    `json:"files,omitempty" jsonschema:"source files (with includeFiles), cut to maxFileBytes"`
	TruncatedFiles    []string             `json:"truncatedFiles,omitempty" jsonschema:"files that were cut or left out to stay within the size caps"`
	Versions          []TemplateVersionRow `json:"versions,omitempty" jsonschema:"the template's newest versions, newest first (list_template_versions lists them all)"`
	VersionsError     string               `json:"versionsError,omitempty" jsonschema:"why the versions could not be listed (the rest of the answer stands)"`
}

// TemplateVariable is one Terraform variable of a template.
type TemplateVariable struct {
	Name      string `json:"name"`
	Type      string `json:"type,omitempty"`
	Required  bool   `json:"required,omitempty"`
	Sensitive bool   `json:"sensitive,omitempty"`
	// Value is set only for a literal value the spec gives.
	Value string `json:"value,omitempty" jsonschema:"the value the spec gives literally (never a sensitive one or one from a Secret)"`
	// Secret names where a value read from a Secret came from.
	Secret string `json:"secret,omitempty" jsonschema:"<secret>/<key> the value was read from (the value itself is not shown)"`
}

// templateSettings are t's settings: its spec without what TemplateDetail
// shows otherwise (names, files, variables, the version).
func templateSettings(t *aggv1.CoderTemplate) (map[string]any, error) {
	raw, err := json.Marshal(t.Spec)
	if err != nil {
		return nil, fmt.Errorf("encode the spec of %s: %w", t.Name, err)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("decode the spec of %s: %w", t.Name, err)
	}
	for _, k := range []string{"organization", "displayName", "description", "icon", "versionID", "files", "variables"} {
		delete(out, k)
	}
	return out, nil
}

// templateVariables lists t's variables as status.variables describes
// them, with the values spec.variables gives literally.
func templateVariables(t *aggv1.CoderTemplate) []TemplateVariable {
	literal := map[string]string{}
	for _, v := range t.Spec.Variables {
		if v.ValueFrom == nil {
			literal[v.Name] = v.Value
		}
	}
	var out []TemplateVariable
	for _, v := range t.Status.Variables {
		row := TemplateVariable{Name: v.Name, Type: v.Type, Required: v.Required, Sensitive: v.Sensitive}
		if ref := v.SecretKeyRef; ref != nil {
			row.Secret = ref.Name + "/" + ref.Key
		} else if !v.Sensitive {
			row.Value = literal[v.Name]
		}
		out = append(out, row)
	}
	return out
}

// WorkspaceListInput filters workspaces.
type WorkspaceListInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"Kubernetes namespace; empty means every namespace"`
	Owner     string `json:"owner,omitempty" jsonschema:"only workspaces of this Coder username"`
	Template  string `json:"template,omitempty" jsonschema:"only workspaces built from this template name"`
	Running   *bool  `json:"running,omitempty" jsonschema:"only workspaces whose desired state is running (true) or stopped (false)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 500)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, for the next rows"`
}

// WorkspaceRow is one workspace in a list.
type WorkspaceRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name" jsonschema:"<organization>.<owner>.<workspace>"`
	Owner     string `json:"owner"`
	Template  string `json:"template"`
	Status    string `json:"status" jsonschema:"Coder's workspace status: running, stopped, starting, failed, ..."`
	Running   bool   `json:"running" jsonschema:"desired run state"`
	LastBuilt string `json:"lastBuilt,omitempty"`
}

// WorkspaceList is a page of workspaces.
type WorkspaceList struct {
	Items    []WorkspaceRow `json:"items"`
	Continue string         `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

// WorkspaceDetail is one workspace.
type WorkspaceDetail struct {
	Namespace         string  `json:"namespace"`
	Name              string  `json:"name"`
	ID                string  `json:"id"`
	Owner             string  `json:"owner"`
	Organization      string  `json:"organization"`
	Template          string  `json:"template"`
	TemplateVersionID string  `json:"templateVersionID,omitempty"`
	Status            string  `json:"status"`
	Running           bool    `json:"running"`
	Ready             bool    `json:"ready" jsonschema:"the workspace is usable: its start build succeeded and every agent is connected and ready (the Ready condition says why not)"`
	Healthy           bool    `json:"healthy"`
	Outdated          bool    `json:"outdated"`
	TTLMillis         *int64  `json:"ttlMillis,omitempty"`
	AutostartSchedule string  `json:"autostartSchedule,omitempty"`
	AutoShutdownAt    string  `json:"autoShutdownAt,omitempty"`
	LastUsedAt        string  `json:"lastUsedAt,omitempty"`
	URL               string  `json:"url,omitempty"`
	LatestBuild       *Build  `json:"latestBuild,omitempty"`
	Agents            []Agent `json:"agents,omitempty" jsonschema:"the Coder agents of the latest build: connection status, lifecycle state, health and apps"`
	// Parameters are the latest build's values (without ephemeral ones).
	Parameters map[string]string `json:"parameters,omitempty"`
	Preset     string            `json:"preset,omitempty"`
	Conditions []string          `json:"conditions,omitempty" jsonschema:"each as: Type=Status (Reason): message"`
	Deleting   bool              `json:"deleting,omitempty" jsonschema:"a delete build is under way"`
}

// Build summarises a workspace build.
type Build struct {
	ID         string `json:"id"`
	Number     int32  `json:"number"`
	Transition string `json:"transition" jsonschema:"start, stop or delete"`
	JobStatus  string `json:"jobStatus" jsonschema:"pending, running, succeeded, canceling, canceled or failed"`
	Error      string `json:"error,omitempty"`
	CreatedAt  string `json:"createdAt"`
}

// SetRunningInput starts or stops a workspace.
type SetRunningInput struct {
	Namespace   string `json:"namespace" jsonschema:"Kubernetes namespace of the workspace"`
	Name        string `json:"name" jsonschema:"<organization>.<owner>.<workspace>"`
	Running     bool   `json:"running" jsonschema:"true starts the workspace, false stops it"`
	WaitSeconds int    `json:"waitSeconds,omitempty" jsonschema:"wait up to this many seconds (at most 120) for the build to finish; 0 returns at once"`
}

// SetRunningResult says which build was started and how far it got.
type SetRunningResult struct {
	Workspace  WorkspaceDetail `json:"workspace"`
	Changed    bool            `json:"changed" jsonschema:"false when the workspace already had this desired state"`
	BuildDone  bool            `json:"buildDone" jsonschema:"the latest build has finished"`
	WaitedSecs float64         `json:"waitedSeconds"`
}

// The aggregated resources the tools read and write.
const (
	workspacesResource = "coderworkspaces"
	templatesResource  = "codertemplates"
)

func (s *Server) templateTools() []tool {
	return []tool{
		define(s, "list_templates", toolMeta{
			Title:       "List Coder templates",
			Description: "Lists Coder templates (CoderTemplate objects) with their active version and build status, a page at a time. Use get_template for one template's details or source files.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, listTemplates),
		define(s, "get_template", toolMeta{
			Title:       "Get a Coder template",
			Description: "Shows one Coder template: active version, its build status and error, deprecation, and optionally its source files (capped in size).",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, getTemplate),
	}
}

func listTemplates(ctx context.Context, c *call, in ListInput) (TemplateList, error) {
	var list partialList[templateRowSource]
	if err := c.listPartial(ctx, templatesResource, in.Namespace, listQuery(in.Continue), &list); err != nil {
		return TemplateList{}, fmt.Errorf("list codertemplates: %w", err)
	}
	if err := sortListed(ctx, c, in.Namespace, list.Items, errNoNamespace); err != nil {
		return TemplateList{}, err
	}
	items, next, err := pageAt(list.Items, in.Limit, in.Continue, list.Metadata.ResourceVersion)
	if err != nil {
		return TemplateList{}, err
	}
	out := TemplateList{Items: make([]TemplateRow, len(items)), Continue: next}
	for i, t := range items {
		out.Items[i] = t.row()
	}
	return out, nil
}

// templateRowSource is what a TemplateRow shows of a CoderTemplate (same
// JSON names), so listing skips the rest, spec.files above all.
type templateRowSource struct {
	rowMeta `json:"metadata"`
	Spec    struct {
		DisplayName string `json:"displayName"`
	} `json:"spec"`
	Status struct {
		ActiveVersionName string `json:"activeVersionName"`
		BuildStatus       string `json:"buildStatus"`
		Deprecated        bool   `json:"deprecated"`
	} `json:"status"`
}

func (t *templateRowSource) row() TemplateRow {
	return TemplateRow{Namespace: t.Namespace, Name: t.Name, DisplayName: t.Spec.DisplayName,
		ActiveVersion: t.Status.ActiveVersionName, BuildStatus: t.Status.BuildStatus, Deprecated: t.Status.Deprecated}
}

func getTemplate(ctx context.Context, c *call, in GetTemplateInput) (TemplateDetail, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return TemplateDetail{}, err
	}
	var t aggv1.CoderTemplate
	if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: in.Namespace, Name: in.Name}, &t); err != nil {
		return TemplateDetail{}, fmt.Errorf("get codertemplate %s/%s: %w", in.Namespace, in.Name, err)
	}
	d := TemplateDetail{
		Namespace: t.Namespace, Name: t.Name, Organization: t.Spec.Organization, DisplayName: t.Spec.DisplayName,
		Description: t.Spec.Description, ActiveVersionID: t.Status.ActiveVersionID, ActiveVersionName: t.Status.ActiveVersionName,
		BuildStatus: t.Status.BuildStatus, BuildError: t.Status.BuildError, Deprecated: t.Status.Deprecated,
		ActiveUsers: t.Status.ActiveUserCount,
	}
	if t.Status.UpdatedAt != nil {
		d.UpdatedAt = t.Status.UpdatedAt.UTC().Format(time.RFC3339)
	}
	settings, err := templateSettings(&t)
	if err != nil {
		return TemplateDetail{}, err
	}
	d.Settings, d.Variables = settings, templateVariables(&t)
	for p := range t.Spec.Files {
		d.FileNames = append(d.FileNames, p)
	}
	sort.Strings(d.FileNames)
	if in.IncludeFiles {
		d.Files, d.TruncatedFiles = capFiles(t.Spec.Files, d.FileNames, in.MaxFileBytes)
	}
	if d.Versions, err = newestVersions(ctx, c, &t); err != nil {
		d.VersionsError = err.Error()
	}
	return d, nil
}

// capFiles returns files cut to perFile bytes each and maxSourceBytes in
// all, and the names of the files cut or left out.
func capFiles(files map[string]string, names []string, perFile int) (map[string]string, []string) {
	if perFile <= 0 {
		perFile = defaultFileBytes
	}
	perFile = min(perFile, maxFileBytes)
	out := map[string]string{}
	var cut []string
	total := 0
	for _, n := range names {
		content := files[n]
		if len(content) > perFile {
			content = content[:perFile]
			cut = append(cut, n)
		}
		if total+len(content) > maxSourceBytes {
			if !slices.Contains(cut, n) {
				cut = append(cut, n)
			}
			continue
		}
		total += len(content)
		out[n] = content
	}
	return out, cut
}

func (s *Server) workspaceTools() []tool {
	return []tool{
		define(s, "list_workspaces", toolMeta{
			Title:       "List Coder workspaces",
			Description: "Lists Coder workspaces (CoderWorkspace objects), optionally only one owner's, one template's, or running/stopped ones, a page at a time, with status and desired run state.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, listWorkspaces),
		define(s, "get_workspace", toolMeta{
			Title:       "Get a Coder workspace",
			Description: "Shows one Coder workspace: status, desired run state, whether it is ready to use, its agents (connection, lifecycle, apps), latest build (transition, job status, error), schedule, health and URL.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, getWorkspace),
		define(s, "set_workspace_running", toolMeta{
			Title:       "Start or stop a Coder workspace",
			Description: "Starts (running: true) or stops (running: false) a Coder workspace with a build. Returns at once with the build ID and status; set waitSeconds to wait (at most 120 s) for the build to finish. Calling it again with the same state changes nothing.",
			Idempotent:  true, OpenWorld: true,
		}, setWorkspaceRunning),
		define(s, "delete_workspace", toolMeta{
			Title:       "Delete a Coder workspace",
			Description: "Deletes a Coder workspace and its resources with a delete build. Irreversible. The workspace stays visible (deleting: true) until the build finishes.",
			Destructive: true, Idempotent: true, OpenWorld: true,
		}, deleteWorkspace),
	}
}

func listWorkspaces(ctx context.Context, c *call, in WorkspaceListInput) (WorkspaceList, error) {
	q := listQuery(in.Continue)
	labels := map[string]string{}
	if in.Owner != "" {
		labels[aggv1.LabelOwner] = in.Owner
	}
	if in.Template != "" {
		labels[aggv1.LabelTemplate] = in.Template
	}
	if len(labels) > 0 {
		q.Set("labelSelector", k8slabels.SelectorFromSet(labels).String())
	}
	if in.Running != nil {
		q.Set("fieldSelector", fields.OneTermEqualSelector("spec.running", strconv.FormatBool(*in.Running)).String())
	}
	var list partialList[workspaceRowSource]
	if err := c.listPartial(ctx, workspacesResource, in.Namespace, q, &list); err != nil {
		return WorkspaceList{}, fmt.Errorf("list coderworkspaces: %w", err)
	}
	if err := sortListed(ctx, c, in.Namespace, list.Items, errNoNamespace); err != nil {
		return WorkspaceList{}, err
	}
	items, next, err := pageAt(list.Items, in.Limit, in.Continue, list.Metadata.ResourceVersion)
	if err != nil {
		return WorkspaceList{}, err
	}
	out := WorkspaceList{Items: make([]WorkspaceRow, len(items)), Continue: next}
	for i := range items {
		out.Items[i] = items[i].row()
	}
	return out, nil
}

// workspaceRowSource is what a WorkspaceRow shows of a CoderWorkspace (same
// JSON names), so listing skips the rest of each object.
type workspaceRowSource struct {
	rowMeta `json:"metadata"`
	Spec    struct {
		TemplateName string `json:"templateName"`
		Running      bool   `json:"running"`
	} `json:"spec"`
	Status struct {
		Owner       string `json:"owner"`
		Phase       string `json:"phase"`
		LatestBuild *struct {
			CreatedAt metav1.Time `json:"createdAt"`
		} `json:"latestBuild"`
	} `json:"status"`
}

func (w *workspaceRowSource) row() WorkspaceRow {
	row := WorkspaceRow{Namespace: w.Namespace, Name: w.Name, Owner: w.Status.Owner,
		Template: w.Spec.TemplateName, Status: w.Status.Phase, Running: w.Spec.Running}
	if b := w.Status.LatestBuild; b != nil {
		row.LastBuilt = b.CreatedAt.UTC().Format(time.RFC3339)
	}
	return row
}

func getWorkspace(ctx context.Context, c *call, in ObjectInput) (WorkspaceDetail, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return WorkspaceDetail{}, err
	}
	w, err := c.getWorkspace(ctx, in.Namespace, in.Name)
	if err != nil {
		return WorkspaceDetail{}, err
	}
	return workspaceDetail(w), nil
}

func (c *call) getWorkspace(ctx context.Context, namespace, name string) (*aggv1.CoderWorkspace, error) {
	var w aggv1.CoderWorkspace
	if err := c.kube.Direct.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &w); err != nil {
		return nil, fmt.Errorf("get coderworkspace %s/%s: %w", namespace, name, err)
	}
	return &w, nil
}

func setWorkspaceRunning(ctx context.Context, c *call, in SetRunningInput) (SetRunningResult, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return SetRunningResult{}, err
	}
	if in.WaitSeconds < 0 || in.WaitSeconds > maxWaitSeconds {
		return SetRunningResult{}, fmt.Errorf("waitSeconds must be between 0 and %d, got %d", maxWaitSeconds, in.WaitSeconds)
	}
	w, err := c.getWorkspace(ctx, in.Namespace, in.Name)
	if err != nil {
		return SetRunningResult{}, err
	}
	res := SetRunningResult{Changed: w.Spec.Running != in.Running}
	if res.Changed {
		patch := fmt.Appendf(nil, `{"spec":{"running":%t}}`, in.Running)
		if err := c.kube.Direct.Patch(ctx, w, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return SetRunningResult{}, fmt.Errorf("set spec.running of coderworkspace %s/%s: %w", in.Namespace, in.Name, err)
		}
	}
	start := time.Now()
	deadline := start.Add(time.Duration(in.WaitSeconds) * time.Second)
	for !buildDone(w) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return SetRunningResult{}, ctx.Err()
		case <-time.After(time.Second):
		}
		if w, err = c.getWorkspace(ctx, in.Namespace, in.Name); err != nil {
			return SetRunningResult{}, err
		}
	}
	res.Workspace, res.BuildDone, res.WaitedSecs = workspaceDetail(w), buildDone(w), time.Since(start).Round(time.Millisecond).Seconds()
	return res, nil
}

func deleteWorkspace(ctx context.Context, c *call, in ObjectInput) (WorkspaceDetail, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return WorkspaceDetail{}, err
	}
	w, err := c.getWorkspace(ctx, in.Namespace, in.Name)
	if err != nil {
		return WorkspaceDetail{}, err
	}
	if err := c.kube.Direct.Delete(ctx, w); err != nil {
		return WorkspaceDetail{}, fmt.Errorf("delete coderworkspace %s/%s: %w", in.Namespace, in.Name, err)
	}
	if after, err := c.getWorkspace(ctx, in.Namespace, in.Name); err == nil {
		w = after
	} else {
		w.Status.Phase = "deleted"
	}
	d := workspaceDetail(w)
	d.Deleting = true
	return d, nil
}

func buildDone(w *aggv1.CoderWorkspace) bool {
	b := w.Status.LatestBuild
	if b == nil {
		return true
	}
	switch b.JobStatus {
	case "pending", "running", "canceling":
		return false
	}
	return true
}

func workspaceDetail(w *aggv1.CoderWorkspace) WorkspaceDetail {
	d := WorkspaceDetail{
		Namespace: w.Namespace, Name: w.Name, ID: w.Status.ID, Owner: w.Status.Owner, Organization: w.Spec.Organization,
		Template: w.Spec.TemplateName, TemplateVersionID: w.Spec.TemplateVersionID, Status: w.Status.Phase,
		Running: w.Spec.Running, Healthy: w.Status.Healthy, Outdated: w.Status.Outdated, TTLMillis: w.Spec.TTLMillis,
		URL: w.Status.URL, Deleting: w.DeletionTimestamp != nil,
	}
	if w.Spec.AutostartSchedule != nil {
		d.AutostartSchedule = *w.Spec.AutostartSchedule
	}
	if t := w.Status.AutoShutdownDeadline; t != nil {
		d.AutoShutdownAt = t.UTC().Format(time.RFC3339)
	}
	if t := w.Status.LastUsedAt; t != nil {
		d.LastUsedAt = t.UTC().Format(time.RFC3339)
	}
	if b := w.Status.LatestBuild; b != nil {
		d.LatestBuild = &Build{ID: b.ID, Number: b.Number, Transition: b.Transition, JobStatus: b.JobStatus,
			Error: b.Error, CreatedAt: b.CreatedAt.UTC().Format(time.RFC3339)}
	}
	for _, p := range w.Spec.Parameters {
		if d.Parameters == nil {
			d.Parameters = map[string]string{}
		}
		d.Parameters[p.Name] = p.Value
	}
	d.Preset = w.Spec.Preset
	d.Agents = agents(w.Status.Agents)
	for _, cond := range w.Status.Conditions {
		if cond.Type == aggv1.ConditionReady {
			d.Ready = cond.Status == metav1.ConditionTrue
		}
		d.Conditions = append(d.Conditions, fmt.Sprintf("%s=%s (%s): %s", cond.Type, cond.Status, cond.Reason, cond.Message))
	}
	return d
}

// requireObject says what is missing before any call is made.
func requireObject(namespace, name string) error { return requireNamed(namespace, "name", name) }

// requireNamed is requireObject for an input whose name argument is
// called arg (for example "pod").
func requireNamed(namespace, arg, name string) error {
	switch {
	case namespace == "" && name == "":
		return fmt.Errorf("namespace and %s are required", arg)
	case namespace == "":
		return fmt.Errorf("namespace is required")
	case name == "":
		return fmt.Errorf("%s is required", arg)
	}
	return nil
}

// sortListed orders a list's items by namespace and name, the order
// pages are cut in. An empty list in a namespace that does not exist is
// noNamespace's error rather than an empty page: the namespace is
// probably misspelt.
func sortListed[T any, PT interface {
	*T
	named
}](ctx context.Context, c *call, namespace string, items []T, noNamespace func(string) error) error {
	if len(items) == 0 && namespace != "" && c.namespaceMissing(ctx, namespace) {
		return noNamespace(namespace)
	}
	sort.Slice(items, func(i, j int) bool { return key(PT(&items[i])) < key(PT(&items[j])) })
	return nil
}

// named is what sortListed orders by; objects and row sources have it.
type named interface {
	GetNamespace() string
	GetName() string
}

// key sorts objects by namespace, then name.
func key(o named) string { return o.GetNamespace() + "/" + o.GetName() }

// rowMeta is the metadata a row shows.
type rowMeta struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (m *rowMeta) GetNamespace() string { return m.Namespace }
func (m *rowMeta) GetName() string      { return m.Name }

// partialList is a list response decoded into row sources R.
type partialList[R any] struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []R `json:"items"`
}

// listPartial reads a list of resource (aggregation.coder.com) in
// namespace ("" for all) and decodes into out only the fields out
// declares (decodeSparse). A list tool shows a few fields of each object;
// decoding whole objects through the typed client was most of a call's
// time (two passes over about 480 KiB of JSON for 300 workspaces).
func (c *call) listPartial(ctx context.Context, resource, namespace string, q url.Values, out any) error {
	path := "/apis/" + aggv1.SchemeGroupVersion.String() + "/"
	if namespace != "" {
		path += "namespaces/" + namespace + "/"
	}
	req := c.kube.Clientset.Discovery().RESTClient().Get().AbsPath(path+resource).SetHeader("Accept", "application/json")
	for k, vs := range q {
		for _, v := range vs {
			req.Param(k, v)
		}
	}
	res := req.Do(ctx)
	// Error, not Raw's error: it turns kube-apiserver's Status into an
	// APIStatus error with the server's message (for example which coderd
	// is unreachable), where Raw's is a generic one for the status code.
	if err := res.Error(); err != nil {
		return err
	}
	body, err := res.Raw()
	if err != nil {
		return err
	}
	if err := decodeSparse(body, out); err != nil {
		return fmt.Errorf("decode the list: %w", err)
	}
	return nil
}
