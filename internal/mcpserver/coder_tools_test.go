package mcpserver

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// TestRowSourcesReadTheObjectsJSON decodes lists as kube-apiserver sends
// them (the JSON of the API types) into the row sources and checks that
// each row shows what the object says: the row sources' JSON names must
// stay those of the API types.
func TestRowSourcesReadTheObjectsJSON(t *testing.T) {
	built := metav1.NewTime(time.Date(2026, 11, 26, 9, 30, 0, 0, time.FixedZone("CET", 3600)))
	ws := aggv1.CoderWorkspaceList{
		ListMeta: metav1.ListMeta{ResourceVersion: "42"},
		Items: []aggv1.CoderWorkspace{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "coder.alice.dev", Labels: map[string]string{"a": "b"}},
			Spec:       aggv1.CoderWorkspaceSpec{Organization: "coder", TemplateName: "docker", Running: true},
			Status: aggv1.CoderWorkspaceStatus{Owner: "alice", Phase: "running", URL: "https://x",
				LatestBuild: &aggv1.WorkspaceBuild{ID: "b", Number: 3, Transition: "start", JobStatus: "succeeded", CreatedAt: built}},
		}, {
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "coder.bob.new"},
			Spec:       aggv1.CoderWorkspaceSpec{TemplateName: "k8s"},
			Status:     aggv1.CoderWorkspaceStatus{Owner: "bob", Phase: "pending"},
		}},
	}
	var wl partialList[workspaceRowSource]
	decode(t, ws, &wl)
	if wl.Metadata.ResourceVersion != "42" || len(wl.Items) != 2 {
		t.Fatalf("resourceVersion %q, %d items; want 42 and 2", wl.Metadata.ResourceVersion, len(wl.Items))
	}
	wantWS := []WorkspaceRow{
		{Namespace: "team", Name: "coder.alice.dev", Owner: "alice", Template: "docker", Status: "running", Running: true, LastBuilt: "2026-11-26T08:30:00Z"},
		{Namespace: "team", Name: "coder.bob.new", Owner: "bob", Template: "k8s", Status: "pending"},
	}
	for i := range wl.Items {
		if d := cmp.Diff(wantWS[i], wl.Items[i].row()); d != "" {
			t.Errorf("workspace row %d (-want +got):\n%s", i, d)
		}
	}

	ts := aggv1.CoderTemplateList{
		ListMeta: metav1.ListMeta{ResourceVersion: "7"},
		Items: []aggv1.CoderTemplate{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "coder.docker"},
			Spec:       aggv1.CoderTemplateSpec{DisplayName: "Docker", Files: map[string]string{"main.tf": "x"}},
			Status:     aggv1.CoderTemplateStatus{ActiveVersionName: "v1", BuildStatus: "succeeded", Deprecated: true},
		}},
	}
	var tl partialList[templateRowSource]
	decode(t, ts, &tl)
	want := TemplateRow{Namespace: "team", Name: "coder.docker", DisplayName: "Docker", ActiveVersion: "v1", BuildStatus: "succeeded", Deprecated: true}
	if tl.Metadata.ResourceVersion != "7" || len(tl.Items) != 1 {
		t.Fatalf("resourceVersion %q, %d items; want 7 and 1", tl.Metadata.ResourceVersion, len(tl.Items))
	}
	if d := cmp.Diff(want, tl.Items[0].row()); d != "" {
		t.Errorf("template row (-want +got):\n%s", d)
	}
}

func decode(t *testing.T, in, out any) {
	t.Helper()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// TestTemplateVariables shows literal values, and for a value from a
// Secret or a sensitive variable only where it came from.
func TestTemplateVariables(t *testing.T) {
	ref := &aggv1.SecretKeySelector{Name: "registry", Key: "token"}
	tpl := &aggv1.CoderTemplate{
		Spec: aggv1.CoderTemplateSpec{Variables: []aggv1.TemplateVariable{
			{Name: "namespace", Value: "team"},
			{Name: "token", ValueFrom: &aggv1.TemplateVariableSource{SecretKeyRef: ref}},
		}},
		Status: aggv1.CoderTemplateStatus{Variables: []aggv1.TemplateVariableStatus{
			{Name: "namespace", Type: "string", Required: true},
			{Name: "token", Type: "string", Sensitive: true, SecretKeyRef: ref, SecretResourceVersion: "12"},
			{Name: "use_kubeconfig", Type: "bool"},
		}},
	}
	want := []TemplateVariable{
		{Name: "namespace", Type: "string", Required: true, Value: "team"},
		{Name: "token", Type: "string", Sensitive: true, Secret: "registry/token"},
		{Name: "use_kubeconfig", Type: "bool"},
	}
	if d := cmp.Diff(want, templateVariables(tpl)); d != "" {
		t.Errorf("templateVariables (-want +got):\n%s", d)
	}
}

// TestTemplateSettings shows the spec's settings by their spec names, and
// nothing TemplateDetail shows otherwise.
func TestTemplateSettings(t *testing.T) {
	ttl, msg := aggv1.Duration("8h"), "use v2"
	tpl := &aggv1.CoderTemplate{Spec: aggv1.CoderTemplateSpec{DisplayName: "D", Files: map[string]string{"main.tf": "x"},
		DefaultTTL: &ttl, DeprecationMessage: &msg, Variables: []aggv1.TemplateVariable{{Name: "a", Value: "b"}},
		Access: &aggv1.TemplateAccess{Everyone: aggv1.TemplateRoleUse, Users: []aggv1.TemplateAccessEntry{{Name: "alice", Role: aggv1.TemplateRoleAdmin}}}}}
	got, err := templateSettings(tpl)
	if err != nil {
		t.Fatal(err)
	}
	access := map[string]any{"everyone": "use", "users": []any{map[string]any{"name": "alice", "role": "admin"}}}
	if d := cmp.Diff(map[string]any{"defaultTTL": "8h", "deprecationMessage": "use v2", "access": access}, got); d != "" {
		t.Errorf("templateSettings (-want +got):\n%s", d)
	}
}
