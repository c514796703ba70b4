package storage

import (
	"reflect"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func fxListOptions(t *testing.T, labelSel, fieldSel string) *metainternalversion.ListOptions {
	t.Helper()
	opts := &metainternalversion.ListOptions{}
	if labelSel != "" {
		s, err := labels.Parse(labelSel)
		if err != nil {
			t.Fatalf("label selector %q: %v", labelSel, err)
		}
		opts.LabelSelector = s
	}
	if fieldSel != "" {
		s, err := fields.ParseSelector(fieldSel)
		if err != nil {
			t.Fatalf("field selector %q: %v", fieldSel, err)
		}
		opts.FieldSelector = s
	}
	return opts
}

func TestWorkspaceFields(t *testing.T) {
	w := toWorkspace(fxTarget(t, "prod", true), fxWorkspace(), nil)
	want := fields.Set{
		"metadata.name":      "prod.acme.alice.dev",
		"metadata.namespace": "team-a",
		"spec.organization":  "acme",
		"spec.templateName":  "docker",
		"spec.running":       "true",
		"status.owner":       "alice",
		"status.phase":       "running",
		"status.id":          fxWorkspaceID.String(),
	}
	if got := aggv1.WorkspaceFields(w); !reflect.DeepEqual(got, want) {
		t.Errorf("WorkspaceFields = %v\nwant %v", got, want)
	}
	// The empty object has the same keys: field label conversion accepts
	// exactly these.
	if got := aggv1.WorkspaceFields(&aggv1.CoderWorkspace{}); len(got) != len(want) || got["spec.running"] != "false" {
		t.Errorf("WorkspaceFields(empty) = %v", got)
	}
}

func TestTemplateFields(t *testing.T) {
	tpl := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), nil)
	want := fields.Set{
		"metadata.name":      "acme.docker",
		"metadata.namespace": "team-a",
		"spec.organization":  "acme",
		"status.deprecated":  "true",
		"status.buildStatus": "succeeded",
		"status.id":          fxTemplateID.String(),
	}
	if got := aggv1.TemplateFields(tpl); !reflect.DeepEqual(got, want) {
		t.Errorf("TemplateFields = %v\nwant %v", got, want)
	}
	if got := aggv1.TemplateFields(&aggv1.CoderTemplate{}); len(got) != len(want) || got["status.deprecated"] != "false" {
		t.Errorf("TemplateFields(empty) = %v", got)
	}
}

func TestSelectorMatchesWorkspaces(t *testing.T) {
	running := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	sw := fxWorkspace()
	sw.Name, sw.OwnerName, sw.TemplateName = "old", "bob", "k8s"
	sw.LatestBuild.Transition, sw.LatestBuild.Status = codersdk.WorkspaceTransitionStop, codersdk.WorkspaceStatusStopped
	stopped := toWorkspace(fxTarget(t, "", false), sw, nil)

	for _, tc := range []struct {
		labels, fields         string
		matchRunning, matchOld bool
	}{
		{"", "", true, true},
		{aggv1.LabelOwner + "=alice", "", true, false},
		{aggv1.LabelOwner + " in (alice,bob)", "", true, true},
		{aggv1.LabelOrganization + "=acme," + aggv1.LabelTemplate + "=k8s", "", false, true},
		{aggv1.LabelControlPlane, "", true, false},
		{"!" + aggv1.LabelControlPlane, "", false, true},
		{aggv1.LabelControlPlane + "=prod", "", true, false},
		{"", "spec.running=true", true, false},
		{"", "spec.running!=true", false, true},
		{"", "status.phase=stopped", false, true},
		{"", "status.owner=alice,spec.templateName=docker", true, false},
		{"", "metadata.name=acme.bob.old", false, true},
		{"", "metadata.namespace=team-a", true, true},
		{"", "metadata.namespace=team-b", false, false},
		{"", "status.id=" + fxWorkspaceID.String(), true, true},
		{aggv1.LabelOwner + "=alice", "spec.running=false", false, false},
		{aggv1.LabelOrganization + "=acme", "spec.organization=acme", true, true},
		// A field that is not in the set does not match anything.
		{"", "spec.unknown=x", false, false},
	} {
		opts := fxListOptions(t, tc.labels, tc.fields)
		sel := selectorOf(opts)
		if got := sel.matches(running.Labels, aggv1.WorkspaceFields(running)); got != tc.matchRunning {
			t.Errorf("labels %q fields %q: matches running workspace = %v, want %v", tc.labels, tc.fields, got, tc.matchRunning)
		}
		if got := sel.matches(stopped.Labels, aggv1.WorkspaceFields(stopped)); got != tc.matchOld {
			t.Errorf("labels %q fields %q: matches stopped workspace = %v, want %v", tc.labels, tc.fields, got, tc.matchOld)
		}
		if empty := tc.labels == "" && tc.fields == ""; sel.empty() != empty {
			t.Errorf("labels %q fields %q: empty() = %v, want %v", tc.labels, tc.fields, sel.empty(), empty)
		}
	}
}

func TestSelectorMatchesTemplates(t *testing.T) {
	ok := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), nil)
	failedVersion := fxVersion()
	failedVersion.Job.Status = codersdk.ProvisionerJobFailed
	tpl := fxTemplate()
	tpl.Name, tpl.Deprecated = "k8s", false
	failed := toTemplate(fxTarget(t, "prod", false), tpl, failedVersion, nil)

	for _, tc := range []struct {
		labels, fields       string
		matchOK, matchFailed bool
	}{
		{"", "", true, true},
		{"", "status.buildStatus=failed", false, true},
		{"", "status.deprecated=false", false, true},
		{"", "status.deprecated=true,status.buildStatus=succeeded", true, false},
		{aggv1.LabelTemplate + "=k8s", "", false, true},
		{aggv1.LabelTemplate + " notin (k8s)", "spec.organization=acme", true, false},
		{"", "metadata.name=acme.docker", true, false},
	} {
		sel := selectorOf(fxListOptions(t, tc.labels, tc.fields))
		if got := sel.matches(ok.Labels, aggv1.TemplateFields(ok)); got != tc.matchOK {
			t.Errorf("labels %q fields %q: matches built template = %v, want %v", tc.labels, tc.fields, got, tc.matchOK)
		}
		if got := sel.matches(failed.Labels, aggv1.TemplateFields(failed)); got != tc.matchFailed {
			t.Errorf("labels %q fields %q: matches failed template = %v, want %v", tc.labels, tc.fields, got, tc.matchFailed)
		}
	}
}

func TestSelectorOfNilOptions(t *testing.T) {
	for _, opts := range []*metainternalversion.ListOptions{nil, {}} {
		sel := selectorOf(opts)
		if !sel.empty() {
			t.Errorf("selectorOf(%v) is not empty", opts)
		}
		if !sel.matches(nil, nil) || !sel.matches(map[string]string{"a": "b"}, fields.Set{"x": "y"}) {
			t.Errorf("selectorOf(%v) does not match everything", opts)
		}
	}
}

// The storages' selectable functions feed exactly the objects' labels and
// field sets to the selectors.
func TestStorageSelectable(t *testing.T) {
	ws, ts := fxStorages(t)
	w := toWorkspace(fxTarget(t, "prod", false), fxWorkspace(), nil)
	l, f := ws.selectable(w)
	if !reflect.DeepEqual(l, w.Labels) || !reflect.DeepEqual(f, aggv1.WorkspaceFields(w)) {
		t.Errorf("workspace selectable = %v, %v", l, f)
	}
	tpl := toTemplate(fxTarget(t, "prod", false), fxTemplate(), fxVersion(), nil)
	l, f = ts.selectable(tpl)
	if !reflect.DeepEqual(l, tpl.Labels) || !reflect.DeepEqual(f, aggv1.TemplateFields(tpl)) {
		t.Errorf("template selectable = %v, %v", l, f)
	}
}
