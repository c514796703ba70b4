package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// kubeExampleVariables are the variables of Coder's own kubernetes starter
// template (coder v2.30.0 examples/templates/kubernetes/main.tf): a
// required namespace and an optional use_kubeconfig, plus a required
// sensitive token as a registry credential would be. No providers, so it
// imports offline.
const kubeExampleVariables = `variable "use_kubeconfig" {
  type        = bool
  description = "Use host kubeconfig? (true/false)"
  default     = false
}

variable "namespace" {
  type        = string
  description = "The Kubernetes namespace to create workspaces in"
}

variable "token" {
  type      = string
  sensitive = true
}

output "namespace" {
  value = var.namespace
}
`

// secretValue is the Secret value that must appear nowhere but in coderd.
const variableSecret = "s3cr3t-registry-token-7f1c"

// TestTemplateVariables drives a template shaped like Coder's kubernetes
// example through kubectl against the real coderd (Mapped identity):
// it fails to build without its required variables and builds with them,
// values come from a Secret only for a caller who may read it and appear
// nowhere in Kubernetes, a variable dropped from the spec goes back to
// its default, and a changed Secret is applied by the next apply.
func TestTemplateVariables(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	ctx := context.Background()
	const name = "coder.kube"

	manifest := func(vars string) string {
		m := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: %s, namespace: %s}
spec:
  files:
    main.tf: |
%s`, name, s.ns, indent(kubeExampleVariables, 6))
		if vars != "" {
			m += "  variables:\n" + indent(vars, 2) + "\n"
		}
		return writeManifest(t, m)
	}
	get := func(t *testing.T) *aggv1.CoderTemplate { return s.getTemplate(t, name) }
	// waitBuilt waits for the applied files and variables to build (Ready
	// True, nothing building) or, with failed, to fail (BuildFailed), and
	// returns the object.
	waitBuilt := func(t *testing.T, failed bool) *aggv1.CoderTemplate {
		t.Helper()
		var obj *aggv1.CoderTemplate
		testenv.WaitFor(t, 3*time.Minute, func() error {
			obj = get(t)
			for _, c := range obj.Status.Conditions {
				if c.Type != aggv1.ConditionReady {
					continue
				}
				if failed && c.Reason == aggv1.ReasonBuildFailed || !failed && c.Status == metav1.ConditionTrue && obj.Status.BuildingVersionID == "" {
					return nil
				}
			}
			return fmt.Errorf("Ready condition %+v, building %q", obj.Status.Conditions, obj.Status.BuildingVersionID)
		})
		return obj
	}
	coderValues := func(t *testing.T, versionID string) map[string]codersdk.TemplateVersionVariable {
		t.Helper()
		vars, err := s.coder.Client.TemplateVersionVariables(ctx, uuid.MustParse(versionID))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]codersdk.TemplateVersionVariable{}
		for _, v := range vars {
			out[v.Name] = v
		}
		return out
	}
	versionCount := func(t *testing.T) int {
		t.Helper()
		vs, err := s.coder.Client.TemplateVersionsByTemplate(ctx, codersdk.TemplateVersionsByTemplateRequest{TemplateID: s.coderTemplate(t, "kube").ID})
		if err != nil {
			t.Fatal(err)
		}
		return len(vs)
	}
	apply := func(t *testing.T, m string) {
		t.Helper()
		s.must(t, "apply", "--server-side", "--field-manager=gitops", "-f", m)
	}

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kube-vars", Namespace: s.ns},
		StringData: map[string]string{"namespace": "from-secret", "token": variableSecret}}
	if err := s.c.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	fromSecret := `- name: namespace
  valueFrom: {secretKeyRef: {name: kube-vars, key: namespace}}
- name: token
  valueFrom: {secretKeyRef: {name: kube-vars, key: token}}
- name: use_kubeconfig
  value: "true"`

	t.Run("without its required variables the build fails naming them", func(t *testing.T) {
		apply(t, manifest(""))
		obj := waitBuilt(t, true)
		msg := readyMessage(obj)
		if !strings.Contains(msg, "required template variables need values") || !strings.Contains(msg, "namespace") || !strings.Contains(msg, "token") {
			t.Errorf("Ready message %q, want coderd's required-variables error naming namespace and token", msg)
		}
	})

	t.Run("literal and Secret values build; the object shows what was applied", func(t *testing.T) {
		m := manifest(fromSecret)
		dry := s.must(t, "apply", "--server-side", "--field-manager=gitops", "--dry-run=server", "-f", m, "-o", "yaml")
		if strings.Contains(dry, variableSecret) {
			t.Errorf("the dry run's answer holds the Secret's value:\n%s", dry)
		}
		apply(t, m)
		obj := waitBuilt(t, false)
		want := []aggv1.TemplateVariable{
			{Name: "namespace", ValueFrom: &aggv1.TemplateVariableSource{SecretKeyRef: &aggv1.SecretKeySelector{Name: "kube-vars", Key: "namespace"}}},
			{Name: "token", ValueFrom: &aggv1.TemplateVariableSource{SecretKeyRef: &aggv1.SecretKeySelector{Name: "kube-vars", Key: "token"}}},
			{Name: "use_kubeconfig", Value: "true"},
		}
		if got := mustJSON(obj.Spec.Variables); got != mustJSON(want) {
			t.Errorf("spec.variables read back %s, want %s", got, mustJSON(want))
		}
		var sec corev1.Secret
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(secret), &sec); err != nil {
			t.Fatal(err)
		}
		wantStatus := []aggv1.TemplateVariableStatus{
			{Name: "namespace", Type: "string", Required: true, SecretKeyRef: &aggv1.SecretKeySelector{Name: "kube-vars", Key: "namespace"}, SecretResourceVersion: sec.ResourceVersion},
			{Name: "token", Type: "string", Required: true, Sensitive: true, SecretKeyRef: &aggv1.SecretKeySelector{Name: "kube-vars", Key: "token"}, SecretResourceVersion: sec.ResourceVersion},
			{Name: "use_kubeconfig", Type: "bool"},
		}
		if got := mustJSON(obj.Status.Variables); got != mustJSON(wantStatus) {
			t.Errorf("status.variables %s, want %s", got, mustJSON(wantStatus))
		}
		vals := coderValues(t, obj.Status.ActiveVersionID)
		if vals["namespace"].Value != "from-secret" || vals["use_kubeconfig"].Value != "true" || !vals["token"].Sensitive {
			t.Errorf("coderd's active version has variables %+v, want namespace=from-secret (from the Secret), use_kubeconfig=true, token sensitive", vals)
		}
		// The template built, so coderd got the required token; it shows
		// it redacted. Nowhere in Kubernetes is its value.
		for what, text := range map[string]string{
			"the object":       s.must(t, "get", "ctpl", name, "-n", s.ns, "-o", "yaml"),
			"the records":      s.must(t, "get", "coderobjectrecords", "-n", s.ns, "-o", "yaml"),
			"the events":       s.must(t, "get", "events", "-A", "-o", "yaml"),
			"the operator log": readFile(t, s.op.LogPath),
		} {
			if strings.Contains(text, variableSecret) {
				t.Errorf("%s holds the Secret's value", what)
			}
		}
	})

	t.Run("a variable the files do not declare, or a literal sensitive value, is refused", func(t *testing.T) {
		before := versionCount(t)
		for vars, want := range map[string]string{
			fromSecret + "\n- {name: region, value: eu}": `spec.variables[3].name: Not found: "region (the template's files declare no such variable)"`,
			strings.Replace(fromSecret, "valueFrom: {secretKeyRef: {name: kube-vars, key: token}}", "value: "+variableSecret, 1): "spec.variables[1].value: Forbidden: variable token is sensitive",
		} {
			out, err := s.run("apply", "--server-side", "--field-manager=gitops", "-f", manifest(vars))
			if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "is invalid") {
				t.Errorf("apply: %v %s\nwant a 422 with %q", err, out, want)
			}
			if strings.Contains(out, variableSecret) {
				t.Errorf("the refusal repeats the value: %s", out)
			}
		}
		if n := versionCount(t); n != before {
			t.Errorf("Coder has %d versions of the template after refused applies, want %d", n, before)
		}
	})

	t.Run("a variable dropped from the spec gets its default", func(t *testing.T) {
		apply(t, manifest(strings.TrimSuffix(fromSecret, "\n- name: use_kubeconfig\n  value: \"true\"")))
		obj := waitBuilt(t, false)
		if vals := coderValues(t, obj.Status.ActiveVersionID); vals["use_kubeconfig"].Value != "false" || vals["namespace"].Value != "from-secret" {
			t.Errorf("after dropping use_kubeconfig, coderd's active version has %+v, want use_kubeconfig=false (its default), namespace=from-secret", vals)
		}
		if len(obj.Spec.Variables) != 2 {
			t.Errorf("spec.variables %+v, want the two applied", obj.Spec.Variables)
		}
	})

	t.Run("a changed Secret is applied by the next apply", func(t *testing.T) {
		var sec corev1.Secret
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(secret), &sec); err != nil {
			t.Fatal(err)
		}
		sec.Data["namespace"] = []byte("from-secret-2")
		if err := s.c.Update(ctx, &sec); err != nil {
			t.Fatal(err)
		}
		// Until the next apply, the object says so (Secrets' revisions
		// are read again at most every 30 s).
		testenv.WaitFor(t, time.Minute, func() error {
			c := apimeta.FindStatusCondition(get(t).Status.Conditions, aggv1.ConditionSecretsCurrent)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != aggv1.ReasonSecretChanged || !strings.Contains(c.Message, "Secret kube-vars changed") {
				return fmt.Errorf("SecretsCurrent condition %+v, want False/SecretChanged naming kube-vars", c)
			}
			return nil
		})
		before := get(t).Status.ActiveVersionID
		apply(t, manifest(strings.TrimSuffix(fromSecret, "\n- name: use_kubeconfig\n  value: \"true\"")))
		obj := waitBuilt(t, false)
		if obj.Status.ActiveVersionID == before {
			t.Fatalf("the apply after the Secret changed built no new version")
		}
		if vals := coderValues(t, obj.Status.ActiveVersionID); vals["namespace"].Value != "from-secret-2" {
			t.Errorf("coderd's active version has namespace=%q, want the Secret's new value", vals["namespace"].Value)
		}
		for _, v := range obj.Status.Variables {
			if v.SecretKeyRef != nil && v.SecretResourceVersion != sec.ResourceVersion {
				t.Errorf("status.variables %s read Secret revision %s, want %s", v.Name, v.SecretResourceVersion, sec.ResourceVersion)
			}
		}
		if c := apimeta.FindStatusCondition(obj.Status.Conditions, aggv1.ConditionSecretsCurrent); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("after the apply, SecretsCurrent is %+v, want True", c)
		}
		// Applying it once more changes nothing.
		apply(t, manifest(strings.TrimSuffix(fromSecret, "\n- name: use_kubeconfig\n  value: \"true\"")))
		if again := get(t); again.Status.ActiveVersionID != obj.Status.ActiveVersionID || again.Status.BuildingVersionID != "" {
			t.Errorf("the same apply again started version %q (active %s), want none", again.Status.BuildingVersionID, again.Status.ActiveVersionID)
		}
	})

	t.Run("a caller who may not read the Secret is refused", func(t *testing.T) {
		// dev@example.com maps (by email) to Coder user dev, a template
		// admin; in Kubernetes dev may write codertemplates but not read
		// Secrets.
		if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
			Email: "dev@example.com", Username: "dev", Password: "SomeSecurePassword!1",
			OrganizationIDs: []uuid.UUID{s.coder.OrganizationID}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.coder.Client.UpdateUserRoles(ctx, "dev", codersdk.UpdateRoles{Roles: []string{codersdk.RoleTemplateAdmin}}); err != nil {
			t.Fatal(err)
		}
		dev := s.kubectlAs(t, "dev@example.com", "devs", "template-writer",
			rbacv1.PolicyRule{APIGroups: []string{aggv1.GroupName}, Resources: []string{"codertemplates"}, Verbs: []string{"*"}})
		before := versionCount(t)
		m := manifest(fromSecret)
		for _, dryRun := range []string{"--dry-run=server", "--dry-run=none"} {
			r, err := dev.Run(ctx, "", "apply", "--server-side", "--field-manager=dev", "--force-conflicts", dryRun, "-f", m)
			if err == nil || !strings.Contains(r.Combined, "Forbidden") || !strings.Contains(r.Combined, `coder-k8s would read Secret "kube-vars" for you, and you may not get it in namespace `+s.ns) {
				t.Errorf("apply %s as dev: %v %s, want 403 naming the Secret", dryRun, err, r.Combined)
			}
		}
		if n := versionCount(t); n != before {
			t.Errorf("Coder has %d versions after dev's refused applies, want %d", n, before)
		}
	})
}

// readyMessage is obj's Ready condition's message.
func readyMessage(obj *aggv1.CoderTemplate) string {
	if c := apimeta.FindStatusCondition(obj.Status.Conditions, aggv1.ConditionReady); c != nil {
		return c.Message
	}
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
