package testenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	sdkproto "github.com/coder/coder/v2/provisionersdk/proto"
	"github.com/google/uuid"
	protobuf "google.golang.org/protobuf/proto"
)

// What tests do in a running coderd through its API: push templates,
// create, start and stop workspaces and wait for their builds.

// ProviderFreeTemplate returns a minimal Terraform template (a variable,
// locals and outputs, no providers) that builds offline in about a second.
func ProviderFreeTemplate() map[string]string {
	return map[string]string{
		"main.tf": `# A template without providers: tofu needs no registry, so it
# imports and builds offline.
variable "greeting" {
  type        = string
  description = "Text the workspace build outputs."
  default     = "hello from coder-k8s"
}

locals {
  message = upper(var.greeting)
}

output "message" {
  value = local.message
}
`,
	}
}

// PushTemplate creates (or, if it exists, adds and activates a new version
// of) a template from files (path -> content) packed as a tar, waits for
// the version's import job to succeed, and returns the template. On a
// failed or canceled job the error carries the job's error and logs.
func (c *Coder) PushTemplate(ctx context.Context, name string, files map[string]string) (codersdk.Template, error) {
	return c.pushTemplate(ctx, name, files, codersdk.ProvisionerTypeTerraform)
}

// PushEchoTemplate pushes, as PushTemplate does, a template for coderd's
// echo provisioner (CoderOptions.ProvisionerTypes must include it) whose
// builds succeed at once without resources: the way to create many real
// workspaces through coderd's API quickly.
func (c *Coder) PushEchoTemplate(ctx context.Context, name string) (codersdk.Template, error) {
	files, err := EchoTemplate()
	if err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: %w", name, err)
	}
	return c.pushTemplate(ctx, name, files, codersdk.ProvisionerTypeEcho)
}

// EchoTemplate returns the files of a template for coderd's echo
// provisioner: for each stage, the response it replays (N.<stage>.protobuf,
// a serialized provisionersdk proto.Response), here each stage's empty
// success, as coder's own echo.Tar(nil) writes them.
func EchoTemplate() (map[string]string, error) {
	stages := map[string]*sdkproto.Response{
		"parse": {Type: &sdkproto.Response_Parse{Parse: &sdkproto.ParseComplete{}}},
		"init":  {Type: &sdkproto.Response_Init{Init: &sdkproto.InitComplete{ModuleFiles: []byte{}}}},
		"graph": {Type: &sdkproto.Response_Graph{Graph: &sdkproto.GraphComplete{}}},
		"plan":  {Type: &sdkproto.Response_Plan{Plan: &sdkproto.PlanComplete{Plan: []byte("{}")}}},
		"apply": {Type: &sdkproto.Response_Apply{Apply: &sdkproto.ApplyComplete{}}},
	}
	files := make(map[string]string, len(stages))
	for stage, resp := range stages {
		data, err := protobuf.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("echo template: %s response: %w", stage, err)
		}
		files["0."+stage+".protobuf"] = string(data)
	}
	return files, nil
}

func (c *Coder) pushTemplate(ctx context.Context, name string, files map[string]string, provisioner codersdk.ProvisionerType) (codersdk.Template, error) {
	if c.Client == nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: coder has no first user (SkipFirstUser)", name)
	}
	archive, err := tarFiles(files)
	if err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: %w", name, err)
	}
	upload, err := c.Client.Upload(ctx, codersdk.ContentTypeTar, bytes.NewReader(archive))
	if err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: upload: %w", name, err)
	}
	existing, err := c.Client.TemplateByName(ctx, c.OrganizationID, name)
	found := err == nil
	if err != nil && !isNotFound(err) {
		return codersdk.Template{}, fmt.Errorf("push template %q: %w", name, err)
	}
	req := codersdk.CreateTemplateVersionRequest{
		StorageMethod: codersdk.ProvisionerStorageMethodFile,
		FileID:        upload.ID,
		Provisioner:   provisioner,
	}
	if found {
		req.TemplateID = existing.ID
	}
	version, err := c.Client.CreateTemplateVersion(ctx, c.OrganizationID, req)
	if err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: create version: %w", name, err)
	}
	if _, err := c.waitTemplateVersion(ctx, version.ID); err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: %w", name, err)
	}
	if !found {
		tpl, err := c.Client.CreateTemplate(ctx, c.OrganizationID, codersdk.CreateTemplateRequest{Name: name, VersionID: version.ID})
		if err != nil {
			return codersdk.Template{}, fmt.Errorf("push template %q: create: %w", name, err)
		}
		return tpl, nil
	}
	if err := c.Client.UpdateActiveTemplateVersion(ctx, existing.ID, codersdk.UpdateActiveTemplateVersion{ID: version.ID}); err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: activate version: %w", name, err)
	}
	tpl, err := c.Client.Template(ctx, existing.ID)
	if err != nil {
		return codersdk.Template{}, fmt.Errorf("push template %q: %w", name, err)
	}
	return tpl, nil
}

// waitTemplateVersion waits for a template version's import job to end and
// returns an error unless it succeeded.
func (c *Coder) waitTemplateVersion(ctx context.Context, id uuid.UUID) (codersdk.TemplateVersion, error) {
	for {
		v, err := c.Client.TemplateVersion(ctx, id)
		if err != nil {
			return v, fmt.Errorf("get template version %s: %w", id, err)
		}
		switch v.Job.Status {
		case codersdk.ProvisionerJobSucceeded:
			return v, nil
		case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
			logs := c.jobLogs(ctx, func(ctx context.Context) (<-chan codersdk.ProvisionerJobLog, io.Closer, error) {
				return c.Client.TemplateVersionLogsAfter(ctx, id, 0)
			})
			return v, fmt.Errorf("template version %s import %s: %s; logs:\n%s", id, v.Job.Status, v.Job.Error, logs)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return v, fmt.Errorf("wait for template version %s import (%s): %w", id, v.Job.Status, err)
		}
	}
}

// CreateWorkspace creates a workspace of template for the first user and
// waits for its first build to finish.
func (c *Coder) CreateWorkspace(ctx context.Context, templateName, name string) (codersdk.Workspace, error) {
	if c.Client == nil {
		return codersdk.Workspace{}, fmt.Errorf("create workspace %q: coder has no first user (SkipFirstUser)", name)
	}
	tpl, err := c.Client.TemplateByName(ctx, c.OrganizationID, templateName)
	if err != nil {
		return codersdk.Workspace{}, fmt.Errorf("create workspace %q: get template %q: %w", name, templateName, err)
	}
	ws, err := c.Client.CreateUserWorkspace(ctx, c.Username, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: name})
	if err != nil {
		return codersdk.Workspace{}, fmt.Errorf("create workspace %q: %w", name, err)
	}
	if _, err := c.WaitBuild(ctx, ws.LatestBuild.ID); err != nil {
		return codersdk.Workspace{}, fmt.Errorf("create workspace %q: %w", name, err)
	}
	return c.workspace(ctx, name)
}

// StartWorkspace runs a start build and waits for it to finish successfully.
func (c *Coder) StartWorkspace(ctx context.Context, name string) (codersdk.Workspace, error) {
	return c.transitionWorkspace(ctx, name, codersdk.WorkspaceTransitionStart)
}

// StopWorkspace runs a stop build and waits for it to finish successfully.
func (c *Coder) StopWorkspace(ctx context.Context, name string) (codersdk.Workspace, error) {
	return c.transitionWorkspace(ctx, name, codersdk.WorkspaceTransitionStop)
}

func (c *Coder) transitionWorkspace(ctx context.Context, name string, transition codersdk.WorkspaceTransition) (codersdk.Workspace, error) {
	if c.Client == nil {
		return codersdk.Workspace{}, fmt.Errorf("%s workspace %q: coder has no first user (SkipFirstUser)", transition, name)
	}
	ws, err := c.workspace(ctx, name)
	if err != nil {
		return codersdk.Workspace{}, fmt.Errorf("%s workspace: %w", transition, err)
	}
	build, err := c.Client.CreateWorkspaceBuild(ctx, ws.ID, codersdk.CreateWorkspaceBuildRequest{Transition: transition})
	if err != nil {
		return codersdk.Workspace{}, fmt.Errorf("%s workspace %q: %w", transition, name, err)
	}
	if _, err := c.WaitBuild(ctx, build.ID); err != nil {
		return codersdk.Workspace{}, fmt.Errorf("%s workspace %q: %w", transition, name, err)
	}
	return c.workspace(ctx, name)
}

func (c *Coder) workspace(ctx context.Context, name string) (codersdk.Workspace, error) {
	ws, err := c.Client.WorkspaceByOwnerAndName(ctx, c.Username, name, codersdk.WorkspaceOptions{})
	if err != nil {
		return codersdk.Workspace{}, fmt.Errorf("get workspace %q: %w", name, err)
	}
	return ws, nil
}

// WaitBuild waits for a workspace build to reach a terminal job status and
// returns an error unless it succeeded.
func (c *Coder) WaitBuild(ctx context.Context, buildID uuid.UUID) (codersdk.WorkspaceBuild, error) {
	if c.Client == nil {
		return codersdk.WorkspaceBuild{}, fmt.Errorf("wait for workspace build %s: coder has no first user (SkipFirstUser)", buildID)
	}
	for {
		b, err := c.Client.WorkspaceBuild(ctx, buildID)
		if err != nil {
			return b, fmt.Errorf("get workspace build %s: %w", buildID, err)
		}
		switch b.Job.Status {
		case codersdk.ProvisionerJobSucceeded:
			return b, nil
		case codersdk.ProvisionerJobFailed, codersdk.ProvisionerJobCanceled:
			logs := c.jobLogs(ctx, func(ctx context.Context) (<-chan codersdk.ProvisionerJobLog, io.Closer, error) {
				return c.Client.WorkspaceBuildLogsAfter(ctx, buildID, 0)
			})
			return b, fmt.Errorf("workspace build %s (%s) %s: %s; logs:\n%s", buildID, b.Transition, b.Job.Status, b.Job.Error, logs)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return b, fmt.Errorf("wait for workspace build %s (%s, %s): %w", buildID, b.Transition, b.Job.Status, err)
		}
	}
}

// jobLogs collects the logs of a finished provisioner job for an error
// message. The stream ends once the server has sent them all; the timeout
// keeps a broken stream from hiding the original error.
func (c *Coder) jobLogs(ctx context.Context, open func(context.Context) (<-chan codersdk.ProvisionerJobLog, io.Closer, error)) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	logs, closer, err := open(ctx)
	if err != nil {
		return fmt.Sprintf("(no logs: %v)", err)
	}
	defer closer.Close()
	var b strings.Builder
	for {
		select {
		case l, ok := <-logs:
			if !ok {
				return b.String()
			}
			fmt.Fprintf(&b, "%s [%s] %s\n", l.Stage, l.Level, l.Output)
		case <-ctx.Done():
			return b.String() + "(log stream cut off)\n"
		}
	}
}

// tarFiles packs files (slash-separated relative path -> content) into a
// tar archive, with a directory entry for every parent.
func tarFiles(files map[string]string) ([]byte, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		if !validTemplatePath(name) {
			return nil, fmt.Errorf("template file %q: path must be relative, slash-separated and inside the template", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, name := range names {
		var parents []string
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
				return nil, fmt.Errorf("pack template: %w", err)
			}
		}
		content := files[name]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(content))}); err != nil {
			return nil, fmt.Errorf("pack template: %w", err)
		}
		if _, err := io.WriteString(tw, content); err != nil {
			return nil, fmt.Errorf("pack template: %w", err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("pack template: %w", err)
	}
	return buf.Bytes(), nil
}

func validTemplatePath(name string) bool {
	return name != "" && !path.IsAbs(name) && path.Clean(name) == name &&
		name != ".." && !strings.HasPrefix(name, "../")
}
