package storage

// The log subresources: a workspace build's log and a template version's
// import log, read from coderd as the caller and served as text the way
// pods/log is.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/registry/rest"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// jobLog is one provisioner job's log as coderd serves it: what the log
// subresources read, whichever object the job belongs to.
type jobLog struct {
	client *codersdk.Client
	// path is coderd's logs endpoint of the job's owner (a build or a
	// template version).
	path string
	job  codersdk.ProvisionerJob
	// follow streams the entries after the given ID until the job ends.
	follow func(ctx context.Context, after int64) (<-chan codersdk.ProvisionerJobLog, io.Closer, error)
	// refresh reads the job again, for its end state after a follow.
	refresh func(ctx context.Context) (codersdk.ProvisionerJob, error)
	// ended remembers the logs of ended jobs, which never change, for
	// the coderd key coderd: a read of one then costs coderd only the
	// read of its owner, which says whether the caller may see it.
	ended  *endedLogs
	coderd string
}

// endedLogs are the log entries of ended jobs by job ID, per coderd.
type endedLogs = coderdFacts[uuid.UUID, []codersdk.ProvisionerJobLog]

// maxEndedLogs bounds the ended jobs' logs kept per kind: a build log of
// 3,000 lines holds about 0.5 MiB.
const maxEndedLogs = 32

// read returns the job's log so far, remembered when the job had ended
// before it was read.
func (j *jobLog) read(ctx context.Context) ([]codersdk.ProvisionerJobLog, error) {
	ended := j.job.CompletedAt != nil
	if ended {
		if got, ok := j.ended.known(j.coderd, j.job.ID); ok {
			return got, nil
		}
	}
	got, err := j.entries(ctx)
	if err == nil && ended {
		j.ended.add(j.coderd, j.job.ID, got)
	}
	return got, err
}

// entries reads the job's log so far (coderd's logs endpoint without
// follow: one JSON array).
func (j *jobLog) entries(ctx context.Context) ([]codersdk.ProvisionerJobLog, error) {
	res, err := j.client.Request(ctx, http.MethodGet, j.path, nil)
	if err != nil {
		return nil, err
	}
	defer func() { _ = res.Body.Close() }()
	if res.StatusCode != http.StatusOK {
		return nil, codersdk.ReadBodyAsError(res)
	}
	var out []codersdk.ProvisionerJobLog
	if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("decode %s: %w", j.path, err)
	}
	return out, nil
}

// logRenderer turns log entries into the lines the coder CLI prints for a
// build: a "==> ⧗ <stage>" header where a stage starts (in place of the
// stage's empty first entry), "=== ✔ <stage> [<n>ms]" where it ends (✘
// for the last stage of a job that did not succeed), and each entry's
// output. Every level is shown, as the CLI does with --verbose.
type logRenderer struct {
	timestamps bool
	stage      string
	started    time.Time
	lines      []string
}

func (r *logRenderer) line(at time.Time, s string) {
	if r.timestamps {
		s = at.UTC().Format(time.RFC3339Nano) + " " + s
	}
	r.lines = append(r.lines, s)
}

func (r *logRenderer) entry(l codersdk.ProvisionerJobLog) {
	if l.Stage != "" && l.Stage != r.stage {
		r.endStage(l.CreatedAt, true)
		r.stage, r.started = l.Stage, l.CreatedAt
		r.line(l.CreatedAt, "==> ⧗ "+l.Stage)
		if l.Output == "" {
			return
		}
	}
	r.line(l.CreatedAt, l.Output)
}

func (r *logRenderer) endStage(at time.Time, ok bool) {
	if r.stage == "" {
		return
	}
	mark := "✔"
	if !ok {
		mark = "✘"
	}
	d := max(at.Sub(r.started), 0)
	r.line(at, fmt.Sprintf("=== %s %s [%dms]", mark, r.stage, d.Milliseconds()))
	r.stage = ""
}

// end closes the last stage of a finished job.
func (r *logRenderer) end(job codersdk.ProvisionerJob) {
	if job.CompletedAt != nil {
		r.endStage(*job.CompletedAt, job.Status == codersdk.ProvisionerJobSucceeded)
	}
}

// take returns the lines rendered since the last take, each ending in a
// newline.
func (r *logRenderer) take() []byte {
	n := 0
	for _, l := range r.lines {
		n += len(l) + 1
	}
	b := make([]byte, 0, n)
	for _, l := range r.lines {
		b = append(append(b, l...), '\n')
	}
	r.lines = r.lines[:0]
	return b
}

// tail keeps the last n rendered lines.
func (r *logRenderer) tail(n *int64) {
	if n != nil && int64(len(r.lines)) > *n {
		r.lines = r.lines[int64(len(r.lines))-*n:]
	}
}

// validateLogOptions checks the options; build only for workspaces.
func validateLogOptions(o *aggv1.CoderLogOptions, builds bool) field.ErrorList {
	var errs field.ErrorList
	if o.TailLines != nil && *o.TailLines < 0 {
		errs = append(errs, field.Invalid(field.NewPath("tailLines"), *o.TailLines, "must be 0 or more"))
	}
	switch {
	case o.Build != nil && !builds:
		errs = append(errs, field.Forbidden(field.NewPath("build"), "a template version has one import log; build applies to coderworkspaces"))
	case o.Build != nil && *o.Build < 1:
		errs = append(errs, field.Invalid(field.NewPath("build"), *o.Build, "build numbers start at 1"))
	}
	return errs
}

var logOptionsKind = aggv1.SchemeGroupVersion.WithKind("CoderLogOptions").GroupKind()

// logOptions is the request's options, checked.
func logOptions(opts runtime.Object, name string, builds bool) (*aggv1.CoderLogOptions, error) {
	o, ok := opts.(*aggv1.CoderLogOptions)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("expected CoderLogOptions, got %T", opts))
	}
	if errs := validateLogOptions(o, builds); len(errs) > 0 {
		return nil, apierrors.NewInvalid(logOptionsKind, name, errs)
	}
	return o, nil
}

// stream reads j's log as o asks: at once when the job has ended or o
// does not follow, else as a stream that ends with the job or the request.
func (j *jobLog) stream(ctx context.Context, o *aggv1.CoderLogOptions) (*logStream, error) {
	r := &logRenderer{timestamps: o.Timestamps}
	got, err := j.read(ctx)
	if err != nil {
		return nil, err
	}
	var last int64
	for _, l := range got {
		r.entry(l)
		last = l.ID
	}
	done := j.job.CompletedAt != nil
	if done || !o.Follow {
		if done {
			r.end(j.job)
		}
		r.tail(o.TailLines)
		return &logStream{text: r.take()}, nil
	}
	r.tail(o.TailLines)
	first := r.take()
	return &logStream{follow: func(ctx context.Context, w io.Writer) error {
		if _, err := w.Write(first); err != nil {
			return err
		}
		return j.followFrom(ctx, last, r, w)
	}}, nil
}

// followFrom streams the entries after ID last until the job ends (coderd
// closes the stream) or ctx ends.
func (j *jobLog) followFrom(ctx context.Context, last int64, r *logRenderer, w io.Writer) error {
	ch, closer, err := j.follow(ctx, last)
	if err != nil {
		return fmt.Errorf("follow %s: %w", j.path, err)
	}
	defer func() { _ = closer.Close() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case l, ok := <-ch:
			if !ok {
				job, err := j.refresh(ctx)
				if err != nil {
					return fmt.Errorf("read the job after its log ended: %w", err)
				}
				r.end(job)
				_, err = w.Write(r.take())
				return err
			}
			if l.ID <= last {
				continue
			}
			last = l.ID
			r.entry(l)
			if _, err := w.Write(r.take()); err != nil {
				return err
			}
		}
	}
}

// logStream is the log subresource's answer: the whole text, or a follow
// that writes lines as coderd sends them. It is a rest.ResourceStreamer.
type logStream struct {
	text   []byte
	follow func(ctx context.Context, w io.Writer) error
}

var _ rest.ResourceStreamer = (*logStream)(nil)

func (s *logStream) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the stream's text; a follow is not copied (the
// API machinery never copies a streamer).
func (s *logStream) DeepCopyObject() runtime.Object {
	return &logStream{text: append([]byte(nil), s.text...), follow: s.follow}
}

// InputStream returns the text, or a pipe a goroutine writes the follow
// into. ctx is the request's: the goroutine ends when the client goes
// away, when the reader is closed, or when the job ends.
func (s *logStream) InputStream(ctx context.Context, _, _ string) (io.ReadCloser, bool, string, error) {
	if s.follow == nil {
		return io.NopCloser(bytes.NewReader(s.text)), false, "text/plain", nil
	}
	ctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = pw.CloseWithError(s.follow(ctx, pw))
	})
	return &followReader{PipeReader: pr, stop: func() { cancel(); _ = pr.Close(); wg.Wait() }}, true, "text/plain", nil
}

// followReader stops its writer when closed.
type followReader struct {
	*io.PipeReader
	stop func()
}

func (f *followReader) Close() error {
	f.stop()
	return nil
}

// logSubresource is what the two log subresources share: the options
// type, text/plain for OpenAPI, and the ended jobs' logs they remember.
type logSubresource struct {
	// object is the parent resource's object, for New.
	object func() runtime.Object
	ended  endedLogs
}

func newLogSubresource(object func() runtime.Object) logSubresource {
	return logSubresource{object: object, ended: endedLogs{max: maxEndedLogs}}
}

func (l *logSubresource) New() runtime.Object { return l.object() }
func (l *logSubresource) Destroy()            {}
func (l *logSubresource) NewGetOptions() (runtime.Object, bool, string) {
	return &aggv1.CoderLogOptions{}, false, ""
}
func (l *logSubresource) ProducesMIMETypes(string) []string { return []string{"text/plain"} }
func (l *logSubresource) ProducesObject(string) any         { return "" }

// WorkspaceLogStorage serves coderworkspaces/log: a build's log.
type WorkspaceLogStorage struct {
	logSubresource
	ws *WorkspaceStorage
	// ids remembers the IDs of the workspaces whose logs were read, by
	// owner and name: coderd's builds list of a workspace ID (limit 1)
	// answers the latest build in half the time of its workspace read.
	ids coderdFacts[workspaceRef, uuid.UUID]
}

// workspaceRef is a workspace by organization (checked when its ID was
// remembered), owner and name.
type workspaceRef struct{ org, owner, name string }

// NewWorkspaceLog returns the log subresource of s.
func NewWorkspaceLog(s *WorkspaceStorage) *WorkspaceLogStorage {
	return &WorkspaceLogStorage{logSubresource: newLogSubresource(s.New), ws: s, ids: coderdFacts[workspaceRef, uuid.UUID]{max: 10000}}
}

// latestBuild is the workspace's latest build, read as t's caller (so
// coderd says whether they may see it): from the builds list of its
// remembered ID when that still names this workspace (not renamed,
// deleted or replaced by another of the same name), else from a read of
// the workspace by owner and name.
func (l *WorkspaceLogStorage) latestBuild(ctx context.Context, t target, n workspaceName, name string) (codersdk.WorkspaceBuild, error) {
	s, ref, coderd := l.ws, workspaceRef{n.Org, n.Owner, n.Name}, t.coderdKey()
	if id, ok := l.ids.known(coderd, ref); ok {
		bs, err := t.Client.WorkspaceBuilds(ctx, codersdk.WorkspaceBuildsRequest{WorkspaceID: id, Pagination: codersdk.Pagination{Limit: 1}})
		if err == nil && len(bs) == 1 && bs[0].WorkspaceOwnerName == n.Owner && bs[0].WorkspaceName == n.Name &&
			bs[0].Transition != codersdk.WorkspaceTransitionDelete {
			return bs[0], nil
		}
	}
	w, err := t.Client.WorkspaceByOwnerAndName(ctx, n.Owner, n.Name, codersdk.WorkspaceOptions{})
	if err != nil {
		return codersdk.WorkspaceBuild{}, s.readRefused(t, err, name)
	}
	if w.OrganizationName != n.Org {
		return codersdk.WorkspaceBuild{}, s.notFound(name, fmt.Sprintf("workspace %s/%s belongs to organization %q", n.Owner, n.Name, w.OrganizationName))
	}
	l.ids.put(coderd, ref, w.ID)
	return w.LatestBuild, nil
}

var _ rest.GetterWithOptions = (*WorkspaceLogStorage)(nil)
var _ rest.StorageMetadata = (*WorkspaceLogStorage)(nil)

// Get reads the log of the workspace's latest build (or the build
// options name) as the caller: coderd decides what they may read, so
// another user's workspace is the 404 a GET of it gives.
func (l *WorkspaceLogStorage) Get(ctx context.Context, name string, opts runtime.Object) (runtime.Object, error) {
	s := l.ws
	o, t, n, err := logRequest(ctx, s, opts, name, true)
	if err != nil {
		return nil, err
	}
	b, err := l.latestBuild(ctx, t, n, name)
	if err != nil {
		return nil, err
	}
	if o.Build != nil && *o.Build != b.BuildNumber {
		b, err = t.Client.WorkspaceBuildByUsernameAndWorkspaceNameAndBuildNumber(ctx, n.Owner, n.Name, strconv.Itoa(int(*o.Build)))
		if coderapi.IsNotFound(err) {
			return nil, apierrors.NewNotFound(aggv1.Resource("coderworkspaces/log"), fmt.Sprintf("%s build %d", name, *o.Build))
		}
		if err != nil {
			return nil, s.coderErr(t, err, name)
		}
	}
	if b.ID == uuid.Nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("coderworkspace %s has no build yet, so no build log", name))
	}
	id := b.ID
	j := l.jobLog(t, "/api/v2/workspacebuilds/"+id.String()+"/logs", id, b.Job, t.Client.WorkspaceBuildLogsAfter,
		func(ctx context.Context) (codersdk.ProvisionerJob, error) {
			b, err := t.Client.WorkspaceBuild(ctx, id)
			return b.Job, err
		})
	return j.serve(ctx, o, func(err error) error { return s.coderErr(t, err, name) })
}

// logRequest checks a log request's options (builds: whether it may name
// a build) and finds the object name names, acting as the caller; a
// caller refused in its backend gets the 404 a GET gives.
func logRequest[N objectName, T object](ctx context.Context, s objectStore[N, T], opts runtime.Object, name string, builds bool) (*aggv1.CoderLogOptions, target, N, error) {
	var n N
	o, err := logOptions(opts, name, builds)
	if err != nil {
		return nil, target{}, n, err
	}
	t, n, err := s.lookup(ctx, name)
	if err != nil {
		return nil, t, n, s.store().refusedReads(name, err)
	}
	return o, t.acting(), n, nil
}

// jobLog is the log of job, the job of id, as t reads it: path is its
// logs endpoint, follow codersdk's streaming read of it, refresh a read
// of the job.
func (l *logSubresource) jobLog(t target, path string, id uuid.UUID, job codersdk.ProvisionerJob,
	follow func(context.Context, uuid.UUID, int64) (<-chan codersdk.ProvisionerJobLog, io.Closer, error),
	refresh func(context.Context) (codersdk.ProvisionerJob, error)) *jobLog {
	return &jobLog{client: t.Client, path: path, job: job, ended: &l.ended, coderd: t.coderdKey(), refresh: refresh,
		follow: func(ctx context.Context, after int64) (<-chan codersdk.ProvisionerJobLog, io.Closer, error) {
			return follow(ctx, id, after)
		}}
}

// serve is the subresource's answer: j's log as o asks, or the error
// coderErr makes of coderd's.
func (j *jobLog) serve(ctx context.Context, o *aggv1.CoderLogOptions, coderErr func(error) error) (runtime.Object, error) {
	out, err := j.stream(ctx, o)
	if err != nil {
		return nil, coderErr(err)
	}
	return out, nil
}

// readRefused is the error of a read coderd refused the caller: its 404
// is the same as for an object that does not exist.
func (r *genericStore) readRefused(t target, err error, name string) error {
	if t.caller != nil && coderapi.IsNotFound(err) {
		return r.hidden(name)
	}
	return r.coderErr(t, err, name)
}

// TemplateVersionLogStorage serves codertemplateversions/log: the
// version's import log.
type TemplateVersionLogStorage struct {
	logSubresource
	vs *TemplateVersionStorage
}

// NewTemplateVersionLog returns the log subresource of s.
func NewTemplateVersionLog(s *TemplateVersionStorage) *TemplateVersionLogStorage {
	return &TemplateVersionLogStorage{logSubresource: newLogSubresource(s.New), vs: s}
}

var _ rest.GetterWithOptions = (*TemplateVersionLogStorage)(nil)
var _ rest.StorageMetadata = (*TemplateVersionLogStorage)(nil)

// Get reads the version's import log as the caller.
func (l *TemplateVersionLogStorage) Get(ctx context.Context, name string, opts runtime.Object) (runtime.Object, error) {
	s := l.vs
	o, t, n, err := logRequest(ctx, s, opts, name, false)
	if err != nil {
		return nil, err
	}
	// Not fetch: a 404 the caller gets must not drop the version from
	// the cache everyone reads.
	orgID, err := s.tpls.orgs.get(ctx, t, n.Org)
	if err != nil {
		return nil, s.readRefused(t, err, name)
	}
	tpl, err := t.Client.TemplateByName(ctx, orgID, n.Template)
	if err != nil {
		return nil, s.readRefused(t, err, name)
	}
	v, err := t.Client.TemplateVersionByName(ctx, tpl.ID, n.Version)
	if err != nil {
		return nil, s.readRefused(t, err, name)
	}
	if v.Archived {
		return nil, s.notFound(name, "the version is archived")
	}
	id := v.ID
	j := l.jobLog(t, "/api/v2/templateversions/"+id.String()+"/logs", id, v.Job, t.Client.TemplateVersionLogsAfter,
		func(ctx context.Context) (codersdk.ProvisionerJob, error) {
			v, err := t.Client.TemplateVersion(ctx, id)
			return v.Job, err
		})
	return j.serve(ctx, o, func(err error) error { return s.coderErr(t, err, name) })
}
