package mcpserver

import (
	"context"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/truncate"
)

// templateVersionsResource is the aggregated resource of template
// versions.
const templateVersionsResource = "codertemplateversions"

// TemplateVersionListInput filters template versions.
type TemplateVersionListInput struct {
	Namespace string `json:"namespace,omitempty" jsonschema:"Kubernetes namespace; empty means every namespace"`
	Template  string `json:"template,omitempty" jsonschema:"only versions of this Coder template name"`
	Limit     int    `json:"limit,omitempty" jsonschema:"rows to return (default 20, at most 500)"`
	Continue  string `json:"continue,omitempty" jsonschema:"the continue token of the previous call, for the next rows"`
}

// TemplateVersionRow is one template version in a list.
type TemplateVersionRow struct {
	Namespace   string `json:"namespace"`
	Name        string `json:"name" jsonschema:"<organization>.<template>.<version>"`
	Template    string `json:"template"`
	Message     string `json:"message,omitempty" jsonschema:"the version's message, cut to 300 characters"`
	CreatedBy   string `json:"createdBy,omitempty" jsonschema:"Coder username of the author"`
	CreatedAt   string `json:"createdAt,omitempty"`
	BuildStatus string `json:"buildStatus,omitempty" jsonschema:"pending, running, succeeded, canceling, canceled or failed"`
	BuildError  string `json:"buildError,omitempty" jsonschema:"the build's error, cut to 300 characters"`
	Active      bool   `json:"active,omitempty" jsonschema:"the template's active version"`
}

// TemplateVersionList is a page of template versions.
type TemplateVersionList struct {
	Items    []TemplateVersionRow `json:"items"`
	Continue string               `json:"continue,omitempty" jsonschema:"pass to the next call for more rows; empty at the end"`
}

func (s *Server) templateVersionTools() []tool {
	return []tool{
		define(s, "list_template_versions", toolMeta{
			Title:       "List Coder template versions",
			Description: "Lists Coder template versions (CoderTemplateVersion objects), optionally of one template, a page at a time: message, author, build status and error, and which is active.",
			ReadOnly:    true, Idempotent: true, OpenWorld: true,
		}, listTemplateVersions),
	}
}

func listTemplateVersions(ctx context.Context, c *call, in TemplateVersionListInput) (TemplateVersionList, error) {
	q := listQuery(in.Continue)
	if in.Template != "" {
		if errs := validation.IsValidLabelValue(in.Template); len(errs) > 0 {
			return TemplateVersionList{}, fmt.Errorf("template %q is not a Coder template name: %s", truncate.String(in.Template, 64), strings.Join(errs, "; "))
		}
		q.Set("labelSelector", k8slabels.SelectorFromSet(map[string]string{aggv1.LabelTemplate: in.Template}).String())
	}
	var list partialList[templateVersionRowSource]
	if err := c.listPartial(ctx, templateVersionsResource, in.Namespace, q, &list); err != nil {
		return TemplateVersionList{}, fmt.Errorf("list codertemplateversions: %w", err)
	}
	if err := sortListed(ctx, c, in.Namespace, list.Items, errNoNamespace); err != nil {
		return TemplateVersionList{}, err
	}
	items, next, err := pageAt(list.Items, in.Limit, in.Continue, list.Metadata.ResourceVersion)
	if err != nil {
		return TemplateVersionList{}, err
	}
	out := TemplateVersionList{Items: make([]TemplateVersionRow, len(items)), Continue: next}
	for i := range items {
		out.Items[i] = items[i].row()
	}
	return out, nil
}

// templateVersionRowSource is what a TemplateVersionRow shows of a
// CoderTemplateVersion (same JSON names), so listing skips the rest,
// spec.files above all.
type templateVersionRowSource struct {
	rowMeta `json:"metadata"`
	Spec    struct {
		Template string `json:"template"`
		Message  string `json:"message"`
	} `json:"spec"`
	Status struct {
		CreatedBy   string       `json:"createdBy"`
		CreatedAt   *metav1.Time `json:"createdAt"`
		BuildStatus string       `json:"buildStatus"`
		BuildError  string       `json:"buildError"`
		Active      bool         `json:"active"`
	} `json:"status"`
}

func (v *templateVersionRowSource) row() TemplateVersionRow {
	r := TemplateVersionRow{Namespace: v.Namespace, Name: v.Name, Template: v.Spec.Template,
		Message: truncate.String(v.Spec.Message, maxMessageChars), CreatedBy: v.Status.CreatedBy,
		BuildStatus: v.Status.BuildStatus, BuildError: truncate.String(v.Status.BuildError, maxMessageChars), Active: v.Status.Active}
	if v.Status.CreatedAt != nil {
		r.CreatedAt = rfc3339(*v.Status.CreatedAt)
	}
	return r
}
