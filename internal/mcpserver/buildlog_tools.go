package mcpserver

import (
	"context"
	"fmt"
	"io"
	"strconv"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// WorkspaceBuildLogInput names a workspace, a build of it and how much of
// the log to show.
type WorkspaceBuildLogInput struct {
	Namespace  string `json:"namespace" jsonschema:"Kubernetes namespace of the workspace"`
	Name       string `json:"name" jsonschema:"<organization>.<owner>.<workspace>"`
	Build      int32  `json:"build,omitempty" jsonschema:"the build number whose log to show (get_workspace's latestBuild.number is the latest); default the latest build"`
	TailLines  int64  `json:"tailLines,omitempty" jsonschema:"show only the last this many lines (default 100, at most 5000)"`
	LimitBytes int64  `json:"limitBytes,omitempty" jsonschema:"show at most this many bytes of those lines (default 16384, at most 262144); the newest lines are cut first"`
}

// TemplateVersionLogInput names a template version and how much of its
// import log to show.
type TemplateVersionLogInput struct {
	Namespace  string `json:"namespace" jsonschema:"Kubernetes namespace of the template version"`
	Name       string `json:"name" jsonschema:"<organization>.<template>.<version> (list_template_versions names them)"`
	TailLines  int64  `json:"tailLines,omitempty" jsonschema:"show only the last this many lines (default 100, at most 5000)"`
	LimitBytes int64  `json:"limitBytes,omitempty" jsonschema:"show at most this many bytes of those lines (default 16384, at most 262144); the newest lines are cut first"`
}

// JobLog is the text of a build or import log.
type JobLog struct {
	TailLines  int64  `json:"tailLines" jsonschema:"the tailLines applied"`
	LimitBytes int64  `json:"limitBytes" jsonschema:"the limitBytes applied"`
	Truncated  bool   `json:"truncated" jsonschema:"the lines asked for were longer than limitBytes and were cut; ask for fewer tailLines or a larger limitBytes"`
	Log        string `json:"log" jsonschema:"the log: the coder CLI's stage headers (==> ⧗ stage, === ✔ stage [duration]; ✘ for a failed stage) and each line Terraform and the provisioner wrote"`
}

func (s *Server) buildLogTools() []tool {
	return []tool{
		define(s, "get_workspace_build_log", toolMeta{
			Title:       "Get a Coder workspace's build log",
			Description: "Returns the last lines (default 100) of a Coder workspace build's log, the latest build unless build names one, with the stage headers the coder CLI prints, capped in bytes (default 16 KiB) and saying whether it was cut. Use it to see why a build failed; a running build's log so far is shown.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, getWorkspaceBuildLog),
		define(s, "get_template_version_log", toolMeta{
			Title:       "Get a Coder template version's import log",
			Description: "Returns the last lines (default 100) of a Coder template version's import log (Terraform init and plan as coderd ran them), with the stage headers the coder CLI prints, capped in bytes (default 16 KiB) and saying whether it was cut. Use it to see why a template version failed to build.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, getTemplateVersionLog),
	}
}

func getWorkspaceBuildLog(ctx context.Context, c *call, in WorkspaceBuildLogInput) (JobLog, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return JobLog{}, err
	}
	if in.Build < 0 {
		return JobLog{}, fmt.Errorf("build must be a build number (1 or more), or left out for the latest build; got %d", in.Build)
	}
	var build string
	if in.Build > 0 {
		build = strconv.Itoa(int(in.Build))
	}
	return readJobLog(ctx, c, workspacesResource, in.Namespace, in.Name, build, in.TailLines, in.LimitBytes)
}

func getTemplateVersionLog(ctx context.Context, c *call, in TemplateVersionLogInput) (JobLog, error) {
	if err := requireObject(in.Namespace, in.Name); err != nil {
		return JobLog{}, err
	}
	return readJobLog(ctx, c, templateVersionsResource, in.Namespace, in.Name, "", in.TailLines, in.LimitBytes)
}

// readJobLog reads the log subresource of an aggregated object as the
// caller, capped as get_pod_logs caps a pod's log.
func readJobLog(ctx context.Context, c *call, resource, namespace, name, build string, tailLines, limitBytes int64) (JobLog, error) {
	tail, err := logCap("tailLines", tailLines, defaultTailLines, maxTailLines)
	if err != nil {
		return JobLog{}, err
	}
	limit, err := logCap("limitBytes", limitBytes, defaultLogBytes, maxLogBytes)
	if err != nil {
		return JobLog{}, err
	}
	req := c.kube.Clientset.Discovery().RESTClient().Get().
		AbsPath("/apis", aggv1.SchemeGroupVersion.Group, aggv1.SchemeGroupVersion.Version, "namespaces", namespace, resource, name, "log").
		Param("tailLines", strconv.FormatInt(tail, 10))
	if build != "" {
		req.Param("build", build)
	}
	stream, err := req.Stream(ctx)
	if err != nil {
		return JobLog{}, fmt.Errorf("get the log of %s %s/%s: %w", resource, namespace, name, err)
	}
	defer func() { _ = stream.Close() }()
	// One byte more than shown tells whether there was more.
	b, err := io.ReadAll(io.LimitReader(stream, limit+1))
	if err != nil {
		return JobLog{}, fmt.Errorf("read the log of %s %s/%s: %w", resource, namespace, name, err)
	}
	out := JobLog{TailLines: tail, LimitBytes: limit}
	if int64(len(b)) > limit {
		b, out.Truncated = trimPartialRune(b[:limit]), true
	}
	out.Log = string(b)
	return out, nil
}
