package flux

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fluxcd/cli-utils/pkg/kstatus/polling"
	"github.com/fluxcd/cli-utils/pkg/object"
	"github.com/fluxcd/pkg/ssa"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

const (
	templateName  = "flux-tpl"
	workspaceName = "flux-ws"
	displayName   = "Flux template"
	// The namespace of the Kustomizations (owner labels), as in a cluster.
	fluxNamespace = "flux-system"
)

var (
	templateGVK  = schema.GroupVersionKind{Group: "aggregation.coder.com", Version: "v1alpha1", Kind: "CoderTemplate"}
	workspaceGVK = schema.GroupVersionKind{Group: "aggregation.coder.com", Version: "v1alpha1", Kind: "CoderWorkspace"}
)

// kustomization is what kustomize-controller does for one Kustomization:
// the objects its build produced, applied by ssa.ResourceManager with
// the Kustomization's owner labels, and its inventory (status.inventory)
// of what the last apply wrote.
type kustomization struct {
	name      string
	manifests string
	inventory object.ObjMetadataSet
}

func (k *kustomization) objects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(fmt.Sprintf(k.manifests, env.Namespace), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("manifest of %s: %v", k.name, err)
		}
		objs = append(objs, u)
	}
	return objs
}

// apply is one reconciliation: apply, record the inventory, and prune what
// the previous inventory had and this one has not, like kustomize-controller
// (DeleteAll with the owner labels as inclusions, then wait for the
// deletions).
func (k *kustomization) apply(ctx context.Context, t *testing.T, rm *ssa.ResourceManager, objs []*unstructured.Unstructured) *ssa.ChangeSet {
	t.Helper()
	rm.SetOwnerLabels(objs, k.name, fluxNamespace)
	cs, err := rm.ApplyAllStaged(ctx, objs, ssa.DefaultApplyOptions())
	if err != nil {
		t.Fatalf("Kustomization %s: apply: %v\ncoder-k8s log:\n%s", k.name, err, env.OperatorLogTail(30))
	}
	newInv := object.UnstructuredSetToObjMetadataSet(objs)
	stale := k.inventory.Diff(newInv)
	k.inventory = newInv
	if len(stale) > 0 {
		var staleObjs []*unstructured.Unstructured
		for _, id := range stale {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(schema.GroupVersionKind{Group: id.GroupKind.Group, Version: "v1alpha1", Kind: id.GroupKind.Kind})
			u.SetNamespace(id.Namespace)
			u.SetName(id.Name)
			staleObjs = append(staleObjs, u)
		}
		pruned, err := rm.DeleteAll(ctx, staleObjs, ssa.DeleteOptions{
			PropagationPolicy: metav1.DeletePropagationBackground,
			Inclusions:        rm.GetOwnerLabels(k.name, fluxNamespace),
			Exclusions:        map[string]string{"kustomize.toolkit.fluxcd.io/prune": "disabled"},
		})
		if err != nil {
			t.Fatalf("Kustomization %s: prune: %v", k.name, err)
		}
		cs.Append(pruned.Entries)
		if err := rm.WaitForTermination(staleObjs, ssa.WaitOptions{Interval: time.Second, Timeout: within}); err != nil {
			t.Fatalf("Kustomization %s: wait for pruned objects to be gone: %v", k.name, err)
		}
	}
	t.Logf("Kustomization %s:\n%s", k.name, cs.String())
	return cs
}

// wait is kustomize-controller's health check (spec.wait): kstatus says
// Current for every object of the change set.
func (k *kustomization) wait(t *testing.T, rm *ssa.ResourceManager, cs *ssa.ChangeSet) {
	t.Helper()
	start := time.Now()
	if err := rm.WaitForSet(cs.ToObjMetadataSet(), ssa.WaitOptions{Interval: time.Second, Timeout: within}); err != nil {
		t.Fatalf("Kustomization %s: wait for kstatus Current: %v", k.name, err)
	}
	t.Logf("Kustomization %s: kstatus Current after %s", k.name, time.Since(start).Round(time.Millisecond))
}

func requireActions(t *testing.T, step string, cs *ssa.ChangeSet, want map[string]ssa.Action) {
	t.Helper()
	got := map[string]ssa.Action{}
	for _, e := range cs.Entries {
		got[e.ObjMetadata.GroupKind.Kind+"/"+e.ObjMetadata.Name] = e.Action
	}
	for id, a := range want {
		if got[id] != a {
			t.Errorf("%s: %s: action %q, want %q (change set:\n%s)", step, id, got[id], a, cs.String())
		}
	}
}

const templateManifest = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: coder.` + templateName + `
  namespace: %[1]s
spec:
  displayName: ` + displayName + `
  description: Applied by fluxcd/pkg/ssa
  defaultTTL: 8h
  activityBump: 90m
  versionName: release-1.0
  versionMessage: Released through fluxcd/pkg/ssa
  files:
    main.tf: |
      variable "greeting" {
        type = string
      }
      variable "audience" {
        type    = string
        default = "world"
      }
      output "greeting" {
        value = "${var.greeting} ${var.audience}"
      }
  variables:
    - name: greeting
      valueFrom:
        secretKeyRef: {name: ` + variablesSecret + `, key: greeting}
    - name: audience
      value: flux`

// variablesSecret holds a value of the template's variables: it is not in
// Git, as a credential would not be.
const variablesSecret = "flux-tpl-vars"

const workspaceManifest = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: coder.admin.` + workspaceName + `
  namespace: %[1]s
spec:
  templateName: ` + templateName + `
  running: true`

func TestFluxSSA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	poller := polling.NewStatusPoller(kube, kube.RESTMapper(), polling.Options{})
	rm := ssa.NewResourceManager(kube, poller, ssa.Owner{Field: "kustomize-controller", Group: "kustomize.toolkit.fluxcd.io"})
	// Two Kustomizations, the workspaces one dependsOn the templates one:
	// a workspace needs its template built.
	templates := &kustomization{name: "coder-templates", manifests: templateManifest}
	workspaces := &kustomization{name: "coder-workspaces", manifests: workspaceManifest}
	tplID := "CoderTemplate/coder." + templateName
	wsID := "CoderWorkspace/coder.admin." + workspaceName

	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: variablesSecret, Namespace: env.Namespace},
		StringData: map[string]string{"greeting": "hello"}}
	if err := kube.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}

	t.Run("apply creates", func(t *testing.T) {
		cs := templates.apply(ctx, t, rm, templates.objects(t))
		requireActions(t, "first apply", cs, map[string]ssa.Action{tplID: ssa.CreatedAction})
		templates.wait(t, rm, cs)
		// kstatus Current must mean what a user waits for: the template built.
		requireCondition(ctx, t, templateGVK, "coder."+templateName, "Ready", metav1.ConditionTrue)

		cs = workspaces.apply(ctx, t, rm, workspaces.objects(t))
		requireActions(t, "first apply", cs, map[string]ssa.Action{wsID: ssa.CreatedAction})
		workspaces.wait(t, rm, cs)
		requireField(ctx, t, workspaceGVK, "coder.admin."+workspaceName, "running", "status", "phase")
	})
	if t.Failed() {
		return
	}

	t.Run("second apply is unchanged", func(t *testing.T) {
		cs := templates.apply(ctx, t, rm, templates.objects(t))
		requireActions(t, "second apply", cs, map[string]ssa.Action{tplID: ssa.UnchangedAction})
		cs = workspaces.apply(ctx, t, rm, workspaces.objects(t))
		requireActions(t, "second apply", cs, map[string]ssa.Action{wsID: ssa.UnchangedAction})
		// The version took the name and message applied.
		if out, err := env.Coder(ctx, "templates", "versions", "list", templateName); err != nil || !strings.Contains(out, "release-1.0") {
			t.Errorf("coder templates versions list %s: %v\n%s\nwant the version release-1.0", templateName, err, out)
		}
		// The owner labels and the field manager are on the live objects.
		for _, o := range []struct {
			gvk  schema.GroupVersionKind
			name string
			k    *kustomization
		}{{templateGVK, "coder." + templateName, templates}, {workspaceGVK, "coder.admin." + workspaceName, workspaces}} {
			live := get(ctx, t, o.gvk, o.name)
			if got := live.GetLabels()["kustomize.toolkit.fluxcd.io/name"]; got != o.k.name {
				t.Errorf("%s %s: label kustomize.toolkit.fluxcd.io/name = %q, want %q", o.gvk.Kind, o.name, got, o.k.name)
			}
			if !hasManager(live, "kustomize-controller") {
				t.Errorf("%s %s: no managedFields entry of kustomize-controller: %v", o.gvk.Kind, o.name, managers(live))
			}
		}
	})

	t.Run("drift made in Coder is corrected", func(t *testing.T) {
		if _, err := env.Coder(ctx, "templates", "edit", templateName, "--display-name", "Changed in Coder", "--default-ttl", "2h", "--yes"); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Coder(ctx, "stop", workspaceName, "--yes"); err != nil {
			t.Fatal(err)
		}
		waitField(ctx, t, workspaceGVK, "coder.admin."+workspaceName, "stopped", "status", "phase")

		cs := templates.apply(ctx, t, rm, templates.objects(t))
		requireActions(t, "apply after the change in Coder", cs, map[string]ssa.Action{tplID: ssa.ConfiguredAction})
		templates.wait(t, rm, cs)
		requireField(ctx, t, templateGVK, "coder."+templateName, displayName, "spec", "displayName")
		// The default TTL changed in Coder is healed, and read back as
		// written.
		requireField(ctx, t, templateGVK, "coder."+templateName, "8h", "spec", "defaultTTL")

		cs = workspaces.apply(ctx, t, rm, workspaces.objects(t))
		requireActions(t, "apply after the change in Coder", cs, map[string]ssa.Action{wsID: ssa.ConfiguredAction})
		workspaces.wait(t, rm, cs)
		waitField(ctx, t, workspaceGVK, "coder.admin."+workspaceName, "running", "status", "phase")
	})

	t.Run("prune by inventory", func(t *testing.T) {
		// The manifests are gone from the source: the next reconciliation
		// applies nothing and prunes the inventory, workspaces first.
		cs := workspaces.apply(ctx, t, rm, nil)
		requireActions(t, "prune", cs, map[string]ssa.Action{wsID: ssa.DeletedAction})
		cs = templates.apply(ctx, t, rm, nil)
		requireActions(t, "prune", cs, map[string]ssa.Action{tplID: ssa.DeletedAction})
		for _, o := range []struct {
			gvk  schema.GroupVersionKind
			name string
		}{{workspaceGVK, "coder.admin." + workspaceName}, {templateGVK, "coder." + templateName}} {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(o.gvk)
			err := kube.Get(ctx, client.ObjectKey{Namespace: env.Namespace, Name: o.name}, u)
			if !apierrors.IsNotFound(err) {
				t.Errorf("%s %s after the prune: %v, want NotFound", o.gvk.Kind, o.name, err)
			}
		}
		if out, err := env.Coder(ctx, "list", "--all", "--output", "json"); err != nil || strings.Contains(out, workspaceName) {
			t.Errorf("coder list after the prune: %v\n%s", err, out)
		}
		if out, err := env.Coder(ctx, "templates", "list", "--output", "json"); err != nil || strings.Contains(out, `"`+templateName+`"`) {
			t.Errorf("coder templates list after the prune: %v\n%s", err, out)
		}
	})
}

func get(ctx context.Context, t *testing.T, gvk schema.GroupVersionKind, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := kube.Get(ctx, client.ObjectKey{Namespace: env.Namespace, Name: name}, u); err != nil {
		t.Fatalf("get %s %s: %v", gvk.Kind, name, err)
	}
	return u
}

func requireCondition(ctx context.Context, t *testing.T, gvk schema.GroupVersionKind, name, typ string, want metav1.ConditionStatus) {
	t.Helper()
	live := get(ctx, t, gvk, name)
	conds, _, _ := unstructured.NestedSlice(live.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			if m["status"] != string(want) {
				t.Errorf("%s %s: condition %s = %v (reason %v: %v), want %s", gvk.Kind, name, typ, m["status"], m["reason"], m["message"], want)
			}
			return
		}
	}
	t.Errorf("%s %s: no condition %s in %v", gvk.Kind, name, typ, conds)
}

func requireField(ctx context.Context, t *testing.T, gvk schema.GroupVersionKind, name, want string, path ...string) {
	t.Helper()
	live := get(ctx, t, gvk, name)
	if got, _, _ := unstructured.NestedString(live.Object, path...); got != want {
		t.Errorf("%s %s: %s = %q, want %q", gvk.Kind, name, strings.Join(path, "."), got, want)
	}
}

func waitField(ctx context.Context, t *testing.T, gvk schema.GroupVersionKind, name, want string, path ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	var got string
	for time.Now().Before(deadline) {
		got, _, _ = unstructured.NestedString(get(ctx, t, gvk, name).Object, path...)
		if got == want {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("%s %s: %s = %q after %s, want %q", gvk.Kind, name, strings.Join(path, "."), got, within, want)
}

func hasManager(u *unstructured.Unstructured, manager string) bool {
	for _, m := range u.GetManagedFields() {
		if m.Manager == manager {
			return true
		}
	}
	return false
}

func managers(u *unstructured.Unstructured) []string {
	var out []string
	for _, m := range u.GetManagedFields() {
		out = append(out, m.Manager+"/"+string(m.Operation))
	}
	return out
}
