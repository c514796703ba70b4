package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestTemplateVersionIdentity drives spec.versionName, spec.versionMessage
// and spec.provisionerTags with kubectl apply --server-side through
// kube-apiserver against the real coderd: new files take the name and
// message given, a name the template already has is refused with 409
// before anything is uploaded, the name or message alone renames or
// promotes, an apply that leaves the name out lets Coder name the next
// version, and tags no provisioner daemon has leave the import waiting
// with a condition that says so.
func TestTemplateVersionIdentity(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	const name = "coder.named"
	filesOf := func(n int) string {
		return fmt.Sprintf("  files:\n    main.tf: |\n%s", indent(fmt.Sprintf("# source %d\n%s", n, mainTF), 6))
	}
	manifest := func(spec string) string {
		return writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderTemplate\nmetadata: {name: %s, namespace: %s}\nspec:\n%s\n", name, s.ns, spec))
	}
	apply := func(t *testing.T, spec string, extra ...string) (string, error) {
		t.Helper()
		return s.run(append([]string{"apply", "--server-side", "--field-manager=gitops", "-f", manifest(spec)}, extra...)...)
	}
	get := func(t *testing.T) *aggv1.CoderTemplate { return s.getTemplate(t, name) }
	waitBuilt := func(t *testing.T) *aggv1.CoderTemplate {
		t.Helper()
		var obj *aggv1.CoderTemplate
		testenv.WaitFor(t, 3*time.Minute, func() error {
			obj = get(t)
			for _, c := range obj.Status.Conditions {
				if c.Type == aggv1.ConditionReady && c.Status == metav1.ConditionTrue && obj.Status.BuildingVersionID == "" {
					return nil
				}
			}
			return fmt.Errorf("conditions %+v, building %q", obj.Status.Conditions, obj.Status.BuildingVersionID)
		})
		return obj
	}
	active := func(t *testing.T) codersdk.TemplateVersion {
		t.Helper()
		v, err := s.coder.Client.TemplateVersion(ctx, s.coderTemplate(t, "named").ActiveVersionID)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	versions := func(t *testing.T) map[string]uuid.UUID {
		t.Helper()
		vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: s.coderTemplate(t, "named").ID})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]uuid.UUID{}
		for _, v := range vs {
			out[v.Name] = v.ID
		}
		return out
	}
	shows := func(t *testing.T, obj *aggv1.CoderTemplate, versionName, message string) {
		t.Helper()
		if obj.Spec.VersionName != versionName || obj.Spec.VersionMessage != message {
			t.Errorf("spec.versionName %q, spec.versionMessage %q; want %q, %q", obj.Spec.VersionName, obj.Spec.VersionMessage, versionName, message)
		}
	}

	if _, err := apply(t, "  versionName: abc1\n  versionMessage: first commit\n"+filesOf(1)); err != nil {
		t.Fatal(err)
	}
	first := waitBuilt(t)
	shows(t, first, "abc1", "first commit")
	if v := active(t); v.Name != "abc1" || v.Message != "first commit" || first.Status.ActiveVersionName != "abc1" {
		t.Fatalf("Coder's active version %q %q, status.activeVersionName %q; want abc1, first commit", v.Name, v.Message, first.Status.ActiveVersionName)
	}

	t.Run("new files under a name the template has are refused with 409, dry run too, uploading nothing", func(t *testing.T) {
		before := versions(t)
		for _, extra := range [][]string{{"--dry-run=server"}, nil} {
			out, err := apply(t, "  versionName: abc1\n  versionMessage: second\n"+filesOf(2), extra...)
			if err == nil || !strings.Contains(out, "Error from server (AlreadyExists): CoderTemplate \"coder.named\": spec.versionName: template version abc1 (") || !strings.Contains(out, `already has the name "abc1"; a new version of spec.files needs a new spec.versionName`) {
				t.Errorf("apply %v: %v\n%s\nwant a 409 naming abc1", extra, err, out)
			}
		}
		if after := versions(t); !maps.Equal(after, before) {
			t.Errorf("coderd's versions went from %v to %v", before, after)
		}
	})

	t.Run("new files with a new name and message build a version so named", func(t *testing.T) {
		if _, err := apply(t, "  versionName: abc2\n  versionMessage: second\n"+filesOf(2)); err != nil {
			t.Fatal(err)
		}
		shows(t, waitBuilt(t), "abc2", "second")
		if v := active(t); v.Name != "abc2" || v.Message != "second" {
			t.Errorf("Coder's active version %q %q, want abc2, second", v.Name, v.Message)
		}
	})

	t.Run("the message alone changes the active version's message", func(t *testing.T) {
		before := versions(t)
		if _, err := apply(t, "  versionName: abc2\n  versionMessage: second, reworded\n"+filesOf(2)); err != nil {
			t.Fatal(err)
		}
		shows(t, get(t), "abc2", "second, reworded")
		if v := active(t); v.Name != "abc2" || v.Message != "second, reworded" {
			t.Errorf("Coder's active version %q %q", v.Name, v.Message)
		}
		if after := versions(t); !maps.Equal(after, before) {
			t.Errorf("coderd's versions went from %v to %v", before, after)
		}
	})

	t.Run("a name the template has, without files, promotes that version", func(t *testing.T) {
		want := versions(t)["abc1"]
		const spec = "  versionName: abc1\n  versionMessage: first commit\n"
		dry, err := apply(t, spec, "--dry-run=server", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if v := active(t); v.Name != "abc2" {
			t.Fatalf("the dry run made %s active", v.Name)
		}
		real, err := apply(t, spec, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var dryObj, realObj aggv1.CoderTemplate
		if err := errors.Join(json.Unmarshal([]byte(dry), &dryObj), json.Unmarshal([]byte(real), &realObj)); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(dryObj.Spec, realObj.Spec) || dryObj.Status.ActiveVersionID != realObj.Status.ActiveVersionID {
			t.Errorf("the dry run answered spec %+v, active %s; the real write %+v, active %s", dryObj.Spec, dryObj.Status.ActiveVersionID, realObj.Spec, realObj.Status.ActiveVersionID)
		}
		obj := get(t)
		shows(t, obj, "abc1", "first commit")
		if v := active(t); v.ID != want || obj.Spec.VersionID != want.String() || !strings.Contains(obj.Spec.Files["main.tf"], "# source 1") {
			t.Errorf("active %s (%s), spec.versionID %s, files %q; want abc1 (%s) and its files", v.Name, v.ID, obj.Spec.VersionID, obj.Spec.Files["main.tf"], want)
		}
	})

	t.Run("a new name for the same files renames the version shown", func(t *testing.T) {
		before := versions(t)
		if _, err := apply(t, "  versionName: rel-1.0\n  versionMessage: first commit\n"+filesOf(1)); err != nil {
			t.Fatal(err)
		}
		shows(t, get(t), "rel-1.0", "first commit")
		after := versions(t)
		if after["rel-1.0"] != before["abc1"] || len(after) != len(before) || active(t).Name != "rel-1.0" {
			t.Errorf("coderd's versions went from %v to %v; want abc1 renamed rel-1.0 and active", before, after)
		}
	})

	t.Run("an apply that leaves the name out lets Coder name the next version", func(t *testing.T) {
		if _, err := apply(t, filesOf(1)); err != nil {
			t.Fatal(err)
		}
		shows(t, get(t), "", "")
		if v := active(t); v.Name != "rel-1.0" {
			t.Errorf("dropping spec.versionName renamed the version in Coder to %q", v.Name)
		}
		if _, err := apply(t, filesOf(3)); err != nil {
			t.Fatal(err)
		}
		obj := waitBuilt(t)
		shows(t, obj, "", "")
		if n := obj.Status.ActiveVersionName; n == "" || n == "rel-1.0" || n == "abc2" {
			t.Errorf("status.activeVersionName %q, want a name Coder chose", n)
		}
	})

	t.Run("tags no provisioner daemon has: the import waits and Ready says why", func(t *testing.T) {
		if _, err := apply(t, "  provisionerTags: {team: blue}\n"+filesOf(3)); err != nil {
			t.Fatal(err)
		}
		var obj *aggv1.CoderTemplate
		testenv.WaitFor(t, time.Minute, func() error {
			obj = get(t)
			for _, c := range obj.Status.Conditions {
				if c.Type == aggv1.ConditionReady && c.Reason == aggv1.ReasonBuilding &&
					strings.Contains(c.Message, "(job pending): no provisioner daemon has its tags (owner= scope=organization team=blue), so the import waits until one does") {
					return nil
				}
			}
			return fmt.Errorf("conditions %+v", obj.Status.Conditions)
		})
		if got := obj.Spec.ProvisionerTags; len(got) != 1 || got["team"] != "blue" {
			t.Errorf("spec.provisionerTags %v, want team: blue", got)
		}
		v, err := s.coder.Client.TemplateVersion(ctx, uuid.MustParse(obj.Status.BuildingVersionID))
		if err != nil {
			t.Fatal(err)
		}
		if v.Job.Tags["team"] != "blue" || v.Job.Status != codersdk.ProvisionerJobPending {
			t.Errorf("Coder's building version: tags %v, job %s", v.Job.Tags, v.Job.Status)
		}
		// Without the tags: back to the active version, whose import
		// the default provisioner did.
		if _, err := apply(t, filesOf(3)); err != nil {
			t.Fatal(err)
		}
		if obj := waitBuilt(t); obj.Spec.ProvisionerTags != nil {
			t.Errorf("spec.provisionerTags %v, want none", obj.Spec.ProvisionerTags)
		}
	})

	t.Run("a bad name or a tag coderd sets itself is refused naming the field", func(t *testing.T) {
		for spec, want := range map[string]string{
			"  versionName: bad name\n" + filesOf(4):                  `spec.versionName: Invalid value: "bad name": a Coder template version name must be alphanumeric with underscores and dots`,
			"  provisionerTags: {owner: me}\n" + filesOf(4):           `spec.provisionerTags[owner]: Forbidden: coderd sets the owner tag itself`,
			"  provisionerTags: {scope: organization}\n" + filesOf(4): `spec.provisionerTags[scope]: Unsupported value: "organization": supported values: "user"`,
		} {
			out, err := apply(t, spec)
			if err == nil || !strings.Contains(out, want) {
				t.Errorf("apply %q: %v\n%s\nwant %q", spec, err, out, want)
			}
		}
	})
}
