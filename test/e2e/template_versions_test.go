package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
)

// TestTemplateVersions drives codertemplateversions with kubectl through
// kube-apiserver against the real coderd (Mapped identity): staging
// versions created with server-side apply (never promoted), listed by
// template with -l and --field-selector, read with their files, author
// and build status, seen by a watch; the message changed and the rest
// refused; dry runs that upload nothing; duplicate names refused; a
// version promoted in Coder read as active; delete archiving (the active
// version refused with 409); and a member seeing what Coder lets them.
func TestTemplateVersions(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	const tplName = "vt"
	s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: %s.%s, namespace: %s}
spec:
  files:
    main.tf: |
%s`, s.org, tplName, s.ns, indent(mainTF, 6))))
	s.must(t, "wait", "--for=condition=Ready", "--timeout=3m", "ctpl", s.org+"."+tplName, "-n", s.ns)
	tpl := s.coderTemplate(t, tplName)
	first, err := s.coder.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
	if err != nil {
		t.Fatal(err)
	}
	objName := func(version string) string { return s.org + "." + tplName + "." + version }
	stagedTF := strings.Replace(mainTF, `"hello"`, `"staged"`, 1)
	manifest := func(version, message string) string {
		return writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplateVersion
metadata: {name: %s, namespace: %s}
spec:
  message: %q
  variables:
  - {name: greeting, value: hi}
  files:
    main.tf: |
%s`, objName(version), s.ns, message, indent(stagedTF, 6)))
	}
	get := func(t *testing.T, name string) *aggv1.CoderTemplateVersion {
		t.Helper()
		var obj aggv1.CoderTemplateVersion
		if err := json.Unmarshal([]byte(s.must(t, "get", "ctv", name, "-n", s.ns, "-o", "json", "--show-managed-fields")), &obj); err != nil {
			t.Fatal(err)
		}
		return &obj
	}
	versionCount := func(t *testing.T) int {
		t.Helper()
		vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: tpl.ID, IncludeArchived: true})
		if err != nil {
			t.Fatal(err)
		}
		return len(vs)
	}
	watch := s.startKubectl(t, "get", "ctv", "-n", s.ns, "-w", "--output-watch-events", "-o", "custom-columns=EVENT:.type,NAME:.object.metadata.name,MSG:.object.spec.message")

	t.Run("the template's versions are listed by template, with -l and --field-selector", func(t *testing.T) {
		for _, sel := range [][]string{{"-l", aggv1.LabelTemplate + "=" + tplName}, {"--field-selector", "spec.template=" + tplName}} {
			out := s.must(t, append([]string{"get", "ctv", "-n", s.ns, "-o", "jsonpath={range .items[*]}{.metadata.name} {.status.active} {.status.createdBy}{\"\\n\"}{end}"}, sel...)...)
			if want := objName(first.Name) + " true " + s.coder.Username; strings.TrimSpace(out) != want {
				t.Errorf("get ctv %v: %q, want %q", sel, out, want)
			}
		}
		if out := s.must(t, "get", "ctv", "-n", s.ns, "-l", aggv1.LabelTemplate+"=other", "-o", "name"); strings.TrimSpace(out) != "" {
			t.Errorf("-l for another template lists %q", out)
		}
	})

	var dry aggv1.CoderTemplateVersion
	t.Run("a dry-run create answers the object and uploads nothing", func(t *testing.T) {
		before := versionCount(t)
		out := s.must(t, "apply", "--server-side", "--field-manager=gitops", "--dry-run=server", "-f", manifest("v2", "second"), "-o", "json")
		if err := json.Unmarshal([]byte(out), &dry); err != nil {
			t.Fatal(err)
		}
		if dry.Status.CreatedBy != s.coder.Username || dry.Status.TemplateID != tpl.ID.String() || dry.Status.BuildStatus != "pending" || dry.Status.Active {
			t.Errorf("dry run's status %+v", dry.Status)
		}
		if n := versionCount(t); n != before {
			t.Errorf("coderd has %d versions after a dry run, want %d", n, before)
		}
		if _, err := s.run("get", "ctv", objName("v2"), "-n", s.ns); err == nil {
			t.Error("the dry run's version exists")
		}
	})

	var v2 *aggv1.CoderTemplateVersion
	// needV2 stops a subtest that needs the version an earlier one made.
	needV2 := func(t *testing.T) {
		t.Helper()
		if v2 == nil {
			t.Fatal("no staging version: its create failed")
		}
	}
	t.Run("created with server-side apply: a staging version, built in the background, never promoted", func(t *testing.T) {
		start := time.Now()
		s.must(t, "apply", "--server-side", "--field-manager=gitops", "-f", manifest("v2", "second"))
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("the create took %s; it must not wait for the build", took)
		}
		s.must(t, "wait", "--for=condition=Ready", "--timeout=3m", "ctv", objName("v2"), "-n", s.ns)
		v2 = get(t, objName("v2"))

		if v2.Spec.Message != "second" || v2.Spec.Files["main.tf"] != stagedTF || v2.Status.CreatedBy != s.coder.Username || v2.Status.BuildStatus != "succeeded" || v2.Status.Active {
			t.Errorf("created version: spec %+v status %+v", v2.Spec, v2.Status)
		}
		// What the dry run answered is what the create keeps.
		if got, want := mustJSON(v2.Spec), mustJSON(dry.Spec); got != want {
			t.Errorf("spec %s, the dry run answered %s", got, want)
		}
		if got, want := mustJSON(v2.Labels), mustJSON(dry.Labels); got != want {
			t.Errorf("labels %s, the dry run answered %s", got, want)
		}
		if now := s.coderTemplate(t, tplName); now.ActiveVersionID != tpl.ActiveVersionID {
			t.Errorf("the staging version became active (%s)", now.ActiveVersionID)
		}
		vars, err := s.coder.Client.TemplateVersionVariables(ctx, uuid.MustParse(v2.Status.ID))
		if err != nil || len(vars) != 1 || vars[0].Value != "hi" {
			t.Errorf("coderd's variables of the version: %+v %v", vars, err)
		}
		managers := map[string]bool{}
		for _, mf := range v2.ManagedFields {
			managers[mf.Manager] = true
		}
		if !managers["gitops"] {
			t.Errorf("managedFields %v lack the applier gitops", managers)
		}
		if out, err := s.run("diff", "--server-side", "--field-manager=gitops", "-f", manifest("v2", "second")); err != nil {
			t.Errorf("kubectl diff right after the apply: %v\n%s", err, out)
		}
		watch.waitLine(t, 30*time.Second, "ADDED", objName("v2"))
	})

	t.Run("the message changes and round-trips; files, variables and tags are immutable", func(t *testing.T) {
		needV2(t)
		s.must(t, "apply", "--server-side", "--field-manager=gitops", "-f", manifest("v2", "second, reviewed"))
		if got := get(t, objName("v2")); got.Spec.Message != "second, reviewed" || got.Generation != 2 || got.Status.ObservedGeneration != 2 {
			t.Errorf("after the update: message %q generation %d/%d", got.Spec.Message, got.Generation, got.Status.ObservedGeneration)
		}
		v, err := s.coder.Client.TemplateVersion(ctx, uuid.MustParse(v2.Status.ID))
		if err != nil || v.Message != "second, reviewed" {
			t.Errorf("coderd's message %q %v", v.Message, err)
		}
		watch.waitLine(t, 30*time.Second, "MODIFIED", objName("v2"), "second, reviewed")
		out, err := s.run("patch", "ctv", objName("v2"), "-n", s.ns, "--type=merge", "-p", `{"spec":{"files":{"main.tf":"changed"},"provisionerTags":{"zone":"eu"}}}`)
		if err == nil || !strings.Contains(out, "is invalid") || !strings.Contains(out, "create a new CoderTemplateVersion") {
			t.Errorf("patch of files: %v %s, want 422 saying how to make a new version", err, out)
		}
	})

	t.Run("labels and annotations are kept and selected by", func(t *testing.T) {
		needV2(t)
		s.must(t, "label", "ctv", objName("v2"), "-n", s.ns, "stage=canary")
		s.must(t, "annotate", "ctv", objName("v2"), "-n", s.ns, "note=kept")
		out := s.must(t, "get", "ctv", "-n", s.ns, "-l", "stage=canary", "-o", "jsonpath={.items[*].metadata.name} {.items[*].metadata.annotations.note}")
		if strings.TrimSpace(out) != objName("v2")+" kept" {
			t.Errorf("-l stage=canary: %q", out)
		}
		out, err := s.run("label", "ctv", objName("v2"), "-n", s.ns, "--overwrite", aggv1.LabelTemplate+"=other")
		if err == nil || !strings.Contains(out, "cannot be changed") {
			t.Errorf("changing the derived template label: %v %s", err, out)
		}
	})

	t.Run("a second version of the same name is refused with 409", func(t *testing.T) {
		needV2(t)
		before := versionCount(t)
		for _, dryRun := range []string{"--dry-run=server", "--dry-run=none"} {
			out, err := s.run("create", dryRun, "-f", manifest("v2", "again"))
			if err == nil || !strings.Contains(out, "AlreadyExists") && !strings.Contains(out, "already exists") {
				t.Errorf("create %s of a taken name: %v %s, want 409 AlreadyExists", dryRun, err, out)
			}
		}
		if n := versionCount(t); n != before {
			t.Errorf("coderd has %d versions, want %d", n, before)
		}
		// coderd v2.30 itself answers a create of a taken name with 409
		// (a rename to one, PATCH, with 400).
		_, err := s.coder.Client.CreateTemplateVersion(ctx, s.coder.OrganizationID, codersdk.CreateTemplateVersionRequest{
			Name: "v2", TemplateID: tpl.ID, StorageMethod: codersdk.ProvisionerStorageMethodFile, FileID: first.Job.FileID, Provisioner: codersdk.ProvisionerTypeTerraform})
		if coderapi.StatusCode(err) != http.StatusConflict {
			t.Errorf("coderd's answer to a duplicate name: %v", err)
		}
	})

	t.Run("promoted by name through the template's spec.versionName, the version reads as active; deleting it is refused with 409", func(t *testing.T) {
		needV2(t)
		// The same field manager as the template's create, without
		// spec.files: the template shows the promoted version's.
		s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: %s.%s, namespace: %s}
spec:
  versionName: v2`, s.org, tplName, s.ns)))
		if active := s.coderTemplate(t, tplName).ActiveVersionID.String(); active != v2.Status.ID {
			t.Errorf("coderd's active version %s, want v2 (%s)", active, v2.Status.ID)
		}
		shown := s.getTemplate(t, s.org+"."+tplName)
		if shown.Spec.VersionName != "v2" || shown.Spec.VersionID != v2.Status.ID || shown.Spec.Files["main.tf"] != stagedTF {
			t.Errorf("the template shows version %q (%s) with files %q; want v2's", shown.Spec.VersionName, shown.Spec.VersionID, shown.Spec.Files["main.tf"])
		}
		if !get(t, objName("v2")).Status.Active || get(t, objName(first.Name)).Status.Active {
			t.Error("after the promotion v2 is not the only active version")
		}
		for _, dryRun := range []string{"--dry-run=server", "--dry-run=none"} {
			out, err := s.run("delete", "ctv", objName("v2"), "-n", s.ns, dryRun)
			if err == nil || !strings.Contains(out, "Conflict") && !strings.Contains(out, "conflict") || !strings.Contains(out, "active version") {
				t.Errorf("delete %s of the active version: %v %s, want 409 naming the active version", dryRun, err, out)
			}
		}
		if v, err := s.coder.Client.TemplateVersion(ctx, uuid.MustParse(v2.Status.ID)); err != nil || v.Archived {
			t.Errorf("the active version in coderd: archived %v %v", v.Archived, err)
		}
	})

	t.Run("delete archives: gone from get and list, archived in coderd", func(t *testing.T) {
		old := objName(first.Name)
		s.must(t, "delete", "ctv", old, "-n", s.ns, "--dry-run=server")
		if v, _ := s.coder.Client.TemplateVersion(ctx, first.ID); v.Archived {
			t.Fatal("a dry-run delete archived the version")
		}
		s.must(t, "delete", "ctv", old, "-n", s.ns)
		if out, err := s.run("get", "ctv", old, "-n", s.ns); err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("get after delete: %v %s, want NotFound", err, out)
		}
		if out := s.must(t, "get", "ctv", "-n", s.ns, "-o", "name"); strings.Contains(out, old) {
			t.Errorf("list after delete holds it:\n%s", out)
		}
		if v, err := s.coder.Client.TemplateVersion(ctx, first.ID); err != nil || !v.Archived {
			t.Errorf("coderd: archived %v %v", v.Archived, err)
		}
		watch.waitLine(t, 30*time.Second, "DELETED", old)
	})

	t.Run("renamed in Coder (to a name with dots), served under the new name with its metadata", func(t *testing.T) {
		needV2(t)
		if _, err := s.coder.Client.UpdateTemplateVersion(ctx, uuid.MustParse(v2.Status.ID), codersdk.PatchTemplateVersionRequest{Name: "v2.1"}); err != nil {
			t.Fatal(err)
		}
		got := get(t, objName("v2.1"))
		if got.Status.ID != v2.Status.ID || got.Labels["stage"] != "canary" || got.Annotations["note"] != "kept" || !got.Status.Active {
			t.Errorf("renamed version: id %s labels %v annotations %v active %v", got.Status.ID, got.Labels, got.Annotations, got.Status.Active)
		}
		if out, err := s.run("get", "ctv", objName("v2"), "-n", s.ns); err == nil || !strings.Contains(out, "NotFound") {
			t.Errorf("the old name: %v %s, want NotFound", err, out)
		}
		out := s.must(t, "get", "ctv", "-n", s.ns, "--field-selector", "status.active=true", "-o", "name")
		if strings.TrimSpace(out) != "codertemplateversion.aggregation.coder.com/"+objName("v2.1") {
			t.Errorf("--field-selector status.active=true: %q", out)
		}
	})

	t.Run("a member sees what Coder shows them and may not create versions", func(t *testing.T) {
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: "member@example.com", Username: "member", Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
			t.Fatal(err)
		}
		member := s.kubectlAs(t, "member@example.com", "members", "version-writer",
			rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"codertemplateversions"}, Verbs: []string{"*"}})
		r, err := member.Run(ctx, "", "get", "ctv", "-n", s.ns, "-o", "json")
		if err != nil {
			t.Fatalf("member's list: %v %s", err, r.Combined)
		}
		var list aggv1.CoderTemplateVersionList
		if err := json.Unmarshal([]byte(r.Stdout), &list); err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, it := range list.Items {
			names[it.Name] = true
			// Files are shown to those who may update every template.
			if it.Spec.Files != nil {
				t.Errorf("member sees the files of %s", it.Name)
			}
		}
		if !names[objName("v2.1")] {
			t.Errorf("member's list %v lacks %s (Coder shows members every template of their organization)", slicesOf(names), objName("v2.1"))
		}
		before := versionCount(t)
		for _, dryRun := range []string{"--dry-run=server", "--dry-run=none"} {
			r, err := member.Run(ctx, "", "create", dryRun, "-f", manifest("v3", "by a member"))
			if err == nil || !strings.Contains(r.Combined, "Forbidden") || !strings.Contains(r.Combined, "member") {
				t.Errorf("member's create %s: %v %s, want 403 naming the Coder user", dryRun, err, r.Combined)
			}
		}
		if n := versionCount(t); n != before {
			t.Errorf("coderd has %d versions after the member's refused creates, want %d", n, before)
		}
	})

	t.Run("a template made and promoted in Coder is listed within the poll interval; its deletion in Coder shows at once", func(t *testing.T) {
		// Built in Coder from the first version's file, as the UI or the
		// coder CLI would.
		build := func(t *testing.T, templateID uuid.UUID, name string) codersdk.TemplateVersion {
			t.Helper()
			v, err := s.coder.Client.CreateTemplateVersion(ctx, tpl.OrganizationID, codersdk.CreateTemplateVersionRequest{
				Name: name, TemplateID: templateID, StorageMethod: codersdk.ProvisionerStorageMethodFile,
				FileID: first.Job.FileID, Provisioner: codersdk.ProvisionerTypeTerraform,
			})
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(3 * time.Minute)
			for v.Job.Status != codersdk.ProvisionerJobSucceeded {
				if v.Job.Status == codersdk.ProvisionerJobFailed || time.Now().After(deadline) {
					t.Fatalf("version %s: %s %s", name, v.Job.Status, v.Job.Error)
				}
				time.Sleep(200 * time.Millisecond)
				if v, err = s.coder.Client.TemplateVersion(ctx, v.ID); err != nil {
					t.Fatal(err)
				}
			}
			return v
		}
		const other = "made-in-coder"
		listed := func(t *testing.T) string {
			t.Helper()
			return strings.TrimSpace(s.must(t, "get", "ctv", "-n", s.ns, "-l", aggv1.LabelTemplate+"="+other,
				"-o", "jsonpath={range .items[*]}{.metadata.name}={.status.active} {end}"))
		}
		one := build(t, uuid.Nil, "one")
		made, err := s.coder.Client.CreateTemplate(ctx, tpl.OrganizationID, codersdk.CreateTemplateRequest{Name: other, VersionID: one.ID})
		if err != nil {
			t.Fatal(err)
		}
		// within lists until the LIST shows want, as it must within the
		// poll interval (and the time a LIST takes).
		within := func(t *testing.T, what, want string) {
			t.Helper()
			start := time.Now()
			for got := listed(t); got != want; got = listed(t) {
				if time.Since(start) > s.watchPollInterval()+5*time.Second {
					t.Fatalf("%s: after %s listed %q, want %q", what, time.Since(start).Round(time.Millisecond), got, want)
				}
				time.Sleep(100 * time.Millisecond)
			}
			t.Logf("%s: listed after %s (poll interval %s)", what, time.Since(start).Round(time.Millisecond), s.watchPollInterval())
		}
		within(t, "a template made in Coder", s.org+"."+other+".one=true")

		two := build(t, made.ID, "two")
		if err := s.coder.Client.UpdateActiveTemplateVersion(ctx, made.ID, codersdk.UpdateActiveTemplateVersion{ID: two.ID}); err != nil {
			t.Fatal(err)
		}
		// status.active is omitted when false.
		within(t, "a promotion in Coder", s.org+"."+other+".one= "+s.org+"."+other+".two=true")
		if err := s.coder.Client.DeleteTemplate(ctx, made.ID); err != nil {
			t.Fatal(err)
		}
		if got := listed(t); got != "" {
			t.Errorf("after the template's deletion in Coder, the next list shows %q, want nothing", got)
		}
	})
}

func slicesOf(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range maps.Keys(m) {
		out = append(out, k)
	}
	return out
}
