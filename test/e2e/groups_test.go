package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
)

// TestGroups drives codergroups and coderorganizations with kubectl
// through kube-apiserver (Mapped identity). Against the real open-source
// coderd: its organizations are listed as coderd has them; an
// organization create or change is refused with 422 naming
// multiple_organizations and a group create with 422 naming
// template_rbac, and nothing changes in coderd. Against an entitled
// Enterprise coderd (the contract fake of groups_fake_test.go in front of
// the real one): a group created with members and a quota allowance,
// read back, a member removed in Coder seen as drift and healed by
// applying again, deleted; an organization created, its display name
// changed, deleted.
func TestGroups(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()

	t.Run("open source: the organizations are listed as coderd has them", func(t *testing.T) {
		org, err := s.coder.Client.OrganizationByName(ctx, s.org)
		if err != nil {
			t.Fatal(err)
		}
		count := realMembersCount(t, s, org.ID)
		out := s.must(t, "get", "coderorganizations", "-n", s.ns, "-o",
			`jsonpath={range .items[*]}{.metadata.name}|{.spec.displayName}|{.status.membersCount}|{.status.default}|{.status.id}{"\n"}{end}`)
		want := fmt.Sprintf("%s|%s|%d|true|%s", org.Name, org.DisplayName, count, org.ID)
		if strings.TrimSpace(out) != want {
			t.Errorf("kubectl get coderorganizations shows %q, want %q", out, want)
		}
		table := s.must(t, "get", "corg", s.org, "-n", s.ns)
		if !strings.Contains(table, "DISPLAY NAME") || !strings.Contains(table, "MEMBERS") {
			t.Errorf("kubectl get corg shows no printer columns:\n%s", table)
		}
	})

	orgsBefore, err := s.coder.Client.Organizations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("open source: organization writes are refused with 422 naming multiple_organizations", func(t *testing.T) {
		m := writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderOrganization\nmetadata: {name: research, namespace: %s}\nspec: {displayName: Research}\n", s.ns))
		for _, args := range [][]string{{"apply", "--server-side", "-f", m}, {"create", "-f", m}, {"create", "--dry-run=server", "-f", m}} {
			out, err := s.run(args...)
			if err == nil || !strings.Contains(out, "is invalid") || !strings.Contains(out, `"multiple_organizations"`) {
				t.Errorf("kubectl %s: %v\n%s\nwant a 422 naming multiple_organizations", strings.Join(args, " "), err, out)
			}
		}
		out, err := s.run("patch", "corg", s.org, "-n", s.ns, "--type=merge", "-p", `{"spec":{"displayName":"Renamed"}}`)
		if err == nil || !strings.Contains(out, "is invalid") || !strings.Contains(out, `"multiple_organizations"`) {
			t.Errorf("a display name change of the default organization: %v\n%s\nwant a 422 naming multiple_organizations", err, out)
		}
		// Metadata alone needs nothing of Coder.
		s.must(t, "label", "corg", s.org, "-n", s.ns, "team=platform")
		if got := s.must(t, "get", "corg", "-n", s.ns, "-l", "team=platform", "-o", "jsonpath={.items[*].metadata.name}"); strings.TrimSpace(got) != s.org {
			t.Errorf("kubectl get -l team=platform shows %q, want %q", got, s.org)
		}
	})

	t.Run("open source: groups are none, and a group create is refused with 422 naming template_rbac", func(t *testing.T) {
		if out := s.must(t, "get", "codergroups", "-n", s.ns, "-o", "jsonpath={.items[*].metadata.name}"); strings.TrimSpace(out) != "" {
			t.Errorf("kubectl get codergroups shows %q, want none", out)
		}
		m := writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderGroup\nmetadata: {name: %s.devs, namespace: %s}\nspec: {members: [admin], quotaAllowance: 3}\n", s.org, s.ns))
		for _, args := range [][]string{{"apply", "--server-side", "-f", m}, {"apply", "--server-side", "--dry-run=server", "-f", m}} {
			out, err := s.run(args...)
			if err == nil || !strings.Contains(out, "is invalid") || !strings.Contains(out, `"template_rbac"`) {
				t.Errorf("kubectl %s: %v\n%s\nwant a 422 naming template_rbac", strings.Join(args, " "), err, out)
			}
		}
		out, err := s.run("get", "cgrp", s.org+".devs", "-n", s.ns)
		if err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("kubectl get cgrp %s.devs: %v\n%s\nwant NotFound", s.org, err, out)
		}
	})

	t.Run("open source: nothing changed in coderd", func(t *testing.T) {
		after, err := s.coder.Client.Organizations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(after) != len(orgsBefore) || after[0].DisplayName != orgsBefore[0].DisplayName || !after[0].UpdatedAt.Equal(orgsBefore[0].UpdatedAt) {
			t.Errorf("coderd's organizations were %+v, now %+v", orgsBefore, after)
		}
	})

	fake := newOrgsCoderd(t, s.coder.URL.String())
	const ns = "groups"
	adoptControlPlane(t, s, ns, "coder", fake.url)
	for _, name := range []string{"grp-alice", "grp-bob"} {
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: name + "@example.com", Username: name, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
			UserLoginType: codersdk.LoginTypePassword,
		}); err != nil {
			t.Fatalf("coderd: create user %s: %v", name, err)
		}
	}
	groupYAML := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderGroup
metadata: {name: %s.devs, namespace: %s}
spec:
  displayName: Developers
  members: [grp-alice, grp-bob]
  quotaAllowance: 5
`, s.org, ns)
	groupManifest := writeManifest(t, groupYAML)
	const shown = `jsonpath={.spec.displayName}|{.spec.members[*]}|{.spec.quotaAllowance}|{.status.memberCount}|{.status.source}`
	getGroup := func(t *testing.T) string {
		t.Helper()
		return strings.TrimSpace(s.must(t, "get", "cgrp", s.org+".devs", "-n", ns, "-o", shown))
	}
	inCoder := func(t *testing.T) []string {
		t.Helper()
		g, ok := fake.group("devs")
		if !ok {
			t.Fatal("the fake coderd has no group devs")
		}
		var names []string
		for _, m := range g.Members {
			names = append(names, m.Username)
		}
		slices.Sort(names)
		return names
	}

	t.Run("licensed: a group is created with members and a quota allowance, and read back", func(t *testing.T) {
		dry := s.must(t, "apply", "--server-side", "--dry-run=server", "-f", groupManifest, "-o", shown)
		if want := "Developers|grp-alice grp-bob|5|2|user"; strings.TrimSpace(dry) != want {
			t.Errorf("the dry run shows %q, want %q", dry, want)
		}
		if _, ok := fake.group("devs"); ok {
			t.Fatal("the dry run created the group in Coder")
		}
		s.must(t, "apply", "--server-side", "-f", groupManifest)
		if got, want := getGroup(t), "Developers|grp-alice grp-bob|5|2|user"; got != want {
			t.Errorf("kubectl get shows %q, want %q", got, want)
		}
		if got := inCoder(t); !slices.Equal(got, []string{"grp-alice", "grp-bob"}) {
			t.Errorf("Coder's members %v, want grp-alice grp-bob", got)
		}
		if g, _ := fake.group("devs"); g.QuotaAllowance != 5 || g.DisplayName != "Developers" {
			t.Errorf("Coder's group %+v, want quota 5 and display name Developers", g)
		}
		list := s.must(t, "get", "cgrp", "-n", ns, "-o", `jsonpath={range .items[*]}{.metadata.name} {end}`)
		if got := strings.Fields(list); !slices.Equal(got, []string{s.org + ".Everyone", s.org + ".devs"}) && !slices.Equal(got, []string{s.org + ".devs", s.org + ".Everyone"}) {
			t.Errorf("kubectl get cgrp lists %q, want the Everyone group and devs", list)
		}
		if out, err := s.run("diff", "--server-side", "-f", groupManifest); err != nil {
			t.Errorf("kubectl diff --server-side right after the apply shows a difference: %v\n%s", err, out)
		}
		out, err := s.run("apply", "--server-side", "-f", writeManifest(t, strings.Replace(groupYAML, "grp-bob]", "no-such-user]", 1)))
		if err == nil || !strings.Contains(out, "no-such-user") {
			t.Errorf("a member Coder does not know: %v\n%s\nwant a 422 naming them", err, out)
		}
	})

	t.Run("licensed: a member removed in Coder shows as drift; applying again heals it", func(t *testing.T) {
		fake.removeMember("devs", "grp-bob")
		if got, want := getGroup(t), "Developers|grp-alice|5|1|user"; got != want {
			t.Errorf("after the change in Coder kubectl get shows %q, want %q", got, want)
		}
		if out, err := s.run("diff", "--server-side", "-f", groupManifest); err == nil {
			t.Errorf("kubectl diff shows no drift:\n%s", out)
		}
		s.must(t, "apply", "--server-side", "-f", groupManifest)
		if got := inCoder(t); !slices.Equal(got, []string{"grp-alice", "grp-bob"}) {
			t.Errorf("after applying again Coder's members are %v, want grp-alice grp-bob", got)
		}
		if got, want := getGroup(t), "Developers|grp-alice grp-bob|5|2|user"; got != want {
			t.Errorf("kubectl get shows %q, want %q", got, want)
		}
	})

	t.Run("licensed: a group is deleted", func(t *testing.T) {
		s.must(t, "delete", "cgrp", s.org+".devs", "-n", ns)
		if _, ok := fake.group("devs"); ok {
			t.Error("the group is still in Coder")
		}
		if out, err := s.run("get", "cgrp", s.org+".devs", "-n", ns); err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("kubectl get after the delete: %v\n%s", err, out)
		}
	})

	t.Run("licensed: an organization is created, its display name changed, and deleted", func(t *testing.T) {
		m := func(display string) string {
			return writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderOrganization\nmetadata: {name: research, namespace: %s}\nspec: {displayName: %q, description: Lab work}\n", ns, display))
		}
		s.must(t, "apply", "--server-side", "-f", m("Research"))
		o := fake.own("research")
		if o == nil || o.DisplayName != "Research" || o.Description != "Lab work" {
			t.Fatalf("Coder's organization research: %+v", o)
		}
		got := strings.TrimSpace(s.must(t, "get", "corg", "research", "-n", ns, "-o", "jsonpath={.spec.displayName}|{.spec.description}|{.status.id}|{.status.default}"))
		if want := "Research|Lab work|" + o.ID.String() + "|"; got != want { // status.default false is omitted
			t.Errorf("kubectl get shows %q, want %q", got, want)
		}
		s.must(t, "apply", "--server-side", "-f", m("R and D"))
		if o := fake.own("research"); o == nil || o.DisplayName != "R and D" {
			t.Errorf("after the change Coder's organization is %+v, want display name R and D", o)
		}
		s.must(t, "delete", "corg", "research", "-n", ns)
		if o := fake.own("research"); o != nil {
			t.Errorf("the organization is still in Coder: %+v", o)
		}
		out, err := s.run("delete", "corg", s.org, "-n", ns)
		if err == nil || !strings.Contains(out, "default organization") {
			t.Errorf("deleting the default organization: %v\n%s\nwant a 409", err, out)
		}
	})
}

// realMembersCount is what coderd's paginated members list counts for
// organization id.
func realMembersCount(t *testing.T, s *aggStack, id uuid.UUID) int {
	t.Helper()
	res, err := s.coder.Client.Request(context.Background(), http.MethodGet, "/api/v2/organizations/"+id.String()+"/paginated-members?limit=1", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var page codersdk.PaginatedMembersResponse
	if err := json.NewDecoder(res.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	return page.Count
}
