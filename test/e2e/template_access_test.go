package e2e

import (
	"context"
	"maps"
	"strings"
	"testing"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	"github.com/coder/coder-k8s/internal/coderapi"
)

// TestTemplateAccess drives a CoderTemplate's access list (spec.access)
// with kubectl apply --server-side through kube-apiserver: against the
// real open-source coderd, which cannot show or change it, a list is
// refused naming template_rbac and only coderd's default is accepted;
// through the licensed contract fake (licensedCoderd with aclCoderd) in
// front of the same coderd, with real users, the list is written as a
// whole, read back, shows changes made in Coder and is healed by apply.
func TestTemplateAccess(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	manifest := func(ns, name, access string) string { return templateManifest(t, ns, name, access, mainTF) }
	const refusal = `spec.access: Forbidden: needs Coder's "template_rbac" feature, which this coderd does not have (open-source build)`

	t.Run("open source: a list is refused, dry run too, and nothing changes; coderd's default is accepted", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest(s.ns, "access", ""))
		if got := s.must(t, "get", "ctpl", "coder.access", "-n", s.ns, "-o", "jsonpath={.spec.access}"); strings.TrimSpace(got) != "" {
			t.Errorf("an open-source coderd's template shows spec.access %q, want none (coderd cannot show it)", got)
		}
		before := s.coderTemplate(t, "access")
		for _, access := range []string{
			"access: {everyone: use, users: [{name: admin, role: admin}]}",
			"access: {}",
			"access: {everyone: admin}",
		} {
			m := manifest(s.ns, "access", access)
			for _, args := range [][]string{{"apply", "--server-side", "-f", m}, {"apply", "--server-side", "--dry-run=server", "-f", m}} {
				out, err := s.run(args...)
				if err == nil || !strings.Contains(out, refusal) || !strings.Contains(out, "is invalid") {
					t.Errorf("kubectl %s with %s: %v\n%s\nwant a 422 saying %q", strings.Join(args[:len(args)-2], " "), access, err, out, refusal)
				}
			}
		}
		if after := s.coderTemplate(t, "access"); !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("refused applies changed the template in Coder (updated_at %s → %s)", before.UpdatedAt, after.UpdatedAt)
		}
		out, err := s.run("apply", "--server-side", "-f", manifest(s.ns, "private", "access: {}"))
		if err == nil || !strings.Contains(out, refusal) {
			t.Errorf("creating a template with access: {}: %v\n%s", err, out)
		}
		if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "private"); !coderapi.IsNotFound(err) {
			t.Errorf("after the refused create, Coder's template private: %v, want 404", err)
		}

		// Coder's default (every member may use the template) is Coder's
		// value; the answer, like reads, shows no list.
		m := manifest(s.ns, "access", "access: {everyone: use}")
		dry := s.must(t, "apply", "--server-side", "--dry-run=server", "-f", m, "-o", "jsonpath={.spec.access}")
		if strings.TrimSpace(dry) != "" {
			t.Errorf("the dry run shows spec.access %q, want none, as the read", dry)
		}
		s.must(t, "apply", "--server-side", "-f", m)
		if after := s.coderTemplate(t, "access"); !after.UpdatedAt.Equal(before.UpdatedAt) {
			t.Errorf("applying coderd's default changed the template in Coder")
		}
		s.must(t, "apply", "--server-side", "-f", manifest(s.ns, "default", "access: {everyone: use}"))
		s.coderTemplate(t, "default")
	})

	fake := newLicensedCoderd(t, s.coder.URL.String())
	fake.acl = newACLCoderd(s.coder.URL.String())
	adoptControlPlane(t, s, "acl", "coder", fake.url)
	org := s.coder.OrganizationID
	userID := map[string]uuid.UUID{}
	for _, name := range []string{"alice", "bob"} {
		u, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: name + "@example.com", Username: name, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{org},
			UserLoginType: codersdk.LoginTypePassword,
		})
		if err != nil {
			t.Fatalf("coderd: create user %s: %v", name, err)
		}
		userID[name] = u.ID
	}
	devs, ops := fake.acl.addGroup(org, "devs"), fake.acl.addGroup(org, "ops")
	type roles = map[uuid.UUID]codersdk.TemplateRole
	inCoder := func(t *testing.T) (users, groups roles) {
		t.Helper()
		return fake.acl.acl(s.coderTemplate(t, "acl").ID)
	}
	const shown = `jsonpath={.spec.access.everyone}|{range .spec.access.users[*]}{.name}={.role} {end}|{range .spec.access.groups[*]}{.name}={.role} {end}`
	get := func(t *testing.T) string {
		t.Helper()
		return strings.TrimSpace(s.must(t, "get", "ctpl", "coder.acl", "-n", "acl", "-o", shown))
	}
	first := "access:\n  everyone: use\n  users: [{name: alice, role: use}, {name: bob, role: admin}]\n  groups: [{name: devs, role: admin}]"
	firstShown := "use|alice=use bob=admin |devs=admin"

	t.Run("licensed: created with a list, read back in name order", func(t *testing.T) {
		m := manifest("acl", "acl", first)
		s.must(t, "apply", "--server-side", "-f", m)
		if got := get(t); got != firstShown {
			t.Errorf("kubectl get shows %q, want %q", got, firstShown)
		}
		users, groups := inCoder(t)
		if want := (roles{userID["alice"]: "use", userID["bob"]: "admin"}); !maps.Equal(users, want) {
			t.Errorf("Coder's users %v, want %v", users, want)
		}
		if want := (roles{org: "use", devs.ID: "admin"}); !maps.Equal(groups, want) {
			t.Errorf("Coder's groups %v, want %v", groups, want)
		}
		if out, err := s.run("diff", "--server-side", "-f", m); err != nil {
			t.Errorf("kubectl diff --server-side right after the apply shows a difference: %v\n%s", err, out)
		}
		list := s.must(t, "get", "ctpl", "-n", "acl", "-o", `jsonpath={.items[?(@.metadata.name=="coder.acl")].spec.access.everyone}`)
		if strings.TrimSpace(list) != "use" {
			t.Errorf("kubectl get (list) shows everyone %q, want use", list)
		}
	})

	t.Run("licensed: a change made in Coder shows as drift; applying again heals it", func(t *testing.T) {
		id := s.coderTemplate(t, "acl").ID
		fake.acl.setACL(id, roles{userID["alice"]: "admin"}, roles{devs.ID: "use", ops.ID: "use"})
		if got, want := get(t), "|alice=admin |devs=use ops=use"; got != want {
			t.Errorf("after the change in Coder kubectl get shows %q, want %q", got, want)
		}
		m := manifest("acl", "acl", first)
		out, err := s.run("diff", "--server-side", "-f", m)
		if err == nil || !strings.Contains(out, "name: ops") {
			t.Errorf("kubectl diff --server-side after the change in Coder: %v, want the drift:\n%s", err, out)
		}
		s.must(t, "apply", "--server-side", "-f", m)
		if got := get(t); got != firstShown {
			t.Errorf("after applying again kubectl get shows %q, want %q", got, firstShown)
		}
		users, groups := inCoder(t)
		if !maps.Equal(users, roles{userID["alice"]: "use", userID["bob"]: "admin"}) || !maps.Equal(groups, roles{org: "use", devs.ID: "admin"}) {
			t.Errorf("after applying again Coder has users %v, groups %v", users, groups)
		}
	})

	t.Run("licensed: entries dropped from the spec are removed in Coder; a dry run changes nothing", func(t *testing.T) {
		m := manifest("acl", "acl", "access:\n  users: [{name: alice, role: admin}]")
		dry := strings.TrimSpace(s.must(t, "apply", "--server-side", "--dry-run=server", "-f", m, "-o", shown))
		if want := "|alice=admin |"; dry != want {
			t.Errorf("the dry run shows %q, want %q", dry, want)
		}
		if users, groups := inCoder(t); len(users) != 2 || len(groups) != 2 {
			t.Errorf("the dry run changed Coder's list: users %v, groups %v", users, groups)
		}
		s.must(t, "apply", "--server-side", "-f", m)
		if got := get(t); got != dry {
			t.Errorf("kubectl get shows %q, want the dry run's %q", got, dry)
		}
		users, groups := inCoder(t)
		if !maps.Equal(users, roles{userID["alice"]: "admin"}) || len(groups) != 0 {
			t.Errorf("Coder has users %v, groups %v; want alice as admin only", users, groups)
		}
	})

	t.Run("licensed: created without everyone, the template is never the Everyone group's", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("acl", "private", "access:\n  users: [{name: alice, role: use}]"))
		id := s.coderTemplate(t, "private").ID
		users, groups := fake.acl.acl(id)
		if !maps.Equal(users, roles{userID["alice"]: "use"}) || len(groups) != 0 {
			t.Errorf("Coder has users %v, groups %v; want alice only", users, groups)
		}
		// The create said disable_everyone_group_access: no PATCH had to
		// take the Everyone group's access away.
		fake.acl.mu.Lock()
		defer fake.acl.mu.Unlock()
		for _, p := range fake.acl.patches[id] {
			if p.GroupPerms != nil {
				t.Errorf("the new template's ACL was sent group perms %v", p.GroupPerms)
			}
		}
	})

	t.Run("licensed: an unknown user or group is refused naming it, dry run too, before anything changes", func(t *testing.T) {
		m := manifest("acl", "acl", "access:\n  everyone: use\n  users: [{name: nosuchuser, role: use}]\n  groups: [{name: nosuchgroup, role: use}]")
		for _, args := range [][]string{{"apply", "--server-side", "-f", m}, {"apply", "--server-side", "--dry-run=server", "-f", m}} {
			out, err := s.run(args...)
			if err == nil || !strings.Contains(out, `spec.access.users[nosuchuser]: Not found: "nosuchuser"`) ||
				!strings.Contains(out, `spec.access.groups[nosuchgroup]: Not found: "nosuchgroup"`) {
				t.Errorf("kubectl %s: %v\n%s\nwant a 422 naming both", strings.Join(args[:len(args)-2], " "), err, out)
			}
		}
		users, groups := inCoder(t)
		if !maps.Equal(users, roles{userID["alice"]: "admin"}) || len(groups) != 0 {
			t.Errorf("the refused apply changed Coder's list: users %v, groups %v", users, groups)
		}
	})
}
