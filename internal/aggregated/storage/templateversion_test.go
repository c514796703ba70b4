package storage

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/templatesource"
)

func TestParseTemplateVersionName(t *testing.T) {
	for _, tc := range []struct {
		in       string
		prefixed bool
		want     templateVersionName
	}{
		{in: "acme.base.v1", want: templateVersionName{Org: "acme", Template: "base", Version: "v1"}},
		// Coder version names may hold dots: the rest of the name is the
		// version's.
		{in: "acme.base.v1.2.3", want: templateVersionName{Org: "acme", Template: "base", Version: "v1.2.3"}},
		{in: "acme.my_tpl.reverent_hopper8", want: templateVersionName{Org: "acme", Template: "my_tpl", Version: "reverent_hopper8"}},
		// The same name in a namespace with several control planes.
		{in: "acme.base.v1.2", prefixed: true, want: templateVersionName{ControlPlane: "acme", Org: "base", Template: "v1", Version: "2"}},
		{in: "prod.acme.base.v1.2", prefixed: true, want: templateVersionName{ControlPlane: "prod", Org: "acme", Template: "base", Version: "v1.2"}},
	} {
		got, err := parseTemplateVersionName(tc.in, tc.prefixed)
		if err != nil {
			t.Fatalf("parse(%q, %v): %v", tc.in, tc.prefixed, err)
		}
		if got != tc.want {
			t.Fatalf("parse(%q, %v) = %+v, want %+v", tc.in, tc.prefixed, got, tc.want)
		}
		if s := got.String(tc.prefixed); s != tc.in {
			t.Fatalf("String(%v) = %q, want %q", tc.prefixed, s, tc.in)
		}
	}
}

func TestParseTemplateVersionNameRejects(t *testing.T) {
	for _, tc := range []struct {
		in       string
		prefixed bool
		wantErr  string
	}{
		{in: "acme.base", wantErr: "has 2 parts"},
		{in: "prod.acme.base", prefixed: true, wantErr: "several control planes"},
		{in: "acme.base.v1..2", wantErr: "version name"},
		{in: "acme.base.-v1", wantErr: "version name"},
		{in: "acme.base." + strings.Repeat("v", maxVersionName+1), wantErr: "at most 64"},
		{in: "ac_me.base.v1", wantErr: "organization name"},
		{in: "Prod.acme.base.v1", prefixed: true, wantErr: "control plane"},
	} {
		if _, err := parseTemplateVersionName(tc.in, tc.prefixed); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("parse(%q, %v) = %v, want an error containing %q", tc.in, tc.prefixed, err, tc.wantErr)
		}
	}
}

// TestTemplateVersionView checks the view of a version: its name, the
// labels -l selects by, the spec as written (default provisioner tags
// left out), the author, whether it is active and its Ready condition.
func TestTemplateVersionView(t *testing.T) {
	tplID, orgID, activeID, vID := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	created := time.Date(2026, 11, 1, 10, 0, 0, 500, time.UTC)
	tpl := &codersdk.Template{ID: tplID, Name: "base", OrganizationID: orgID, OrganizationName: "acme", ActiveVersionID: activeID}
	v := &codersdk.TemplateVersion{ID: vID, Name: "v1.2", Message: "first", CreatedAt: created, CreatedBy: codersdk.MinimalUser{Username: "alice"},
		Job: codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobFailed, Error: "boom", Tags: map[string]string{"scope": "organization", "owner": "", "zone": "eu"}}}
	tg := target{Backend: backend.Backend{Namespace: "team-a", ControlPlane: "coder"}, prefixed: true}
	n := templateVersionName{ControlPlane: "coder", Org: "acme", Template: "base", Version: "v1.2"}
	obj := toTemplateVersion(tg, n, tpl, v, map[string]string{"main.tf": "x"})
	if obj.Name != "coder.acme.base.v1.2" || obj.Namespace != "team-a" || string(obj.UID) != vID.String() {
		t.Fatalf("identity = %s/%s %s", obj.Namespace, obj.Name, obj.UID)
	}
	if obj.Labels[aggv1.LabelTemplate] != "base" || obj.Labels[aggv1.LabelOrganization] != "acme" || obj.Labels[aggv1.LabelControlPlane] != "coder" {
		t.Fatalf("labels = %v", obj.Labels)
	}
	if obj.Spec.Template != "base" || obj.Spec.Message != "first" || len(obj.Spec.ProvisionerTags) != 1 || obj.Spec.ProvisionerTags["zone"] != "eu" {
		t.Fatalf("spec = %+v", obj.Spec)
	}
	st := obj.Status
	if st.CreatedBy != "alice" || st.Active || st.TemplateID != tplID.String() || st.BuildStatus != "failed" || st.BuildError != "boom" {
		t.Fatalf("status = %+v", st)
	}
	if c := st.Conditions[0]; c.Type != aggv1.ConditionReady || c.Status != metav1.ConditionFalse || c.Reason != aggv1.ReasonBuildFailed || c.Message != "boom" {
		t.Fatalf("Ready = %+v", c)
	}
	fs := aggv1.TemplateVersionFields(obj)
	if fs["spec.template"] != "base" || fs["status.active"] != "false" {
		t.Fatalf("fields = %v", fs)
	}

	v.Job = codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobSucceeded, Tags: map[string]string{"scope": "organization", "owner": ""}}
	tpl.ActiveVersionID = vID
	obj = toTemplateVersion(tg, n, tpl, v, nil)
	if !obj.Status.Active || obj.Spec.ProvisionerTags != nil || obj.Status.Conditions[0].Status != metav1.ConditionTrue {
		t.Fatalf("active and built: %+v", obj.Status)
	}
	v.Job = codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobRunning}
	if c := toTemplateVersion(tg, n, tpl, v, nil).Status.Conditions[0]; c.Reason != aggv1.ReasonBuilding {
		t.Fatalf("building: %+v", c)
	}
}

// TestTemplateVersionValidation checks the rules of a create and an
// update: the name agrees with spec.organization and spec.template, files
// are required, and only the message may change.
func TestTemplateVersionValidation(t *testing.T) {
	s := &TemplateVersionStorage{tpls: &TemplateStorage{opts: TemplateOptions{Limits: templatesource.DefaultLimits}}}
	good := &aggv1.CoderTemplateVersion{ObjectMeta: metav1.ObjectMeta{Name: "acme.base.v2"},
		Spec: aggv1.CoderTemplateVersionSpec{Template: "base", Files: map[string]string{"main.tf": ""}}}
	if _, errs := s.validateNew(good, false); len(errs) > 0 {
		t.Fatalf("valid version refused: %v", errs)
	}
	bad := good.DeepCopy()
	bad.Spec.Template, bad.Spec.Organization, bad.Spec.Files = "other", "x", nil
	_, errs := s.validateNew(bad, false)
	if got := errs.ToAggregate().Error(); !strings.Contains(got, "spec.template") || !strings.Contains(got, "spec.organization") || !strings.Contains(got, "spec.files: Required") {
		t.Fatalf("errors = %s", got)
	}

	cur := good.DeepCopy()
	next := cur.DeepCopy()
	next.Spec.Message = "new"
	if errs := s.validateUpdate(next, cur, cur.Name); len(errs) > 0 {
		t.Fatalf("message change refused: %v", errs)
	}
	if u := s.planUpdate(templateVersionName{}, cur.Name, cur, next); !u.changed {
		t.Fatal("a message change changes nothing in Coder")
	}
	next.Spec.Files = map[string]string{"main.tf": "changed"}
	next.Spec.ProvisionerTags = map[string]string{"zone": "eu"}
	errs = s.validateUpdate(next, cur, cur.Name)
	if len(errs) != 2 || !strings.Contains(errs.ToAggregate().Error(), "create a new CoderTemplateVersion") {
		t.Fatalf("immutable fields: %v", errs)
	}
	// Unset files keep those shown (a caller who may not see them).
	next = cur.DeepCopy()
	next.Spec.Files = nil
	if errs := s.validateUpdate(next, cur, cur.Name); len(errs) > 0 {
		t.Fatalf("files left unset refused: %v", errs)
	}
}
