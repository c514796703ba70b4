package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestUsers drives coderusers with kubectl through kube-apiserver against
// the real coderd (Mapped identity): users created with login types
// password (from a Secret) and none, site and organization roles set and
// replaced, suspended and activated, renamed; email refused as
// immutable; a password from a Secret the writer may not read refused;
// the password in no object, record, event, dry-run answer or log; a
// delete refused while the user owns a workspace and allowed after; reads
// as a member and as a user admin; a user admin refused granting owner;
// kubectl get's columns.
func TestUsers(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	const password = "Users-Secret-Pa55word!"
	if err := s.c.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "alice-password", Namespace: s.ns},
		StringData: map[string]string{"password": password}}); err != nil {
		t.Fatal(err)
	}
	manifest := func(name, spec string) string {
		return writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderUser\nmetadata: {name: %s, namespace: %s}\nspec:\n%s", name, s.ns, spec))
	}
	aliceSpec := func(extra string) string {
		return fmt.Sprintf(`  email: alice@example.com
  name: Alice A
  passwordSecretRef: {name: alice-password, key: password}
%s`, extra)
	}
	get := func(t *testing.T, name string) *aggv1.CoderUser {
		t.Helper()
		var u aggv1.CoderUser
		if err := json.Unmarshal([]byte(s.must(t, "get", "cu", name, "-n", s.ns, "-o", "json")), &u); err != nil {
			t.Fatal(err)
		}
		return &u
	}
	coderUser := func(t *testing.T, name string) codersdk.User {
		t.Helper()
		u, err := s.coder.Client.User(ctx, name)
		if err != nil {
			t.Fatalf("coderd: user %s: %v", name, err)
		}
		return u
	}
	orgRoles := func(t *testing.T, name string) []string {
		t.Helper()
		ms, err := s.coder.Client.OrganizationMembers(ctx, s.coder.OrganizationID, codersdk.OrganizationMembersQueryOptionUserID(coderUser(t, name).ID))
		if err != nil || len(ms) != 1 {
			t.Fatalf("coderd: membership of %s: %v %v", name, ms, err)
		}
		return roleNamesOf(ms[0].Roles)
	}
	var dryOut string

	t.Run("a dry-run create answers the object and creates nothing", func(t *testing.T) {
		dryOut = s.must(t, "apply", "--server-side", "--dry-run=server", "-f", manifest("alice", aliceSpec("  roles: [template-admin]\n")), "-o", "yaml")
		if !strings.Contains(dryOut, "loginType: password") || !strings.Contains(dryOut, "template-admin") {
			t.Errorf("dry run's answer:\n%s", dryOut)
		}
		if _, err := s.coder.Client.User(ctx, "alice"); err == nil {
			t.Error("the dry run created user alice in Coder")
		}
	})

	t.Run("created with a password from a Secret, site and organization roles", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("alice", aliceSpec(fmt.Sprintf("  roles: [template-admin]\n  organizations: [{name: %s, roles: [organization-auditor]}]\n", s.org))))
		u := get(t, "alice")
		cu := coderUser(t, "alice")
		if u.Spec.Email != "alice@example.com" || u.Spec.Name != "Alice A" || u.Spec.LoginType != "password" || u.Status.ID != cu.ID.String() ||
			strings.Join(u.Spec.Roles, ",") != "template-admin" || u.Spec.PasswordSecretRef == nil || u.Status.Status != string(codersdk.UserStatusDormant) {
			t.Errorf("kubectl get shows %+v", u)
		}
		if got := strings.Join(roleNamesOf(cu.Roles), ","); got != "template-admin" {
			t.Errorf("coderd's site roles %q", got)
		}
		if got := strings.Join(orgRoles(t, "alice"), ","); got != "organization-auditor" {
			t.Errorf("coderd's organization roles %q", got)
		}
		if len(u.Spec.Organizations) != 1 || u.Spec.Organizations[0].Name != s.org || strings.Join(u.Spec.Organizations[0].Roles, ",") != "organization-auditor" {
			t.Errorf("spec.organizations %+v", u.Spec.Organizations)
		}
		c := codersdk.New(s.coder.URL)
		if _, err := c.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: "alice@example.com", Password: password}); err != nil {
			t.Errorf("alice cannot log in with the Secret's password: %v", err)
		}
		if out, err := s.run("diff", "--server-side", "-f", manifest("alice", aliceSpec(fmt.Sprintf("  roles: [template-admin]\n  organizations: [{name: %s, roles: [organization-auditor]}]\n", s.org)))); err != nil {
			t.Errorf("kubectl diff right after the apply: %v\n%s", err, out)
		}
	})

	t.Run("kubectl get shows email, login type, roles, status and last seen", func(t *testing.T) {
		out := s.must(t, "get", "cu", "alice", "-n", s.ns)
		for _, want := range []string{"EMAIL", "LOGIN TYPE", "ROLES", "STATUS", "LAST SEEN", "alice@example.com", "password", "template-admin"} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl get cu lacks %q:\n%s", want, out)
			}
		}
		for _, sel := range [][]string{{"--field-selector", "spec.email=alice@example.com"}, {"--field-selector", "spec.loginType=password,metadata.name=alice"}} {
			if out := s.must(t, append([]string{"get", "cu", "-n", s.ns, "-o", "name"}, sel...)...); strings.TrimSpace(out) != "coderuser.aggregation.coder.com/alice" {
				t.Errorf("get cu %v: %q", sel, out)
			}
		}
	})

	t.Run("a machine account: login type none, no password", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("robot", "  email: robot@example.com\n  loginType: none\n"))
		if cu := coderUser(t, "robot"); cu.LoginType != codersdk.LoginTypeNone {
			t.Errorf("coderd's login type %q", cu.LoginType)
		}
		out, err := s.run("apply", "--server-side", "-f", manifest("robot2", "  email: robot2@example.com\n  loginType: none\n  passwordSecretRef: {name: alice-password, key: password}\n"))
		if err == nil || !strings.Contains(out, "spec.passwordSecretRef") {
			t.Errorf("a password for login type none: %v %s, want a 422 naming spec.passwordSecretRef", err, out)
		}
	})

	t.Run("a LIST shows a membership changed in Coder at once, an organization role changed in Coder within the poll interval", func(t *testing.T) {
		// robot's organizations as a LIST (which may reuse the last read of
		// the organizations' members) shows them.
		listed := func(t *testing.T) string {
			t.Helper()
			return strings.TrimSpace(s.must(t, "get", "cu", "-n", s.ns, "--field-selector", "metadata.name=robot",
				"-o", "jsonpath={range .items[*].spec.organizations[*]}{.name}={.roles} {end}"))
		}
		if got := listed(t); got != s.org+"=" {
			t.Fatalf("robot's organizations listed %q, want %s= (the default organization, no roles)", got, s.org)
		}
		if err := s.coder.Client.DeleteOrganizationMember(ctx, s.coder.OrganizationID, "robot"); err != nil {
			t.Fatal(err)
		}
		if got := listed(t); got != "" {
			t.Errorf("the first LIST after robot left %s in Coder shows %q, want no organizations", s.org, got)
		}
		if _, err := s.coder.Client.PostOrganizationMember(ctx, s.coder.OrganizationID, "robot"); err != nil {
			t.Fatal(err)
		}
		if got := listed(t); got != s.org+"=" {
			t.Errorf("the first LIST after robot joined %s again in Coder shows %q, want %s=", s.org, got, s.org)
		}
		if _, err := s.coder.Client.UpdateOrganizationMemberRoles(ctx, s.coder.OrganizationID, "robot", codersdk.UpdateRoles{Roles: []string{"organization-auditor"}}); err != nil {
			t.Fatal(err)
		}
		want := s.org + `=["organization-auditor"]`
		start := time.Now()
		for got := listed(t); got != want; got = listed(t) {
			if time.Since(start) > s.watchPollInterval()+5*time.Second {
				t.Fatalf("an organization role given in Coder: after %s listed %q, want %q", time.Since(start).Round(time.Millisecond), got, want)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("an organization role given in Coder: listed after %s (poll interval %s)", time.Since(start).Round(time.Millisecond), s.watchPollInterval())
	})

	t.Run("roles and organization roles replaced, profile name changed, suspended and activated", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", manifest("alice", "  email: alice@example.com\n  name: Alice B\n  passwordSecretRef: {name: alice-password, key: password}\n"+
			fmt.Sprintf("  roles: [auditor]\n  suspended: true\n  organizations: [{name: %s, roles: [organization-template-admin]}]\n", s.org)))
		cu := coderUser(t, "alice")
		if got := strings.Join(roleNamesOf(cu.Roles), ","); got != "auditor" {
			t.Errorf("coderd's site roles %q, want auditor (replaced)", got)
		}
		if got := strings.Join(orgRoles(t, "alice"), ","); got != "organization-template-admin" {
			t.Errorf("coderd's organization roles %q", got)
		}
		if cu.Name != "Alice B" || cu.Status != codersdk.UserStatusSuspended {
			t.Errorf("coderd's user: name %q status %q", cu.Name, cu.Status)
		}
		if u := get(t, "alice"); u.Status.Status != "suspended" || !u.Spec.Suspended {
			t.Errorf("kubectl get: %+v", u.Status)
		}
		s.must(t, "patch", "cu", "alice", "-n", s.ns, "--type", "merge", "-p", `{"spec":{"suspended":false}}`)
		if cu := coderUser(t, "alice"); cu.Status != codersdk.UserStatusActive {
			t.Errorf("after activating, coderd's status %q", cu.Status)
		}
	})

	t.Run("email and login type are immutable, sets are in name order: 422 with the field path", func(t *testing.T) {
		for patch, want := range map[string]string{
			`{"spec":{"email":"other@example.com"}}`: "spec.email: Forbidden",
			`{"spec":{"loginType":"none"}}`:          "spec.loginType: Forbidden",
			// A set read back sorted is accepted only in that order.
			`{"spec":{"roles":["user-admin","auditor"]}}`: `spec.roles: Invalid value: ["user-admin","auditor"]: list them in name order (auditor, user-admin)`,
		} {
			out, err := s.run("patch", "cu", "alice", "-n", s.ns, "--type", "merge", "-p", patch)
			if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "is invalid") {
				t.Errorf("patch %s: %v %s, want %q", patch, err, out, want)
			}
		}
	})

	// A user admin in Coder, and a member, each mapped from Kubernetes.
	for name, roles := range map[string][]string{"uadmin": {codersdk.RoleUserAdmin}, "member": nil} {
		u, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{Email: name + "@example.com", Username: name,
			Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}})
		if err != nil {
			t.Fatal(err)
		}
		if len(roles) > 0 {
			if _, err := s.coder.Client.UpdateUserRoles(ctx, u.Username, codersdk.UpdateRoles{Roles: roles}); err != nil {
				t.Fatal(err)
			}
		}
	}
	usersRule := rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderusers"}, Verbs: []string{"*"}}
	uadmin := s.kubectlAs(t, "uadmin@example.com", "admins", "user-admin", usersRule)
	member := s.kubectlAs(t, "member@example.com", "members", "user-reader", usersRule)
	names := func(t *testing.T, who string, out string) []string {
		t.Helper()
		var l aggv1.CoderUserList
		if err := json.Unmarshal([]byte(out), &l); err != nil {
			t.Fatalf("%s's list: %v\n%s", who, err, out)
		}
		var n []string
		for _, it := range l.Items {
			n = append(n, it.Name)
		}
		return n
	}

	t.Run("Mapped reads: a member sees themselves, a user admin everyone", func(t *testing.T) {
		r, err := member.Run(ctx, "", "get", "cu", "-n", s.ns, "-o", "json")
		if err != nil {
			t.Fatalf("member's list: %v %s", err, r.Combined)
		}
		if got := names(t, "member", r.Stdout); strings.Join(got, ",") != "member" {
			t.Errorf("member lists %v, want only themselves", got)
		}
		if r, err := member.Run(ctx, "", "get", "cu", "alice", "-n", s.ns); err == nil || !strings.Contains(r.Combined, "NotFound") {
			t.Errorf("member's get of alice: %v %s, want 404", err, r.Combined)
		}
		// me is the caller's own user, as in coderd's /users/me.
		for who, k := range map[string]testenv.Kubectl{"member": member, "uadmin": uadmin} {
			r, err := k.Run(ctx, "", "get", "cu", "me", "-n", s.ns, "-o", "jsonpath={.metadata.name}")
			if err != nil || strings.TrimSpace(r.Stdout) != who {
				t.Errorf("%s's get of cu me: %v %q, want their own user", who, err, r.Combined)
			}
		}
		r, err = uadmin.Run(ctx, "", "get", "cu", "-n", s.ns, "-o", "json")
		if err != nil {
			t.Fatalf("user admin's list: %v %s", err, r.Combined)
		}
		got := strings.Join(names(t, "uadmin", r.Stdout), ",")
		for _, want := range []string{"alice", "member", "robot", "uadmin", s.coder.Username} {
			if !strings.Contains(","+got+",", ","+want+",") {
				t.Errorf("user admin's list %s lacks %s", got, want)
			}
		}
	})

	t.Run("a user admin may not grant owner: 403 with coderd's refusal", func(t *testing.T) {
		for _, dry := range []string{"--dry-run=server", "--dry-run=none"} {
			r, err := uadmin.Run(ctx, "", "patch", "cu", "robot", "-n", s.ns, dry, "--type", "merge", "-p", `{"spec":{"roles":["owner"]}}`)
			if err == nil || !strings.Contains(r.Combined, "Forbidden") || !strings.Contains(r.Combined, `"uadmin"`) || !strings.Contains(r.Combined, "owner") {
				t.Errorf("user admin granting owner %s: %v %s, want 403 naming the Coder user", dry, err, r.Combined)
			}
		}
		if got := roleNamesOf(coderUser(t, "robot").Roles); len(got) != 0 {
			t.Errorf("robot's roles after the refusal: %v", got)
		}
		// What a user admin may do, they do.
		if r, err := uadmin.Run(ctx, "", "patch", "cu", "robot", "-n", s.ns, "--type", "merge", "-p", `{"spec":{"name":"Robot"}}`); err != nil {
			t.Errorf("user admin changing the profile name: %v %s", err, r.Combined)
		}
		if cu := coderUser(t, "robot"); cu.Name != "Robot" {
			t.Errorf("coderd's name of robot %q", cu.Name)
		}
	})

	t.Run("a password from a Secret the writer may not read is refused", func(t *testing.T) {
		r, err := uadmin.Run(ctx, "", "apply", "--server-side", "-f", manifest("bob", "  email: bob@example.com\n  passwordSecretRef: {name: alice-password, key: password}\n"))
		if err == nil || !strings.Contains(r.Combined, "Forbidden") || !strings.Contains(r.Combined, "spec.passwordSecretRef") || !strings.Contains(r.Combined, "alice-password") {
			t.Errorf("user admin without Secret access: %v %s, want 403", err, r.Combined)
		}
		if _, err := s.coder.Client.User(ctx, "bob"); err == nil {
			t.Error("the refused create made user bob")
		}
	})

	t.Run("the password is nowhere: object, records, events, dry run, operator log", func(t *testing.T) {
		for what, text := range map[string]string{
			"the object":       s.must(t, "get", "cu", "alice", "-n", s.ns, "-o", "yaml"),
			"the list":         s.must(t, "get", "cu", "-A", "-o", "yaml"),
			"the records":      s.must(t, "get", "coderobjectrecords", "-n", s.ns, "-o", "yaml"),
			"the events":       s.must(t, "get", "events", "-A", "-o", "yaml"),
			"the dry run":      dryOut,
			"the operator log": readFile(t, s.op.LogPath),
		} {
			if strings.Contains(text, password) {
				t.Errorf("%s holds the password", what)
			}
		}
	})

	t.Run("delete is refused while the user owns a workspace, allowed after", func(t *testing.T) {
		s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: %s.ut, namespace: %s}
spec:
  files:
    main.tf: |
%s`, s.org, s.ns, indent(mainTF, 6))))
		s.must(t, "wait", "--for=condition=Ready", "--timeout=3m", "ctpl", s.org+".ut", "-n", s.ns)
		ws := s.org + ".robot.box"
		s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s}
spec: {templateName: ut, running: false}
`, ws, s.ns)))
		out, err := s.run("delete", "cu", "robot", "-n", s.ns)
		if err == nil || !strings.Contains(out, "Conflict") && !strings.Contains(out, "conflict") || !strings.Contains(out, ws) {
			t.Errorf("delete of a user with a workspace: %v %s, want 409 naming %s", err, out, ws)
		}
		// The create's stop build may still run: coderd refuses a delete
		// build until it ends.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			out, err := s.run("delete", "cws", ws, "-n", s.ns, "--wait", "--timeout=3m")
			if err == nil {
				break
			}
			if !strings.Contains(out, "already active") || time.Now().After(deadline) {
				t.Fatalf("delete cws %s: %v %s", ws, err, out)
			}
			time.Sleep(time.Second)
		}
		s.must(t, "delete", "cu", "robot", "-n", s.ns)
		if _, err := s.coder.Client.User(ctx, "robot"); err == nil {
			t.Error("coderd still has robot")
		}
		if out, err := s.run("get", "cu", "robot", "-n", s.ns); err == nil {
			t.Errorf("get after delete: %s", out)
		}
	})
}

func roleNamesOf(rs []codersdk.SlimRole) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}
