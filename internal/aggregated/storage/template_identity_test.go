package storage

import (
	"maps"
	"strings"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
)

func TestValidateVersionIdentity(t *testing.T) {
	for _, c := range []struct {
		spec aggv1.CoderTemplateSpec
		want string
	}{
		{aggv1.CoderTemplateSpec{VersionName: "v1.2.3-rc_1", ProvisionerTags: map[string]string{"team": "a", "scope": "user"}}, ""},
		{aggv1.CoderTemplateSpec{VersionName: "bad name"}, `spec.versionName: Invalid value: "bad name": a Coder template version name must be alphanumeric with underscores and dots`},
		{aggv1.CoderTemplateSpec{VersionName: strings.Repeat("a", 65)}, "must be <= 64 characters"},
		{aggv1.CoderTemplateSpec{ProvisionerTags: map[string]string{"owner": "x"}}, "spec.provisionerTags[owner]: Forbidden: coderd sets the owner tag itself (from scope)"},
		{aggv1.CoderTemplateSpec{ProvisionerTags: map[string]string{"scope": "organization"}}, `spec.provisionerTags[scope]: Unsupported value: "organization": supported values: "user"`},
		{aggv1.CoderTemplateSpec{ProvisionerTags: map[string]string{"team": ""}}, "spec.provisionerTags[team]: Invalid value: \"\": must not be empty: coderd drops empty tags"},
	} {
		got := validateVersionIdentity(&c.spec).ToAggregate()
		switch {
		case c.want == "" && got != nil:
			t.Errorf("%+v: %v, want no error", c.spec, got)
		case c.want != "" && (got == nil || !strings.Contains(got.Error(), c.want)):
			t.Errorf("%+v: %v, want %q", c.spec, got, c.want)
		}
	}
}

func TestGivenTags(t *testing.T) {
	for _, c := range []struct{ coder, want map[string]string }{
		{map[string]string{"owner": "", "scope": "organization"}, nil},
		{map[string]string{"owner": "", "scope": "organization", "team": "a"}, map[string]string{"team": "a"}},
		{map[string]string{"owner": "u1", "scope": "user", "team": "a"}, map[string]string{"scope": "user", "team": "a"}},
	} {
		if got := givenTags(c.coder); !maps.Equal(got, c.want) || (got == nil) != (c.want == nil) {
			t.Errorf("givenTags(%v) = %v, want %v", c.coder, got, c.want)
		}
	}
}

// The record keeps what was given only for the versions the template can
// still show: the active one and the one building.
func TestWithGiven(t *testing.T) {
	active, building, old, next := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	rec := &records.Record{}
	rec.Spec.Build = &coderv1alpha1.TemplateBuildRecord{VersionID: building.String()}
	rec.Spec.Versions = []coderv1alpha1.TemplateVersionGiven{
		{VersionID: active.String(), Name: true}, {VersionID: old.String(), Name: true}, {VersionID: building.String(), Message: true}}
	withGiven(rec, coderv1alpha1.TemplateVersionGiven{VersionID: next.String(), Name: true}, active)
	var got []string
	for _, e := range rec.Spec.Versions {
		got = append(got, e.VersionID)
	}
	if want := []string{next.String(), active.String(), building.String()}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("entries %v, want %v", got, want)
	}
	// Nothing given: the entry goes.
	withGiven(rec, coderv1alpha1.TemplateVersionGiven{VersionID: next.String()}, active)
	if len(rec.Spec.Versions) != 2 || givenTo(rec, next) != nil {
		t.Errorf("entries %+v, want the active and building ones only", rec.Spec.Versions)
	}
}

func TestShowIdentity(t *testing.T) {
	v := &codersdk.TemplateVersion{ID: uuid.New(), Name: "abc1", Message: "first",
		Job: codersdk.ProvisionerJob{Tags: map[string]string{"owner": "", "scope": "organization", "team": "a"}}}
	obj := &aggv1.CoderTemplate{}
	showIdentity(obj, v, nil)
	if obj.Spec.VersionName != "" || obj.Spec.VersionMessage != "" || obj.Spec.ProvisionerTags["team"] != "a" {
		t.Errorf("not given: %+v", obj.Spec)
	}
	rec := &records.Record{}
	rec.Spec.Versions = []coderv1alpha1.TemplateVersionGiven{{VersionID: v.ID.String(), Name: true}}
	showIdentity(obj, v, rec)
	if obj.Spec.VersionName != "abc1" || obj.Spec.VersionMessage != "" {
		t.Errorf("name given: %+v", obj.Spec)
	}
}

func TestWaitingFor(t *testing.T) {
	v := &codersdk.TemplateVersion{Job: codersdk.ProvisionerJob{Status: codersdk.ProvisionerJobPending,
		Tags: map[string]string{"owner": "", "scope": "organization", "team": "blue"}},
		MatchedProvisioners: &codersdk.MatchedProvisioners{}}
	if got, want := waitingFor(v), ": no provisioner daemon has its tags (owner= scope=organization team=blue), so the import waits until one does"; got != want {
		t.Errorf("no daemon: %q, want %q", got, want)
	}
	v.MatchedProvisioners = &codersdk.MatchedProvisioners{Count: 2}
	if got := waitingFor(v); !strings.Contains(got, "the 2 provisioner daemons with its tags") {
		t.Errorf("none available: %q", got)
	}
	v.MatchedProvisioners.Available = 1
	if got := waitingFor(v); got != "" {
		t.Errorf("one available: %q, want nothing", got)
	}
}
