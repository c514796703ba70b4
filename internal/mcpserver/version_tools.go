package mcpserver

import (
	"context"
	"fmt"
	"sort"
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
	list, err := templateVersionsOf(ctx, c, in.Namespace, in.Template, in.Continue)
	if err != nil {
		return TemplateVersionList{}, err
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

// templateVersionsOf lists the versions in namespace (every one when
// empty) of Coder templates named template (every one when empty).
func templateVersionsOf(ctx context.Context, c *call, namespace, template, cont string) (*partialList[templateVersionRowSource], error) {
	q := listQuery(cont)
	if template != "" {
		if errs := validation.IsValidLabelValue(template); len(errs) > 0 {
			return nil, fmt.Errorf("template %q is not a Coder template name: %s", truncate.String(template, 64), strings.Join(errs, "; "))
		}
		q.Set("labelSelector", k8slabels.SelectorFromSet(map[string]string{aggv1.LabelTemplate: template}).String())
	}
	var list partialList[templateVersionRowSource]
	if err := c.listPartial(ctx, templateVersionsResource, namespace, q, &list); err != nil {
		return nil, fmt.Errorf("list codertemplateversions: %w", err)
	}
	return &list, nil
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

// templateVersionsShown is how many versions get_template shows.
const templateVersionsShown = 10

// newestVersions lists the versions of template t, newest first, at most
// templateVersionsShown. Its template label names the Coder template; the
// object name prefix keeps out a same-named template of another
// organization or control plane in the namespace.
func newestVersions(ctx context.Context, c *call, t *aggv1.CoderTemplate) ([]TemplateVersionRow, error) {
	list, err := templateVersionsOf(ctx, c, t.Namespace, t.Labels[aggv1.LabelTemplate], "")
	if err != nil {
		return nil, err
	}
	var out []TemplateVersionRow
	for i := range list.Items {
		if strings.HasPrefix(list.Items[i].Name, t.Name+".") {
			out = append(out, list.Items[i].row())
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt > out[j].CreatedAt })
	return out[:min(len(out), templateVersionsShown)], nil
}
