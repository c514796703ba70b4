package storage

import (
	"slices"
	"strings"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"k8s.io/apimachinery/pkg/util/validation/field"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

func TestGroupAndOrganizationNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want groupObjectName
		ok   bool
	}{
		{"coder.devs", groupObjectName{Org: "coder", Name: "devs"}, true},
		{"cp.coder.Everyone", groupObjectName{ControlPlane: "cp", Org: "coder", Name: "Everyone"}, true},
		{"coder." + strings.Repeat("g", maxGroupName), groupObjectName{Org: "coder", Name: strings.Repeat("g", maxGroupName)}, true},
		{"coder." + strings.Repeat("g", maxGroupName+1), groupObjectName{}, false},
		{"coder", groupObjectName{}, false},
		{"coder.dev_s", groupObjectName{}, false},
	} {
		got, err := parseGroupName(tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseGroupName(%q) = %+v, %v; want %+v, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if tc.ok && got.String(got.ControlPlane != "") != tc.in {
			t.Errorf("%q reads back as %q", tc.in, got.String(got.ControlPlane != ""))
		}
	}
	for in, ok := range map[string]bool{"coder": true, "cp.coder": true, "a.b.c": false, "Bad_Org": false} {
		if _, err := parseOrgName(in); (err == nil) != ok {
			t.Errorf("parseOrgName(%q) = %v, want ok %v", in, err, ok)
		}
	}
}

// A group update sends coderd only what the spec sets to another value,
// and members as the difference of the two sets; unset keeps Coder's.
func TestGroupChange(t *testing.T) {
	cur := aggv1.CoderGroupSpec{DisplayName: new("Devs"), AvatarURL: new(""), Members: []string{"alice", "bob"}, QuotaAllowance: new(int32(2))}
	req, add, remove, changed := groupChange(&cur, &aggv1.CoderGroupSpec{})
	if changed || req.DisplayName != nil || req.AvatarURL != nil || req.QuotaAllowance != nil || add != nil || remove != nil {
		t.Errorf("an empty spec changes %+v (+%v -%v)", req, add, remove)
	}
	if _, _, _, changed := groupChange(&cur, cur.DeepCopy()); changed {
		t.Errorf("the same spec is a change")
	}
	next := aggv1.CoderGroupSpec{DisplayName: new("Developers"), Members: []string{"bob", "carol"}, QuotaAllowance: new(int32(5))}
	req, add, remove, changed = groupChange(&cur, &next)
	if !changed || *req.DisplayName != "Developers" || *req.QuotaAllowance != 5 || req.AvatarURL != nil ||
		!slices.Equal(add, []string{"carol"}) || !slices.Equal(remove, []string{"alice"}) {
		t.Errorf("groupChange = %+v +%v -%v %v", req, add, remove, changed)
	}
	// An empty list removes everyone.
	_, add, remove, changed = groupChange(&cur, &aggv1.CoderGroupSpec{Members: []string{}})
	if !changed || add != nil || !slices.Equal(remove, []string{"alice", "bob"}) {
		t.Errorf("members [] = +%v -%v %v, want everyone removed", add, remove, changed)
	}
}

func TestValidateGroup(t *testing.T) {
	g := &aggv1.CoderGroup{}
	g.Name = "coder.Everyone"
	s := &GroupStorage{}
	if _, errs := s.validateCreate(g); len(errs) == 0 {
		t.Errorf("a create of the Everyone group is accepted")
	}
	g.Name = "coder.devs"
	g.Spec = aggv1.CoderGroupSpec{Organization: "other", Members: []string{"alice", "alice", "not a name"}, QuotaAllowance: new(int32(-1))}
	_, errs := s.validateCreate(g)
	var got []string
	for _, e := range errs {
		got = append(got, string(e.Type)+" "+e.Field)
	}
	want := []string{"FieldValueInvalid spec.organization", "FieldValueInvalid spec.quotaAllowance", "FieldValueDuplicate spec.members[1]", "FieldValueInvalid spec.members[2]"}
	if !slices.Equal(got, want) {
		t.Errorf("errors %q, want %q", got, want)
	}
}

func TestOrganizationChange(t *testing.T) {
	cur := aggv1.CoderOrganizationSpec{DisplayName: new("Coder"), Description: new(""), Icon: new("")}
	if _, changed := organizationChange(&cur, &aggv1.CoderOrganizationSpec{}); changed {
		t.Errorf("an empty spec is a change")
	}
	req, changed := organizationChange(&cur, &aggv1.CoderOrganizationSpec{DisplayName: new("R&D"), Description: new("lab")})
	if !changed || req.DisplayName != "R&D" || *req.Description != "lab" || req.Icon != nil || req.Name != "" {
		t.Errorf("organizationChange = %+v, %v", req, changed)
	}
}

// The refusal of a write a coderd cannot make is the template settings'
// message, naming the feature and why it is missing; coderd's own
// answers for a missing feature get the same.
func TestFeatureRefusal(t *testing.T) {
	for f, why := range map[*coderdFeatures]string{{openSource: true}: "open-source build", {enabled: map[codersdk.FeatureName]bool{}}: "not entitled by its license"} {
		e := f.refusal(namePath, codersdk.FeatureTemplateRBAC)
		if e.Type != field.ErrorTypeForbidden || !strings.Contains(e.Detail, `"template_rbac"`) || !strings.Contains(e.Detail, why) {
			t.Errorf("refusal = %v", e)
		}
	}
}
