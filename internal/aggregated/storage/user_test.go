package storage

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/backend"
	"github.com/coder/coder-k8s/internal/aggregated/records"
)

func TestParseUserName(t *testing.T) {
	for in, want := range map[string]userName{
		"alice":      {Username: "alice"},
		"cp.alice-b": {ControlPlane: "cp", Username: "alice-b"},
	} {
		got, err := parseUserName(in)
		if err != nil || got != want {
			t.Errorf("parseUserName(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if s := got.String(got.ControlPlane != ""); s != in {
			t.Errorf("%+v.String() = %q, want %q", got, s, in)
		}
	}
	for _, bad := range []string{"", "a.b.c", "al_ice", "-alice", "CP.alice"} {
		if _, err := parseUserName(bad); err == nil {
			t.Errorf("parseUserName(%q) succeeded", bad)
		}
	}
}

func TestToUser(t *testing.T) {
	id := uuid.New()
	org := uuid.New()
	created := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	u := codersdk.User{
		ReducedUser: codersdk.ReducedUser{
			MinimalUser: codersdk.MinimalUser{ID: id, Username: "alice", Name: "Alice"},
			Email:       "alice@example.com", CreatedAt: created, Status: codersdk.UserStatusSuspended, LoginType: codersdk.LoginTypePassword,
		},
		OrganizationIDs: []uuid.UUID{org},
		Roles:           []codersdk.SlimRole{{Name: "user-admin"}, {Name: "auditor"}, {Name: codersdk.RoleMember}},
	}
	tgt := target{Backend: backend.Backend{Namespace: "ns", ControlPlane: "cp"}, prefixed: true}
	orgs := []aggv1.CoderUserOrganization{{Name: "coder", Roles: []string{"organization-auditor"}}}
	obj := toUser(tgt, &u, orgs)
	if obj.Name != "cp.alice" || obj.Namespace != "ns" || string(obj.UID) != id.String() || obj.Labels[aggv1.LabelControlPlane] != "cp" {
		t.Errorf("metadata %+v", obj.ObjectMeta)
	}
	if !obj.Spec.Suspended || obj.Spec.Email != "alice@example.com" || obj.Spec.LoginType != "password" || obj.Status.Status != "suspended" {
		t.Errorf("spec %+v status %+v", obj.Spec, obj.Status)
	}
	if got := strings.Join(obj.Spec.Roles, ","); got != "auditor,user-admin" {
		t.Errorf("roles %q: want sorted, without member", got)
	}
	if obj.Status.LastSeenAt != nil {
		t.Errorf("a user never seen shows lastSeenAt %v", obj.Status.LastSeenAt)
	}
	if obj.Spec.PasswordSecretRef != nil {
		t.Error("a password ref without a record")
	}
	rec := &records.Record{}
	setPasswordRecord(rec, &aggv1.SecretKeySelector{Name: "s", Key: "k"}, "42")
	showPassword(obj, rec)
	if obj.Spec.PasswordSecretRef == nil || *obj.Spec.PasswordSecretRef != (aggv1.SecretKeySelector{Name: "s", Key: "k"}) || obj.Status.PasswordSecretResourceVersion != "42" {
		t.Errorf("password from the record: %+v %q", obj.Spec.PasswordSecretRef, obj.Status.PasswordSecretResourceVersion)
	}
	// A login type without a password shows none, whatever the record.
	none := toUser(tgt, &u, orgs)
	none.Spec.LoginType = "none"
	showPassword(none, &records.Record{Spec: coderv1alpha1.CoderObjectRecordSpec{Password: &coderv1alpha1.UserPasswordRecord{SecretName: "s", SecretKey: "k"}}})
	if none.Spec.PasswordSecretRef != nil {
		t.Error("login type none shows a password ref")
	}
}

func TestValidateUserSpec(t *testing.T) {
	for _, tc := range []struct {
		spec aggv1.CoderUserSpec
		want string
	}{
		{aggv1.CoderUserSpec{LoginType: "saml"}, "spec.loginType: Unsupported value"},
		{aggv1.CoderUserSpec{Roles: []string{"owner", "owner"}}, "spec.roles[1]: Duplicate value"},
		{aggv1.CoderUserSpec{Roles: []string{"member"}}, "spec.roles[0]: Invalid value"},
		{aggv1.CoderUserSpec{Organizations: []aggv1.CoderUserOrganization{{Name: "a"}, {Name: "a"}}}, "spec.organizations[1].name: Duplicate value"},
		{aggv1.CoderUserSpec{Organizations: []aggv1.CoderUserOrganization{{Name: "a", Roles: []string{"organization-member"}}}}, "spec.organizations[0].roles[0]: Invalid value"},
		{aggv1.CoderUserSpec{LoginType: "none", PasswordSecretRef: &aggv1.SecretKeySelector{Name: "s", Key: "k"}}, "spec.passwordSecretRef: Forbidden"},
		{aggv1.CoderUserSpec{PasswordSecretRef: &aggv1.SecretKeySelector{Name: "s"}}, "spec.passwordSecretRef.key: Required"},
	} {
		errs := validateUserSpec(&tc.spec)
		if !strings.Contains(errs.ToAggregate().Error(), tc.want) {
			t.Errorf("validateUserSpec(%+v) = %v, want %q", tc.spec, errs, tc.want)
		}
	}
	ok := aggv1.CoderUserSpec{LoginType: "password", Roles: []string{"auditor"}, PasswordSecretRef: &aggv1.SecretKeySelector{Name: "s", Key: "k"},
		Organizations: []aggv1.CoderUserOrganization{{Name: "coder", Roles: []string{"organization-admin"}}}}
	if errs := validateUserSpec(&ok); len(errs) > 0 {
		t.Errorf("a valid spec: %v", errs)
	}
}

func TestDiffUser(t *testing.T) {
	cur := aggv1.CoderUserSpec{Name: "A", Roles: []string{"auditor", "template-admin"},
		Organizations:     []aggv1.CoderUserOrganization{{Name: "a", Roles: []string{"organization-auditor"}}, {Name: "b"}},
		PasswordSecretRef: &aggv1.SecretKeySelector{Name: "s", Key: "k"}}
	// Unset roles and organizations keep Coder's; the same sets in
	// another order change nothing.
	same := cur
	same.Roles, same.Organizations = nil, nil
	if c := diffUser(&cur, &same); c.any() {
		t.Errorf("unset roles and organizations: %+v, want no change", c)
	}
	same.Roles = []string{"template-admin", "auditor"}
	if c := diffUser(&cur, &same); c.any() {
		t.Errorf("reordered roles: %+v", c)
	}
	next := cur
	next.Name, next.Suspended = "B", true
	next.Roles = []string{}
	next.Organizations = []aggv1.CoderUserOrganization{{Name: "a"}, {Name: "c", Roles: []string{"organization-admin"}}}
	next.PasswordSecretRef = &aggv1.SecretKeySelector{Name: "s2", Key: "k"}
	c := diffUser(&cur, &next)
	if !c.name || !c.status || !c.roles || !c.passwordRef || c.passwordDropped {
		t.Errorf("%+v", c)
	}
	if !slices.Equal(c.addOrgs, []string{"c"}) || !slices.Equal(c.dropOrgs, []string{"b"}) {
		t.Errorf("organizations added %v, dropped %v; want [c] and [b]", c.addOrgs, c.dropOrgs)
	}
	if len(c.orgRoles) != 2 || c.orgRoles[0].Name != "a" || len(c.orgRoles[0].Roles) != 0 || c.orgRoles[1].Name != "c" {
		t.Errorf("organization roles to set: %+v; want a's cleared and c's set", c.orgRoles)
	}
	dropped := cur
	dropped.PasswordSecretRef = nil
	if c := diffUser(&cur, &dropped); !c.passwordDropped || c.passwordRef {
		t.Errorf("a dropped password ref: %+v", c)
	}
	if got := added([]string{"auditor"}, []string{"auditor", "owner"}); !slices.Equal(got, []string{"owner"}) {
		t.Errorf("added = %v", got)
	}
}

func TestWithSpecOfUserKeepsUnset(t *testing.T) {
	cur := &aggv1.CoderUser{Spec: aggv1.CoderUserSpec{Email: "e", LoginType: "none", Roles: []string{"auditor"},
		Organizations: []aggv1.CoderUserOrganization{{Name: "coder"}}}}
	next := &aggv1.CoderUser{Spec: aggv1.CoderUserSpec{Email: "e", Suspended: true}}
	out := withSpecOf(cur, next)
	if out.Spec.LoginType != "none" || !slices.Equal(out.Spec.Roles, []string{"auditor"}) || len(out.Spec.Organizations) != 1 || !out.Spec.Suspended {
		t.Errorf("dry-run view %+v", out.Spec)
	}
}

// TestScanUsersList reads coderd's users answer element by element: each
// user's JSON as sent, the count, and each user's ID without decoding the
// rest; a malformed answer is an error.
func TestScanUsersList(t *testing.T) {
	a, b := uuid.New(), uuid.New()
	body := `{"users":[{"username":"a","id":"` + a.String() + `","roles":[]},{"id":"` + b.String() + `"}],"count":7}`
	var raws []string
	count, err := scanObjectList(strings.NewReader(body), "users", func(raw []byte) error { raws = append(raws, string(raw)); return nil })
	if err != nil || count != 7 || len(raws) != 2 {
		t.Fatalf("count %d, %d users, %v; want 7, 2", count, len(raws), err)
	}
	for i, want := range []uuid.UUID{a, b} {
		if id, err := userIDOf([]byte(raws[i])); err != nil || id != want {
			t.Errorf("user %d: id %s, %v; want %s", i, id, err, want)
		}
	}
	for _, bad := range []string{`{"users":[}`, `{"users":[],"count":1`, `[]`, `{"users":[]} x`} {
		if _, err := scanObjectList(strings.NewReader(bad), "users", func([]byte) error { return nil }); err == nil {
			t.Errorf("scanObjectList(%q) succeeded", bad)
		}
	}
	if _, err := userIDOf([]byte(`{"username":"x"}`)); err == nil {
		t.Error("userIDOf of a user without an id succeeded")
	}
}
