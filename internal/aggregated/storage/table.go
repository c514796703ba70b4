package storage

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// Columns for kubectl get; priority 1 shows only with -o wide.
var (
	workspaceColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "<organization>.<owner>.<workspace>"},
		{Name: "Owner", Type: "string", Description: "Coder username of the owner"},
		{Name: "Template", Type: "string", Description: "Template the workspace is built from"},
		{Name: "Status", Type: "string", Description: "Coder's workspace status"},
		{Name: "Ready", Type: "string", Description: "True when the workspace is usable (start build succeeded, every agent connected and ready), else the Ready condition's reason"},
		{Name: "Agents", Type: "string", Description: "Agents connected and ready, of all the workspace's agents"},
		{Name: "Running", Type: "boolean", Description: "Desired run state (spec.running)"},
		{Name: "Last Built", Type: "string", Description: "Time since the latest build was queued"},
		{Name: "Age", Type: "string", Description: "Time since the workspace was created"},
		{Name: "Organization", Type: "string", Priority: 1, Description: "Coder organization"},
		{Name: "Version", Type: "string", Priority: 1, Description: "Template version of the latest build"},
		{Name: "Outdated", Type: "boolean", Priority: 1, Description: "The template has a newer active version"},
		{Name: "Healthy", Type: "boolean", Priority: 1, Description: "Every agent is healthy"},
		{Name: "Shutdown", Type: "string", Priority: 1, Description: "Time until the automatic stop"},
	}
	templateColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "<organization>.<template>"},
		{Name: "Organization", Type: "string", Description: "Coder organization"},
		{Name: "Active Version", Type: "string", Description: "Name of the active template version"},
		{Name: "Build Status", Type: "string", Description: "Status of the active version's build"},
		{Name: "Age", Type: "string", Description: "Time since the template was created"},
		{Name: "Display Name", Type: "string", Priority: 1, Description: "Name shown in the Coder dashboard"},
		{Name: "Deprecated", Type: "boolean", Priority: 1, Description: "The template is deprecated"},
		{Name: "Users", Type: "integer", Priority: 1, Description: "Active users"},
		{Name: "Files", Type: "integer", Priority: 1, Description: "Files in the template source"},
	}
	userColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "Coder username"},
		{Name: "Email", Type: "string", Description: "Email address"},
		{Name: "Login Type", Type: "string", Description: "How the user logs in: password, none, github or oidc"},
		{Name: "Roles", Type: "string", Description: "Site roles (every user is also a member)"},
		{Name: "Status", Type: "string", Description: "Coder's user status: active, dormant or suspended"},
		{Name: "Last Seen", Type: "string", Description: "Time since the user last used Coder"},
		{Name: "Age", Type: "string", Description: "Time since the user was created"},
		{Name: "Full Name", Type: "string", Priority: 1, Description: "Profile name"},
		{Name: "Organizations", Type: "string", Priority: 1, Description: "Organizations the user belongs to"},
	}
	templateVersionColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "<organization>.<template>.<version>"},
		{Name: "Template", Type: "string", Description: "Template the version belongs to"},
		{Name: "Active", Type: "boolean", Description: "The template's active version"},
		{Name: "Build Status", Type: "string", Description: "Status of the version's build"},
		{Name: "Created By", Type: "string", Description: "Coder username of the author"},
		{Name: "Age", Type: "string", Description: "Time since the version was created"},
		{Name: "Organization", Type: "string", Priority: 1, Description: "Coder organization"},
		{Name: "Message", Type: "string", Priority: 1, Description: "The version's message"},
		{Name: "Files", Type: "integer", Priority: 1, Description: "Files in the version's source"},
	}
	groupColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "<organization>.<group>"},
		{Name: "Organization", Type: "string", Description: "Coder organization"},
		{Name: "Display Name", Type: "string", Description: "Name shown in the Coder dashboard"},
		{Name: "Members", Type: "integer", Description: "Number of members"},
		{Name: "Quota", Type: "integer", Description: "Quota allowance each member gets from the group"},
		{Name: "Source", Type: "string", Description: "user (made in Coder) or oidc (synced from the identity provider)"},
	}
	organizationColumns = []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name", Description: "Coder organization name"},
		{Name: "Display Name", Type: "string", Description: "Name shown in the Coder dashboard"},
		{Name: "Members", Type: "integer", Description: "Number of members"},
		{Name: "Default", Type: "boolean", Description: "coderd's default organization"},
		{Name: "Age", Type: "string", Description: "Time since the organization was created"},
		{Name: "Description", Type: "string", Priority: 1, Description: "The organization's description"},
	}
)

// ConvertToTable renders workspaces for kubectl get.
func (s *WorkspaceStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, workspaceColumns, func(o runtime.Object) ([]any, error) {
		w, ok := o.(*aggv1.CoderWorkspace)
		if !ok {
			return nil, fmt.Errorf("expected a CoderWorkspace, got %T", o)
		}
		lastBuilt, version := "<none>", "<none>"
		if b := w.Status.LatestBuild; b != nil {
			lastBuilt = age(b.CreatedAt)
			version = b.TemplateVersionName
		}
		shutdown := "<none>"
		if d := w.Status.AutoShutdownDeadline; d != nil {
			// Past the deadline until coderd's stop build runs.
			shutdown = duration.HumanDuration(max(time.Until(d.Time), 0))
		}
		return []any{w.Name, w.Status.Owner, w.Spec.TemplateName, w.Status.Phase, readyCell(w), agentsSummary(w.Status.Agents), w.Spec.Running, lastBuilt,
			age(w.CreationTimestamp), w.Spec.Organization, version, w.Status.Outdated, w.Status.Healthy, shutdown}, nil
	})
}

// readyCell is "True", or the reason Ready is not.
func readyCell(w *aggv1.CoderWorkspace) string {
	c := meta.FindStatusCondition(w.Status.Conditions, aggv1.ConditionReady)
	switch {
	case c == nil:
		return "<unknown>"
	case c.Status == metav1.ConditionTrue:
		return "True"
	}
	return c.Reason
}

// ConvertToTable renders templates for kubectl get.
func (s *TemplateStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, templateColumns, func(o runtime.Object) ([]any, error) {
		t, ok := o.(*aggv1.CoderTemplate)
		if !ok {
			return nil, fmt.Errorf("expected a CoderTemplate, got %T", o)
		}
		return []any{t.Name, t.Spec.Organization, orNone(t.Status.ActiveVersionName), orNone(t.Status.BuildStatus),
			age(t.CreationTimestamp), t.Spec.DisplayName, t.Status.Deprecated, int64(t.Status.ActiveUserCount), int64(len(t.Spec.Files))}, nil
	})
}

// ConvertToTable renders template versions for kubectl get.
func (s *TemplateVersionStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, templateVersionColumns, func(o runtime.Object) ([]any, error) {
		v, ok := o.(*aggv1.CoderTemplateVersion)
		if !ok {
			return nil, fmt.Errorf("expected a CoderTemplateVersion, got %T", o)
		}
		return []any{v.Name, v.Spec.Template, v.Status.Active, orNone(v.Status.BuildStatus), orNone(v.Status.CreatedBy),
			age(v.CreationTimestamp), v.Spec.Organization, v.Spec.Message, int64(len(v.Spec.Files))}, nil
	})
}

// ConvertToTable renders users for kubectl get.
func (s *UserStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, userColumns, func(o runtime.Object) ([]any, error) {
		u, ok := o.(*aggv1.CoderUser)
		if !ok {
			return nil, fmt.Errorf("expected a CoderUser, got %T", o)
		}
		orgs := make([]string, len(u.Spec.Organizations))
		for i, org := range u.Spec.Organizations {
			orgs[i] = org.Name
		}
		lastSeen := "<never>"
		if u.Status.LastSeenAt != nil {
			lastSeen = age(*u.Status.LastSeenAt)
		}
		return []any{u.Name, u.Spec.Email, orNone(u.Spec.LoginType), orNone(strings.Join(u.Spec.Roles, ",")), orNone(u.Status.Status),
			lastSeen, age(u.CreationTimestamp), u.Spec.Name, orNone(strings.Join(orgs, ","))}, nil
	})
}

// ConvertToTable renders groups for kubectl get.
func (s *GroupStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, groupColumns, func(o runtime.Object) ([]any, error) {
		g, ok := o.(*aggv1.CoderGroup)
		if !ok {
			return nil, fmt.Errorf("expected a CoderGroup, got %T", o)
		}
		var quota int64
		if g.Spec.QuotaAllowance != nil {
			quota = int64(*g.Spec.QuotaAllowance)
		}
		return []any{g.Name, g.Spec.Organization, orNone(derefString(g.Spec.DisplayName)), int64(g.Status.MemberCount), quota, orNone(g.Status.Source)}, nil
	})
}

// ConvertToTable renders organizations for kubectl get.
func (s *OrganizationStorage) ConvertToTable(_ context.Context, obj runtime.Object, opts runtime.Object) (*metav1.Table, error) {
	return toTable(obj, opts, organizationColumns, func(o runtime.Object) ([]any, error) {
		org, ok := o.(*aggv1.CoderOrganization)
		if !ok {
			return nil, fmt.Errorf("expected a CoderOrganization, got %T", o)
		}
		return []any{org.Name, orNone(derefString(org.Spec.DisplayName)), int64(org.Status.MembersCount), org.Status.Default,
			age(org.CreationTimestamp), derefString(org.Spec.Description)}, nil
	})
}

func derefString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func toTable(obj runtime.Object, opts runtime.Object, columns []metav1.TableColumnDefinition, cells func(runtime.Object) ([]any, error)) (*metav1.Table, error) {
	table := &metav1.Table{}
	if o, ok := opts.(*metav1.TableOptions); !ok || !o.NoHeaders {
		table.ColumnDefinitions = columns
	}
	add := func(o runtime.Object) error {
		c, err := cells(o)
		if err != nil {
			return err
		}
		table.Rows = append(table.Rows, metav1.TableRow{Cells: c, Object: runtime.RawExtension{Object: o}})
		return nil
	}
	if meta.IsListType(obj) {
		if err := meta.EachListItem(obj, add); err != nil {
			return nil, err
		}
		if l, err := meta.ListAccessor(obj); err == nil {
			table.ResourceVersion = l.GetResourceVersion()
			table.Continue = l.GetContinue()
		}
		return table, nil
	}
	if err := add(obj); err != nil {
		return nil, err
	}
	if m, err := meta.Accessor(obj); err == nil {
		table.ResourceVersion = m.GetResourceVersion()
	}
	return table, nil
}

func age(t metav1.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(time.Since(t.Time))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
