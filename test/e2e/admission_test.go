package e2e

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder/v2/codersdk"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestAdmission runs the cluster's admission configuration against
// CoderWorkspace and CoderTemplate writes, through kube-apiserver with kubectl as the cluster
// admin (mapped to the Coder owner): kube-apiserver does not run admission
// for an aggregated API, so each of these is the aggregated API server's
// own chain at work, fed by objects created in the cluster as a platform
// team creates them.
func TestAdmission(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "adm", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	workspace := func(name string, labels map[string]string) string {
		var l []string
		for k, v := range labels {
			l = append(l, fmt.Sprintf("%s: %q", k, v))
		}
		return writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s, labels: {%s}}
spec: {templateName: adm, running: false}
`, s.workspaceName(name), s.ns, strings.Join(l, ", ")))
	}
	inCoder := func(name string) bool {
		_, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, name, codersdk.WorkspaceOptions{})
		return err == nil
	}

	t.Run("a ValidatingAdmissionPolicy requiring label team refuses a workspace without it, with its message, and creates nothing in Coder", func(t *testing.T) {
		const message = "every CoderWorkspace needs a team label"
		s.must(t, "apply", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: e2e-require-team}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [aggregation.coder.com]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE]
      resources: [coderworkspaces]
  validations:
  - expression: "has(object.metadata.labels) && 'team' in object.metadata.labels"
    message: %q
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: e2e-require-team}
spec:
  policyName: e2e-require-team
  validationActions: [Deny]
  matchResources:
    objectSelector: {matchExpressions: [{key: policy-test, operator: Exists}]}
`, message)))
		t.Cleanup(func() {
			_, _ = s.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "e2e-require-team", "--ignore-not-found")
		})
		// The policy applies once this server's cache has it.
		noTeam := workspace("no-team", map[string]string{"policy-test": "1"})
		waitRefused(t, s, message, "create", "--dry-run=server", "-f", noTeam)

		out, err := s.run("create", "-f", noTeam)
		if err == nil || !strings.Contains(out, message) || !strings.Contains(out, "e2e-require-team") {
			t.Fatalf("kubectl create of a workspace without label team: %v, want refused naming policy e2e-require-team with %q", err, message)
		}
		if inCoder("no-team") {
			t.Errorf("the refused create made workspace no-team in Coder")
		}
		checkNothingStored(t, s, workspacesGVR, s.workspaceName("no-team"))
		s.must(t, "create", "-f", workspace("with-team", map[string]string{"policy-test": "1", "team": "platform"}))
		if !inCoder("with-team") {
			t.Errorf("the admitted create made no workspace with-team in Coder")
		}
		// An update removing the label is refused too; the label stays.
		out, err = s.run("label", "cws", s.workspaceName("with-team"), "-n", s.ns, "team-")
		if err == nil || !strings.Contains(out, message) {
			t.Errorf("kubectl label team- : %v, want refused with %q", err, message)
		}
		if got := s.kubectlJSON(t, "get", "cws", s.workspaceName("with-team"), "-n", s.ns, "-o", "json").GetLabels()["team"]; got != "platform" {
			t.Errorf("after the refused update label team is %q, want platform", got)
		}
	})

	t.Run("a ValidatingAdmissionPolicy on codertemplates sees the derived labels on create; a refused create or server-side apply changes nothing in Coder", func(t *testing.T) {
		// The message names the derived template label and
		// spec.organization: a create that did not show them to admission
		// gets a different message.
		const message = "template adm-tpl of organization coder needs a team label"
		s.must(t, "apply", "-f", writeManifest(t, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: e2e-template-team}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [aggregation.coder.com]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE]
      resources: [codertemplates]
  validations:
  - expression: "'team' in object.metadata.labels"
    messageExpression: "'template ' + object.metadata.labels['aggregation.coder.com/template'] + ' of organization ' + object.spec.organization + ' needs a team label'"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: e2e-template-team}
spec:
  policyName: e2e-template-team
  validationActions: [Deny]
  matchResources:
    objectSelector: {matchExpressions: [{key: tpl-policy-test, operator: Exists}]}
`))
		t.Cleanup(func() {
			_, _ = s.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "e2e-template-team", "--ignore-not-found")
		})
		name := s.org + ".adm-tpl"
		template := func(labels string, rev int) string {
			return writeManifest(t, fmt.Sprintf("apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderTemplate\nmetadata:\n  name: %s\n  namespace: %s\n  labels: {%s}\nspec:\n  files:\n    main.tf: |\n%s",
				name, s.ns, labels, indent(mainTF+fmt.Sprintf("\n# revision %d\n", rev), 6)))
		}
		noTeam := template(`tpl-policy-test: "1"`, 1)
		waitRefused(t, s, message, "create", "--dry-run=server", "-f", noTeam)

		out, err := s.run("create", "-f", noTeam)
		if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy 'e2e-template-team' with binding 'e2e-template-team' denied request: "+message) {
			t.Fatalf("kubectl create of a template without label team: %v\n%s\nwant refused by e2e-template-team with %q", err, out, message)
		}
		_, err = s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "adm-tpl")
		if sdkErr := (*codersdk.Error)(nil); !errors.As(err, &sdkErr) || sdkErr.StatusCode() != http.StatusNotFound {
			t.Errorf("coderd: template adm-tpl after the refused create: %v, want 404", err)
		}
		checkNothingStored(t, s, templatesGVR, name)

		// Created by server-side apply (a create to admission), with the
		// label; its first version builds.
		s.must(t, "apply", "--server-side", "-f", template(`tpl-policy-test: "1", team: platform`, 1))
		waitTemplateReady(t, s, name)
		before := s.coderTemplate(t, "adm-tpl")
		versions := func() int {
			t.Helper()
			vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: before.ID, IncludeArchived: true})
			if err != nil {
				t.Fatalf("coderd: versions of template adm-tpl: %v", err)
			}
			return len(vs)
		}
		if n := versions(); n != 1 {
			t.Fatalf("template adm-tpl has %d versions in Coder after its create, want 1", n)
		}
		filesBefore, _, _ := unstructured.NestedStringMap(s.getObj(t, templatesGVR, name).Object, "spec", "files")
		if !strings.Contains(filesBefore["main.tf"], "# revision 1\n") {
			t.Fatalf("template adm-tpl after its create: main.tf %q, want revision 1's", filesBefore["main.tf"])
		}

		// New files without the label: the label goes (kubectl applied it
		// and no longer does), so the policy refuses the apply, and Coder
		// gets no new version.
		out, err = s.run("apply", "--server-side", "-f", template(`tpl-policy-test: "1"`, 2))
		if err == nil || !strings.Contains(out, message) {
			t.Errorf("server-side apply of new files without label team: %v\n%s\nwant refused with %q", err, out, message)
		}
		if n := versions(); n != 1 {
			t.Errorf("template adm-tpl has %d versions in Coder after the refused apply, want 1", n)
		}
		if after := s.coderTemplate(t, "adm-tpl"); after.ActiveVersionID != before.ActiveVersionID {
			t.Errorf("the refused apply changed the active version from %s to %s", before.ActiveVersionID, after.ActiveVersionID)
		}
		got := s.getObj(t, templatesGVR, name)
		files, _, _ := unstructured.NestedStringMap(got.Object, "spec", "files")
		if !maps.Equal(files, filesBefore) || got.GetLabels()["team"] != "platform" {
			t.Errorf("after the refused apply: label team %q, spec.files %q; want platform and revision 1's files %q", got.GetLabels()["team"], files, filesBefore)
		}
	})

	t.Run("a MutatingAdmissionPolicy's change is stored and read back", func(t *testing.T) {
		s.must(t, "apply", "-f", writeManifest(t, `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: e2e-default-team}
spec:
  failurePolicy: Fail
  reinvocationPolicy: Never
  matchConstraints:
    resourceRules:
    - apiGroups: [aggregation.coder.com]
      apiVersions: ["*"]
      operations: [CREATE]
      resources: [coderworkspaces]
  mutations:
  - patchType: JSONPatch
    jsonPatch:
      expression: '[JSONPatch{op: "add", path: "/metadata/labels/team", value: "unassigned"}]'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: e2e-default-team}
spec:
  policyName: e2e-default-team
  matchResources:
    objectSelector: {matchExpressions: [{key: map-test, operator: Exists}]}
`))
		t.Cleanup(func() {
			_, _ = s.run("delete", "mutatingadmissionpolicybinding,mutatingadmissionpolicy", "e2e-default-team", "--ignore-not-found")
		})
		manifest := workspace("defaulted", map[string]string{"map-test": "1"})
		testenv.WaitFor(t, 30*time.Second, func() error {
			if got := s.kubectlJSON(t, "create", "--dry-run=server", "-o", "json", "-f", manifest).GetLabels()["team"]; got != "unassigned" {
				return errNotYet("dry-run create: label team " + got + ", want the policy's unassigned")
			}
			return nil
		})
		s.must(t, "create", "-f", manifest)
		if got := s.kubectlJSON(t, "get", "cws", s.workspaceName("defaulted"), "-n", s.ns, "-o", "json").GetLabels()["team"]; got != "unassigned" {
			t.Errorf("GET after the create: label team %q, want unassigned", got)
		}
	})

	t.Run("webhooks see the caller and the object as stored on create, patch, PUT, server-side apply and delete; a mutation is stored; a denial changes nothing in Coder or the record; a dry run runs them and answers the mutated object", func(t *testing.T) {
		hook := startAdmissionWebhook(t)
		s.must(t, "apply", "-f", writeManifest(t, hook.configurations()))
		t.Cleanup(func() {
			_, _ = s.run("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration", "e2e-hook", "--ignore-not-found")
		})
		waitRefused(t, s, hookDenial, "create", "--dry-run=server", "-f", workspace("probe", map[string]string{"webhook-test": "1", "deny": "1"}))

		hook.reset()
		s.must(t, "create", "-f", workspace("hooked", map[string]string{"webhook-test": "1"}))
		name := s.workspaceName("hooked")
		mutate, validate := hook.requests("mutate"), hook.requests("validate")
		if len(mutate) != 1 || len(validate) != 1 {
			t.Fatalf("the create called the mutating webhook %d times and the validating one %d times, want once each", len(mutate), len(validate))
		}
		for _, r := range []admissionv1.AdmissionRequest{mutate[0], validate[0]} {
			if r.UserInfo.Username != "admin" || r.Operation != admissionv1.Create || r.Name != name || r.Namespace != s.ns ||
				r.Resource.Resource != "coderworkspaces" || (r.DryRun != nil && *r.DryRun) {
				t.Errorf("webhook request: user %q, %s %s/%s %v dryRun %v; want admin creating %s/%s coderworkspaces for real",
					r.UserInfo.Username, r.Operation, r.Namespace, r.Name, r.Resource, r.DryRun, s.ns, name)
			}
		}
		// The validating webhook sees the object as the create stores it:
		// the mutation, and what coder-k8s derives (labels, namespace,
		// spec.organization), as an update sees them.
		checkStoredView(t, "create", validate[0].Object.Raw, s.ns, derived(s, map[string]string{"webhook-test": "1", "mutated-by": "e2e-hook"}))
		if got := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json").GetLabels()["mutated-by"]; got != "e2e-hook" {
			t.Errorf("GET after the create: label mutated-by %q, want e2e-hook", got)
		}
		if !inCoder("hooked") {
			t.Errorf("the admitted create made no workspace hooked in Coder")
		}

		out, err := s.run("create", "-f", workspace("denied", map[string]string{"webhook-test": "1", "deny": "1"}))
		if err == nil || !strings.Contains(out, hookDenial) {
			t.Errorf("create refused by the validating webhook: %v, want %q", err, hookDenial)
		}
		if inCoder("denied") {
			t.Errorf("a create the webhook denied made workspace denied in Coder")
		}
		checkNothingStored(t, s, workspacesGVR, s.workspaceName("denied"))
		out, err = s.run("label", "cws", name, "-n", s.ns, "deny=1")
		if err == nil || !strings.Contains(out, hookDenial) {
			t.Errorf("label refused by the validating webhook: %v, want %q", err, hookDenial)
		}
		if _, ok := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json").GetLabels()["deny"]; ok {
			t.Errorf("a label change the webhook denied was stored")
		}

		// Server-side apply is an update (a patch) to admission.
		hook.reset()
		s.must(t, "apply", "--server-side", "-f", workspace("hooked", map[string]string{"webhook-test": "1", "ssa": "1"}))
		if v := hook.requests("validate"); len(v) != 1 || v[0].Operation != admissionv1.Update || objectLabels(t, v[0].Object.Raw)["ssa"] != "1" {
			t.Errorf("server-side apply: the validating webhook got %d requests, want one UPDATE with the applied label", len(v))
		}
		if got := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json").GetLabels(); got["ssa"] != "1" || got["mutated-by"] != "e2e-hook" {
			t.Errorf("labels after server-side apply: %v, want ssa=1 and mutated-by=e2e-hook", got)
		}

		// A spec change the webhook denies, as a patch and as a PUT
		// (kubectl replace), starts no build in Coder.
		before := s.coderWorkspace(t, "hooked")
		hook.reset()
		out, err = s.run("patch", "cws", name, "-n", s.ns, "--type=merge", "-p", `{"metadata":{"labels":{"deny":"1"}},"spec":{"running":true}}`)
		if err == nil || !strings.Contains(out, hookDenial) {
			t.Errorf("patch running: true with label deny: %v, want refused with %q", err, hookDenial)
		}
		if v := hook.requests("validate"); len(v) != 1 || v[0].Operation != admissionv1.Update {
			t.Errorf("patch: the validating webhook got %d requests, want one UPDATE", len(v))
		}
		// Without a resourceVersion: an unconditional PUT, which a status
		// change from Coder meanwhile cannot turn into a conflict.
		replaced := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json")
		replaced.SetManagedFields(nil)
		replaced.SetResourceVersion("")
		if err := unstructured.SetNestedField(replaced.Object, true, "spec", "running"); err != nil {
			t.Fatal(err)
		}
		labels := replaced.GetLabels()
		labels["deny"] = "1"
		replaced.SetLabels(labels)
		hook.reset()
		out, err = s.run("replace", "-f", writeManifest(t, mustJSON(replaced.Object)))
		if err == nil || !strings.Contains(out, hookDenial) {
			t.Errorf("replace with running: true and label deny: %v, want refused with %q", err, hookDenial)
		}
		if v := hook.requests("validate"); len(v) != 1 || v[0].Operation != admissionv1.Update || v[0].UserInfo.Username != "admin" {
			t.Errorf("replace: the validating webhook got %+v, want one UPDATE by admin", v)
		}
		if after := s.coderWorkspace(t, "hooked"); after.LatestBuild.ID != before.LatestBuild.ID {
			t.Errorf("a spec change the webhook denied started build %d (%s)", after.LatestBuild.BuildNumber, after.LatestBuild.Transition)
		}
		got := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json")
		if running, _, _ := unstructured.NestedBool(got.Object, "spec", "running"); running {
			t.Errorf("after the denied spec changes spec.running is true")
		}
		if _, ok := got.GetLabels()["deny"]; ok {
			t.Errorf("after the denied spec changes label deny is stored")
		}
		// An admitted PUT goes through both webhooks and keeps their
		// mutation.
		replaced = got.DeepCopy()
		replaced.SetManagedFields(nil)
		replaced.SetResourceVersion("")
		labels = replaced.GetLabels()
		labels["replaced"] = "1"
		delete(labels, "mutated-by")
		replaced.SetLabels(labels)
		hook.reset()
		s.must(t, "replace", "-f", writeManifest(t, mustJSON(replaced.Object)))
		mutate, validate = hook.requests("mutate"), hook.requests("validate")
		if len(mutate) != 1 || len(validate) != 1 || validate[0].Operation != admissionv1.Update {
			t.Fatalf("replace called the mutating webhook %d times and the validating one %d times, want one UPDATE each", len(mutate), len(validate))
		}
		checkStoredView(t, "replace", validate[0].Object.Raw, s.ns, derived(s, map[string]string{"webhook-test": "1", "ssa": "1", "replaced": "1", "mutated-by": "e2e-hook"}))
		if got := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json").GetLabels(); got["replaced"] != "1" || got["mutated-by"] != "e2e-hook" {
			t.Errorf("labels after replace: %v, want replaced=1 and mutated-by=e2e-hook", got)
		}

		// A delete the webhook denies, for real and as a dry run, starts no
		// delete build.
		s.must(t, "label", "cws", name, "-n", s.ns, "deny-delete=1")
		before = s.coderWorkspace(t, "hooked")
		for _, args := range [][]string{{"--dry-run=server"}, {"--wait=false"}} {
			hook.reset()
			out, err := s.run(append([]string{"delete", "cws", name, "-n", s.ns}, args...)...)
			if err == nil || !strings.Contains(out, hookDenial) {
				t.Errorf("delete %v refused by the validating webhook: %v, want %q", args, err, hookDenial)
			}
			if v := hook.requests("validate"); len(v) != 1 || v[0].Operation != admissionv1.Delete || (v[0].DryRun != nil && *v[0].DryRun) != (args[0] == "--dry-run=server") {
				t.Errorf("delete %v: the validating webhook got %+v, want one DELETE with dryRun as asked", args, v)
			}
		}
		if after := s.coderWorkspace(t, "hooked"); after.LatestBuild.ID != before.LatestBuild.ID {
			t.Errorf("a delete the webhook denied started build %d (%s)", after.LatestBuild.BuildNumber, after.LatestBuild.Transition)
		}
		if obj := s.kubectlJSON(t, "get", "cws", name, "-n", s.ns, "-o", "json"); obj.GetDeletionTimestamp() != nil {
			t.Errorf("a delete the webhook denied marked the object deleted")
		}

		hook.reset()
		dry := s.kubectlJSON(t, "create", "--dry-run=server", "-o", "json", "-f", workspace("dry", map[string]string{"webhook-test": "1"}))
		if got := dry.GetLabels()["mutated-by"]; got != "e2e-hook" {
			t.Errorf("dry-run create answered label mutated-by %q, want e2e-hook, as the real create stores", got)
		}
		for _, r := range append(hook.requests("mutate"), hook.requests("validate")...) {
			if r.DryRun == nil || !*r.DryRun {
				t.Errorf("a webhook was called for the dry run without dryRun: true")
			}
		}
		if n := len(hook.requests("mutate")) + len(hook.requests("validate")); n != 2 {
			t.Errorf("the dry run called the webhooks (sideEffects None) %d times, want 2", n)
		}
		if v := hook.requests("validate"); len(v) == 1 {
			checkStoredView(t, "dry-run create", v[0].Object.Raw, s.ns, derived(s, map[string]string{"webhook-test": "1", "mutated-by": "e2e-hook"}))
		}
		if inCoder("dry") {
			t.Errorf("a dry-run create made workspace dry in Coder")
		}
	})

	t.Run("NamespaceLifecycle refuses a create in a terminating namespace", func(t *testing.T) {
		const ns = "closing"
		if err := s.k.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
		// A finalizer keeps the namespace terminating, with or without a
		// namespace controller.
		held := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns, Finalizers: []string{"e2e.coder.com/hold"}}}
		if err := s.c.Create(ctx, held); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = s.c.Patch(context.Background(), held, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`)))
		})
		s.must(t, "delete", "namespace", ns, "--wait=false")
		manifest := writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s}
spec: {templateName: adm}
`, s.workspaceName("late"), ns))
		waitRefused(t, s, "because it is being terminated", "create", "--dry-run=server", "-f", manifest)
		out, err := s.run("create", "-f", manifest)
		if err == nil || !strings.Contains(out, "unable to create new content in namespace closing because it is being terminated") {
			t.Errorf("create in a terminating namespace: %v, want NamespaceLifecycle's refusal", err)
		}
	})

	t.Run("the recipes of docs/policy.md do what they say", func(t *testing.T) {
		s.must(t, "apply", "-f", writeManifest(t, docRecipes(t)))
		t.Cleanup(func() {
			_, _ = s.run("delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "coder-workspace-team", "coder-allowed-templates", "coder-max-ttl", "--ignore-not-found")
			_, _ = s.run("annotate", "namespace", s.ns, "coder.com/allowed-templates-")
		})
		ws := func(labels, spec string) string {
			return writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s, labels: {%s}}
spec: {templateName: adm, running: false%s}
`, s.workspaceName("recipe"), s.ns, labels, spec))
		}
		dry := func(manifest string) (string, error) { return s.run("create", "--dry-run=server", "-f", manifest) }
		waitRefused(t, s, "every CoderWorkspace needs a team label", "create", "--dry-run=server", "-f", ws("", ""))
		out, err := s.run("create", "-f", ws("", ""))
		t.Logf("a refusal as kubectl prints it: %s", strings.TrimSpace(out))
		if err == nil || !strings.Contains(out, "ValidatingAdmissionPolicy 'coder-workspace-team' with binding 'coder-workspace-team' denied request: every CoderWorkspace needs a team label") {
			t.Errorf("create without label team: %v", err)
		}
		if out, err := dry(ws("team: a", "")); err != nil {
			t.Errorf("create with label team and no annotation on the namespace: %v\n%s", err, out)
		}

		s.must(t, "annotate", "--overwrite", "namespace", s.ns, "coder.com/allowed-templates=base,docker")
		waitRefused(t, s, "template adm is not allowed in namespace "+s.ns+" (annotation coder.com/allowed-templates)", "create", "--dry-run=server", "-f", ws("team: a", ""))
		s.must(t, "annotate", "--overwrite", "namespace", s.ns, "coder.com/allowed-templates=base,adm")
		testenv.WaitFor(t, 30*time.Second, func() error {
			if out, err := dry(ws("team: a", "")); err != nil {
				return errNotYet(fmt.Sprintf("template adm, now allowed: %v %s", err, out))
			}
			return nil
		})

		out, err = dry(ws("team: a", ", ttlMillis: 36000000"))
		if err == nil || !strings.Contains(out, "spec.ttlMillis may be at most 8 hours (28800000)") {
			t.Errorf("a 10-hour TTL: %v\n%s", err, out)
		}
		if out, err := dry(ws("team: a", ", ttlMillis: 3600000")); err != nil {
			t.Errorf("a 1-hour TTL: %v\n%s", err, out)
		}
	})
}

// docRecipes are the YAML blocks of docs/policy.md, as one manifest.
func docRecipes(t *testing.T) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", "policy.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	for _, part := range strings.Split(string(b), "```yaml\n")[1:] {
		block, _, ok := strings.Cut(part, "```")
		if !ok {
			t.Fatalf("docs/policy.md: a yaml block is not closed")
		}
		blocks = append(blocks, block)
	}
	if len(blocks) != 3 {
		t.Fatalf("docs/policy.md has %d yaml blocks, want the 3 recipes", len(blocks))
	}
	return strings.Join(blocks, "---\n")

}

// waitRefused runs kubectl args until it fails with an output containing
// want: until this server's admission has seen a configuration object
// just created.
func waitRefused(t *testing.T, s *aggStack, want string, args ...string) {
	t.Helper()
	testenv.WaitFor(t, 30*time.Second, func() error {
		out, err := s.run(args...)
		if err != nil && strings.Contains(out, want) {
			return nil
		}
		return errNotYet(fmt.Sprintf("kubectl %s: %v %s; want refused with %q", strings.Join(args, " "), err, out, want))
	})
}

// derived is labels with the labels coder-k8s derives for a workspace of
// template adm of the stack's first user: what a stored workspace carries.
func derived(s *aggStack, labels map[string]string) map[string]string {
	out := maps.Clone(labels)
	out[aggv1.LabelOrganization] = s.org
	out[aggv1.LabelControlPlane] = "coder"
	out[aggv1.LabelOwner] = s.coder.Username
	out[aggv1.LabelTemplate] = "adm"
	return out
}

// checkStoredView checks the object of a webhook request against what
// coder-k8s stores: exactly labels, namespace ns and spec.organization.
func checkStoredView(t *testing.T, what string, raw []byte, ns string, labels map[string]string) {
	t.Helper()
	var o unstructured.Unstructured
	if err := o.UnmarshalJSON(raw); err != nil {
		t.Fatalf("%s: webhook request object: %v", what, err)
	}
	if got := o.GetLabels(); !maps.Equal(got, labels) {
		t.Errorf("%s: the validating webhook saw labels %v, want %v (the object as it will be stored)", what, got, labels)
	}
	org, _, _ := unstructured.NestedString(o.Object, "spec", "organization")
	if o.GetNamespace() != ns || org != labels[aggv1.LabelOrganization] {
		t.Errorf("%s: the validating webhook saw namespace %q spec.organization %q, want %q and %q", what, o.GetNamespace(), org, ns, labels[aggv1.LabelOrganization])
	}
}

// checkNothingStored checks that a refused create left nothing a user
// can see: GET answers NotFound and no CoderObjectRecord names it.
func checkNothingStored(t *testing.T, s *aggStack, gvr schema.GroupVersionResource, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.dyn.Resource(gvr).Namespace(s.ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("GET %s %s after the refused create: %v, want NotFound", gvr.Resource, name, err)
	}
	var recs coderv1alpha1.CoderObjectRecordList
	if err := s.c.List(ctx, &recs, client.InNamespace(s.ns)); err != nil {
		t.Fatalf("list CoderObjectRecords of %s: %v", s.ns, err)
	}
	for _, r := range recs.Items {
		if r.Spec.Name == name {
			t.Errorf("the refused create of %s %s left CoderObjectRecord %s", gvr.Resource, name, r.Name)
		}
	}
}

func objectLabels(t *testing.T, raw []byte) map[string]string {
	t.Helper()
	var o metav1.PartialObjectMetadata
	if err := json.Unmarshal(raw, &o); err != nil {
		t.Fatalf("webhook request object: %v", err)
	}
	return o.Labels
}

// hookDenial is the validating webhook's message.
const hookDenial = "the e2e webhook denies objects labelled deny, and deletes of objects labelled deny-delete"

// admissionWebhook is a mutating and a validating admission webhook over
// HTTPS on loopback, as a platform team's (Kyverno, Gatekeeper, their own)
// would be: it records every AdmissionReview request it gets.
type admissionWebhook struct {
	url   string
	caPEM []byte

	mu   sync.Mutex
	seen map[string][]admissionv1.AdmissionRequest
}

func startAdmissionWebhook(t *testing.T) *admissionWebhook {
	t.Helper()
	ca, err := testenv.NewCA("e2e-webhook-ca")
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.ServingCert(nil, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(kp.CertPEM, kp.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	h := &admissionWebhook{caPEM: ca.CertPEM, seen: map[string][]admissionv1.AdmissionRequest{}}
	mux := http.NewServeMux()
	for _, kind := range []string{"mutate", "validate"} {
		mux.HandleFunc("/"+kind, func(w http.ResponseWriter, r *http.Request) { h.serve(w, r, kind) })
	}
	srv := httptest.NewUnstartedServer(mux)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

func (h *admissionWebhook) serve(w http.ResponseWriter, r *http.Request, kind string) {
	var review admissionv1.AdmissionReview
	if err := json.NewDecoder(r.Body).Decode(&review); err != nil || review.Request == nil {
		http.Error(w, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	req := *review.Request
	h.mu.Lock()
	h.seen[kind] = append(h.seen[kind], req)
	h.mu.Unlock()
	res := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	switch kind {
	case "mutate":
		patch := `[{"op":"add","path":"/metadata/labels/mutated-by","value":"e2e-hook"}]`
		pt := admissionv1.PatchTypeJSONPatch
		res.Patch, res.PatchType = []byte(patch), &pt
	case "validate":
		// A delete has only the object as it was.
		raw, denyLabel := req.Object.Raw, "deny"
		if req.Operation == admissionv1.Delete {
			raw, denyLabel = req.OldObject.Raw, "deny-delete"
		}
		var o metav1.PartialObjectMetadata
		if err := json.Unmarshal(raw, &o); err == nil && o.Labels[denyLabel] != "" {
			res.Allowed = false
			res.Result = &metav1.Status{Message: hookDenial, Code: http.StatusForbidden}
		}
	}
	review.Response, review.Request = res, nil
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(review)
}

// configurations is the webhooks' registration: workspaces labelled
// webhook-test only, so the other tests' objects are left alone.
func (h *admissionWebhook) configurations() string {
	ca := base64.StdEncoding.EncodeToString(h.caPEM)
	hook := func(kind string) string {
		ops := "CREATE, UPDATE"
		if kind == "validate" {
			ops += ", DELETE"
		}
		return fmt.Sprintf(`- name: %s.e2e.coder.com
  clientConfig: {url: %q, caBundle: %s}
  rules:
  - apiGroups: [aggregation.coder.com]
    apiVersions: ["*"]
    operations: [%s]
    resources: [coderworkspaces]
  objectSelector: {matchLabels: {webhook-test: "1"}}
  sideEffects: None
  admissionReviewVersions: [v1]
  failurePolicy: Fail
  timeoutSeconds: 10
`, kind, h.url+"/"+kind, ca, ops)
	}
	return "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata: {name: e2e-hook}\nwebhooks:\n" + hook("mutate") +
		"---\napiVersion: admissionregistration.k8s.io/v1\nkind: ValidatingWebhookConfiguration\nmetadata: {name: e2e-hook}\nwebhooks:\n" + hook("validate")
}

func (h *admissionWebhook) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = map[string][]admissionv1.AdmissionRequest{}
}

func (h *admissionWebhook) requests(kind string) []admissionv1.AdmissionRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]admissionv1.AdmissionRequest(nil), h.seen[kind]...)
}
