package mcpserver

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
)

// TestUserRowsReadTheObjectsJSON decodes a coderusers list as
// kube-apiserver sends it into the row sources: each row shows what the
// object says, a never-seen user (coderd's zero time) has no lastSeen,
// and the filters match username (without the control plane prefix),
// name or email, case-insensitively, and site roles exactly.
func TestUserRowsReadTheObjectsJSON(t *testing.T) {
	seenAt := metav1.NewTime(time.Date(2026, 11, 26, 9, 30, 0, 0, time.FixedZone("CET", 3600)))
	never := metav1.NewTime(time.Time{})
	us := aggv1.CoderUserList{
		ListMeta: metav1.ListMeta{ResourceVersion: "9"},
		Items: []aggv1.CoderUser{{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "alice"},
			Spec: aggv1.CoderUserSpec{Email: "alice@example.com", Name: "Alice Ä", LoginType: "password", Roles: []string{"auditor", "user-admin"},
				Organizations: []aggv1.CoderUserOrganization{{Name: "coder", Roles: []string{"organization-admin"}}}},
			Status: aggv1.CoderUserStatus{ID: "1", Status: "active", LastSeenAt: &seenAt},
		}, {
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "cp.robot"},
			Spec:       aggv1.CoderUserSpec{Email: "robot@example.com", LoginType: "none"},
			Status:     aggv1.CoderUserStatus{ID: "2", Status: "dormant", LastSeenAt: &never},
		}},
	}
	var l partialList[userRowSource]
	decode(t, us, &l)
	if l.Metadata.ResourceVersion != "9" || len(l.Items) != 2 {
		t.Fatalf("resourceVersion %q, %d items; want 9 and 2", l.Metadata.ResourceVersion, len(l.Items))
	}
	want := []UserRow{
		{Namespace: "team", Name: "alice", FullName: "Alice Ä", Email: "alice@example.com", Roles: []string{"auditor", "user-admin"}, Status: "active", LastSeen: "2026-11-26T08:30:00Z"},
		{Namespace: "team", Name: "cp.robot", Email: "robot@example.com", Status: "dormant"},
	}
	for i := range l.Items {
		if d := cmp.Diff(want[i], l.Items[i].row()); d != "" {
			t.Errorf("user row %d (-want +got):\n%s", i, d)
		}
	}
	alice, robot := &l.Items[0], &l.Items[1]
	for _, c := range []struct {
		u            *userRowSource
		search, role string
		want         bool
	}{
		{alice, "", "", true},
		{alice, "ali", "", true},
		{alice, "alice ä", "", true},
		{alice, "@example", "user-admin", true},
		{alice, "", "owner", false},
		{alice, "", "admin", false},
		{robot, "robot", "", true},
		{robot, "cp", "", false}, // the prefix is not the username
		{robot, "alice", "", false},
	} {
		if got := c.u.matches(c.search, c.role); got != c.want {
			t.Errorf("%s matches(%q, %q) = %v, want %v", c.u.Name, c.search, c.role, got, c.want)
		}
	}
}

// TestFillIdentity shows what whoami reports of the caller's coderuser.
func TestFillIdentity(t *testing.T) {
	seenAt := metav1.NewTime(time.Date(2026, 11, 26, 9, 30, 0, 0, time.UTC))
	u := aggv1.CoderUser{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "cp.alice"},
		Spec: aggv1.CoderUserSpec{Email: "alice@example.com", Name: "Alice", LoginType: "oidc", Roles: []string{"template-admin"},
			Organizations: []aggv1.CoderUserOrganization{{Name: "coder", Roles: []string{"organization-auditor"}}, {Name: "other"}}},
		Status: aggv1.CoderUserStatus{Status: "active", LastSeenAt: &seenAt},
	}
	id := CoderIdentity{Namespace: "team", ControlPlane: "cp"}
	fillIdentity(&id, &u)
	want := CoderIdentity{Namespace: "team", ControlPlane: "cp", Object: "cp.alice", Username: "alice", Name: "Alice", Email: "alice@example.com",
		Status: "active", LoginType: "oidc", Roles: []string{"template-admin"},
		Organizations: []OrgRole{{Name: "coder", Roles: []string{"organization-auditor"}}, {Name: "other"}}, LastSeen: "2026-11-26T09:30:00Z"}
	if d := cmp.Diff(want, id); d != "" {
		t.Errorf("whoami identity (-want +got):\n%s", d)
	}
}
