package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/aggregated/records"
	"github.com/coder/coder-k8s/internal/testenv"
)

// TestMetadata proves, through kube-apiserver with its default request
// timeout and with real kubectl (today's and the oldest supported), that
// coderworkspaces and codertemplates keep their Kubernetes metadata
// (labels, annotations, finalizers, ownerReferences, managedFields,
// generation) as any resource does, in a store of their own in Kubernetes:
// label and annotate, selectors, watch events for metadata-only changes,
// server-side apply with two field managers, kubectl diff, apply --prune,
// generation and observedGeneration, user finalizers, derived labels
// that cannot be overridden, dry runs that return what the write keeps,
// and all of it across an operator restart. The garbage collector's
// ownerReferences have a test of their own with kube-controller-manager
// as clusters run it (TestClusterControllers).
func TestMetadata(t *testing.T) {
	t.Parallel()
	env := newMetadataEnv(t)
	runSubtests(t, env, []subtest[*metadataEnv]{
		{"an object made in Coder has generation 1 and coderd's managedFields only", testMetadataMadeInCoder},
		{"kubectl label and annotate are kept; -l selects by them (kubectl " + oldestKubectl + " and today's)", testMetadataLabelAnnotate},
		{"a label change reaches an open watch as MODIFIED with a new resourceVersion", testMetadataWatchLabelChange},
		{"server-side apply keeps each field manager's ownership", testMetadataServerSideApply},
		{"kubectl diff --server-side shows drift and no drift", testMetadataDiff},
		{"kubectl apply --prune -l deletes the object that left the set", testMetadataPrune},
		{"metadata.generation counts spec changes; conditions carry observedGeneration", testMetadataGeneration},
		{"a user finalizer holds a delete until it is removed", testMetadataFinalizer},
		{"derived labels cannot be overridden", testMetadataDerivedLabels},
		{"--dry-run=server returns what the write then returns, and writes nothing", testMetadataDryRun},
		{"the record goes when its workspace is deleted in Coder", testMetadataRecordDeleted},
		{"metadata survives an operator restart", testMetadataRestart},
	})
}

// metadataEnv is what TestMetadata's subtests share.
type metadataEnv struct {
	s *aggStack
	// old is s with the oldest supported kubectl.
	old *aggStack
	// coderWS is workspace ws-meta, made in Coder, and wsMeta its object's
	// name; recordKey is the key of its CoderObjectRecord.
	coderWS   codersdk.Workspace
	wsMeta    string
	recordKey records.Key
	// tplBase is the object name of template base, baseTpl the template
	// in coderd.
	tplBase string
	baseTpl codersdk.Template
	// tplGitOps is the object name of template gitops, which field
	// managers argocd-controller (argoV1, then argoV2) and flux (fluxCfg)
	// apply.
	tplGitOps, argoV1, argoV2, fluxCfg string
}

// newMetadataEnv builds the stack, template base and workspace ws-meta in
// Coder, and the configurations field managers apply to template gitops.
func newMetadataEnv(t *testing.T) *metadataEnv {
	s := newStack(t)
	ctx := context.Background()
	oldBin, err := testenv.Binary("kubectl-" + oldestKubectl)
	if err != nil {
		t.Fatal(err)
	}
	old := *s
	old.kubectl = oldBin
	if _, err := s.coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	// A workspace made in Coder, never written through Kubernetes.
	coderWS, err := s.coder.CreateWorkspace(ctx, "base", "ws-meta")
	if err != nil {
		t.Fatal(err)
	}
	wsMeta := s.workspaceName("ws-meta")
	// Its CoderObjectRecord, once a write through Kubernetes made one.
	recordKey := records.Key{Namespace: s.ns, Resource: "coderworkspaces", ControlPlane: "coder", CoderID: coderWS.ID.String()}
	tplBase := s.org + ".base"
	baseTpl := s.coderTemplate(t, "base")
	tplGitOps := s.org + ".gitops"
	argoV1 := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: %[1]s
  namespace: %[2]s
  labels:
    app.kubernetes.io/part-of: gitops-demo
    kustomize.toolkit.fluxcd.io/name: demo
  annotations:
    argocd.argoproj.io/tracking-id: demo:aggregation.coder.com/CoderTemplate:%[2]s/%[1]s
spec:
  displayName: GitOps
  description: owned by argocd
  files:
    main.tf: |
%[3]s`, tplGitOps, s.ns, indent(mainTF, 6))
	// argoV2 drops the part-of label and spec.description.
	argoV2 := strings.Replace(strings.Replace(argoV1, "    app.kubernetes.io/part-of: gitops-demo\n", "", 1), "  description: owned by argocd\n", "", 1)
	fluxCfg := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: %s
  namespace: %s
  labels:
    example.com/flux-owned: "true"
spec:
  description: owned by flux
`, tplGitOps, s.ns)
	return &metadataEnv{s: s, old: &old, coderWS: coderWS, wsMeta: wsMeta, recordKey: recordKey, tplBase: tplBase, baseTpl: baseTpl,
		tplGitOps: tplGitOps, argoV1: argoV1, argoV2: argoV2, fluxCfg: fluxCfg}
}

// testMetadataMadeInCoder checks that an object made in Coder has generation 1 and only coderd's managedFields.
func testMetadataMadeInCoder(t *testing.T, env *metadataEnv) {
	s, wsMeta, tplBase := env.s, env.wsMeta, env.tplBase
	for _, o := range []struct {
		gvr  schema.GroupVersionResource
		name string
	}{{workspacesGVR, wsMeta}, {templatesGVR, tplBase}} {
		u := s.getObj(t, o.gvr, o.name)
		if g := u.GetGeneration(); g != 1 {
			t.Errorf("%s: metadata.generation %d, want 1", o.name, g)
		}
		mf := u.GetManagedFields()
		if len(mf) != 1 || mf[0].Manager != "coderd" || mf[0].Operation != metav1.ManagedFieldsOperationUpdate ||
			mf[0].FieldsV1 == nil || mf[0].FieldsV1.GetRawString() != `{"f:status":{}}` {
			t.Errorf("%s: managedFields %s, want only coderd's Update of status", o.name, mustJSON(mf))
		}
		checkObservedGeneration(t, u, 1)
	}
}

// testMetadataLabelAnnotate checks that kubectl label and annotate (the oldest supported kubectl and today's) are kept, in the CoderObjectRecord too, and that -l selects by them.
func testMetadataLabelAnnotate(t *testing.T, env *metadataEnv) {
	ctx, s, old, coderWS, wsMeta, recordKey, tplBase := context.Background(), env.s, env.old, env.coderWS, env.wsMeta, env.recordKey, env.tplBase
	for _, k := range []struct {
		name string
		s    *aggStack
	}{{"new", s}, {"old", old}} {
		for _, o := range []struct {
			kind, name, resource string
			gvr                  schema.GroupVersionResource
			derived              map[string]string
		}{
			{"cws", wsMeta, "coderworkspace", workspacesGVR, map[string]string{aggv1.LabelControlPlane: "coder",
				aggv1.LabelOrganization: s.org, aggv1.LabelOwner: s.coder.Username, aggv1.LabelTemplate: "base"}},
			{"ctpl", tplBase, "codertemplate", templatesGVR, map[string]string{aggv1.LabelControlPlane: "coder", aggv1.LabelOrganization: s.org, aggv1.LabelTemplate: "base"}},
		} {
			full := o.resource + ".aggregation.coder.com/" + o.name
			out := k.s.must(t, "label", o.kind, o.name, "-n", s.ns, "--overwrite", "example.com/team="+k.name)
			if want := full + " labeled"; !strings.Contains(out, want) {
				t.Errorf("kubectl %s label printed %q, want %q", k.name, out, want)
			}
			out = k.s.must(t, "annotate", o.kind, o.name, "-n", s.ns, "--overwrite", "example.com/note=hello from "+k.name)
			if want := full + " annotated"; !strings.Contains(out, want) {
				t.Errorf("kubectl %s annotate printed %q, want %q", k.name, out, want)
			}
			u := s.getObj(t, o.gvr, o.name)
			wantLabels := map[string]string{"example.com/team": k.name}
			for key, v := range o.derived {
				wantLabels[key] = v
			}
			if got := u.GetLabels(); !maps.Equal(got, wantLabels) {
				t.Errorf("%s labels after kubectl %s label: %v, want %v", o.name, k.name, got, wantLabels)
			}
			if got := u.GetAnnotations()["example.com/note"]; got != "hello from "+k.name {
				t.Errorf("%s annotation example.com/note after kubectl %s annotate: %q", o.name, k.name, got)
			}
			if got := u.GetGeneration(); got != 1 {
				t.Errorf("%s: metadata-only changes moved metadata.generation to %d, want 1", o.name, got)
			}
			out = k.s.must(t, "get", o.kind, "-n", s.ns, "-o", "name", "-l", "example.com/team="+k.name)
			if want := full + "\n"; out != want {
				t.Errorf("kubectl %s get %s -l example.com/team=%s: %q, want %q", k.name, o.kind, k.name, out, want)
			}
			out = k.s.must(t, "get", o.kind, "-A", "-o", "name", "-l", "example.com/team,example.com/team!=nobody")
			if want := full + "\n"; out != want {
				t.Errorf("kubectl %s get %s -A -l example.com/team,example.com/team!=nobody: %q, want %q", k.name, o.kind, out, want)
			}
		}
	}

	// The record in Kubernetes holds them, keyed by the Coder UUID.
	var rec coderv1alpha1.CoderObjectRecord
	key := recordKey.NamespacedName()
	if err := s.c.Get(ctx, key, &rec); err != nil {
		t.Fatalf("CoderObjectRecord %s: %v", key, err)
	}
	if rec.Spec.Labels["example.com/team"] != "old" || rec.Spec.Annotations["example.com/note"] != "hello from old" {
		t.Errorf("CoderObjectRecord %s spec.labels %v spec.annotations %v", key, rec.Spec.Labels, rec.Spec.Annotations)
	}
	if _, ok := rec.Spec.Labels[aggv1.LabelOwner]; ok {
		t.Errorf("CoderObjectRecord %s stores the derived label %s: %v", key, aggv1.LabelOwner, rec.Spec.Labels)
	}
	if rec.Spec.CoderID != coderWS.ID.String() || rec.Spec.Resource != "coderworkspaces" {
		t.Errorf("CoderObjectRecord %s: coderID %q resource %q", key, rec.Spec.CoderID, rec.Spec.Resource)
	}

	// Removing a label removes it; the selector then finds nothing.
	s.must(t, "label", "ctpl", tplBase, "-n", s.ns, "example.com/team-")
	if _, ok := s.getObj(t, templatesGVR, tplBase).GetLabels()["example.com/team"]; ok {
		t.Errorf("kubectl label example.com/team- left the label on %s", tplBase)
	}
	if out := s.must(t, "get", "ctpl", "-n", s.ns, "-o", "name", "-l", "example.com/team"); out != "" {
		t.Errorf("-l example.com/team after the label was removed: %q", out)
	}
}

// testMetadataWatchLabelChange checks that a label change reaches an open watch as MODIFIED with a new resourceVersion.
func testMetadataWatchLabelChange(t *testing.T, env *metadataEnv) {
	ctx, s, old, wsMeta := context.Background(), env.s, env.old, env.wsMeta
	list, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := s.getObj(t, workspacesGVR, wsMeta).GetResourceVersion()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Watch(wctx, metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	kw := old.startKubectl(t, "get", "cws", "-n", s.ns, "-w", "--output-watch-events", "-L", "example.com/watched")
	kw.waitLine(t, 30*time.Second, "ADDED", wsMeta)

	s.must(t, "label", "cws", wsMeta, "-n", s.ns, "example.com/watched=v1")
	returned := time.Now()
	ev := waitWatchEvent(t, w, 10*time.Second, func(ev watch.Event) bool {
		u, ok := ev.Object.(*unstructured.Unstructured)
		return ok && u.GetName() == wsMeta && u.GetLabels()["example.com/watched"] == "v1"
	})
	t.Logf("the watch had the label change %s after kubectl label returned", time.Since(returned).Round(time.Millisecond))
	if ev.Type != watch.Modified {
		t.Errorf("event type %s, want MODIFIED", ev.Type)
	}
	u := ev.Object.(*unstructured.Unstructured)
	if u.GetResourceVersion() == before {
		t.Errorf("the event carries the resourceVersion %s of the object before the label change", before)
	}
	if got := s.getObj(t, workspacesGVR, wsMeta).GetResourceVersion(); got != u.GetResourceVersion() {
		t.Errorf("GET after the event: resourceVersion %s, the event's %s", got, u.GetResourceVersion())
	}
	line := kw.waitLine(t, 10*time.Second, "MODIFIED", wsMeta, "v1")
	if f := strings.Fields(line); f[len(f)-1] != "v1" {
		t.Errorf("kubectl %s get -w -L example.com/watched: %q, want the last column v1", oldestKubectl, line)
	}
}

// testMetadataServerSideApply checks that server-side apply keeps each field manager's ownership: conflicts, --force-conflicts and dropped fields.
func testMetadataServerSideApply(t *testing.T, env *metadataEnv) {
	s, tplGitOps, argoV1, argoV2, fluxCfg := env.s, env.tplGitOps, env.argoV1, env.argoV2, env.fluxCfg
	out := s.must(t, "apply", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV1))
	if want := "codertemplate.aggregation.coder.com/" + tplGitOps + " serverside-applied"; !strings.Contains(out, want) {
		t.Errorf("apply printed %q, want %q", out, want)
	}
	waitTemplateReady(t, s, tplGitOps)
	u := s.getObj(t, templatesGVR, tplGitOps)
	if got := u.GetAnnotations()["argocd.argoproj.io/tracking-id"]; got != "demo:aggregation.coder.com/CoderTemplate:"+s.ns+"/"+tplGitOps {
		t.Errorf("Argo CD's tracking annotation: %q", got)
	}
	wantLabels := map[string]string{"app.kubernetes.io/part-of": "gitops-demo", "kustomize.toolkit.fluxcd.io/name": "demo", aggv1.LabelOrganization: s.org, aggv1.LabelControlPlane: "coder", aggv1.LabelTemplate: "gitops"}
	if got := u.GetLabels(); !maps.Equal(got, wantLabels) {
		t.Errorf("labels %v, want %v", got, wantLabels)
	}
	argo := managerEntry(t, u, "argocd-controller", metav1.ManagedFieldsOperationApply)
	for _, path := range [][]string{
		{"f:metadata", "f:labels", "f:app.kubernetes.io/part-of"},
		{"f:metadata", "f:labels", "f:kustomize.toolkit.fluxcd.io/name"},
		{"f:metadata", "f:annotations", "f:argocd.argoproj.io/tracking-id"},
		{"f:spec", "f:displayName"}, {"f:spec", "f:description"}, {"f:spec", "f:files"},
	} {
		if !ownsField(argo, path...) {
			t.Errorf("argocd-controller does not own %v: %s", path, argo.FieldsV1.GetRawString())
		}
	}

	// A second manager setting the same field conflicts, naming the
	// owner and the field; nothing changes in Coder.
	out, err := s.run("apply", "--server-side", "--field-manager=flux", "-f", writeManifest(t, fluxCfg))
	if err == nil || !strings.Contains(out, `conflict with "argocd-controller"`) || !strings.Contains(out, ".spec.description") {
		t.Fatalf("a second manager's apply of spec.description: %v\n%s\nwant a conflict with argocd-controller on .spec.description", err, out)
	}
	if d := s.coderTemplate(t, "gitops").Description; d != "owned by argocd" {
		t.Errorf("after the refused apply coderd has description %q", d)
	}
	if _, ok := s.getObj(t, templatesGVR, tplGitOps).GetLabels()["example.com/flux-owned"]; ok {
		t.Errorf("the refused apply's label was kept")
	}

	// --force-conflicts takes the field over.
	s.must(t, "apply", "--server-side", "--field-manager=flux", "--force-conflicts", "-f", writeManifest(t, fluxCfg))
	if d := s.coderTemplate(t, "gitops").Description; d != "owned by flux" {
		t.Errorf("after --force-conflicts coderd has description %q, want %q", d, "owned by flux")
	}
	u = s.getObj(t, templatesGVR, tplGitOps)
	if got, _, _ := unstructured.NestedString(u.Object, "spec", "description"); got != "owned by flux" {
		t.Errorf("spec.description %q", got)
	}
	if got := u.GetLabels()["example.com/flux-owned"]; got != "true" {
		t.Errorf("flux's label: %q", got)
	}
	flux := managerEntry(t, u, "flux", metav1.ManagedFieldsOperationApply)
	argo = managerEntry(t, u, "argocd-controller", metav1.ManagedFieldsOperationApply)
	if !ownsField(flux, "f:spec", "f:description") || !ownsField(flux, "f:metadata", "f:labels", "f:example.com/flux-owned") {
		t.Errorf("flux's entry after --force-conflicts: %s", flux.FieldsV1.GetRawString())
	}
	if ownsField(argo, "f:spec", "f:description") {
		t.Errorf("argocd-controller still owns spec.description after flux forced it: %s", argo.FieldsV1.GetRawString())
	}

	// Fields dropped from an apply configuration are removed when no
	// other manager owns them; spec.description stays (flux owns it).
	s.must(t, "apply", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
	u = s.getObj(t, templatesGVR, tplGitOps)
	wantLabels = map[string]string{"kustomize.toolkit.fluxcd.io/name": "demo", "example.com/flux-owned": "true", aggv1.LabelOrganization: s.org, aggv1.LabelControlPlane: "coder", aggv1.LabelTemplate: "gitops"}
	if got := u.GetLabels(); !maps.Equal(got, wantLabels) {
		t.Errorf("labels after argocd-controller dropped app.kubernetes.io/part-of: %v, want %v", got, wantLabels)
	}
	if got := u.GetAnnotations()["argocd.argoproj.io/tracking-id"]; got == "" {
		t.Errorf("the tracking annotation argocd-controller still applies is gone")
	}
	if d := s.coderTemplate(t, "gitops").Description; d != "owned by flux" {
		t.Errorf("coderd description %q after argocd-controller dropped it (flux owns it), want %q", d, "owned by flux")
	}
	var names []string
	for _, e := range u.GetManagedFields() {
		names = append(names, e.Manager+"/"+string(e.Operation))
	}
	for _, want := range []string{"argocd-controller/Apply", "flux/Apply"} {
		if !slices.Contains(names, want) {
			t.Errorf("managedFields managers %v lack %s", names, want)
		}
	}
	// The managers' entries survive what the server itself changes.
	if g := u.GetGeneration(); g != 2 {
		t.Errorf("metadata.generation %d after the create and one spec change (description), want 2", g)
	}
}

// testMetadataDiff checks that kubectl diff --server-side shows drift, and no drift after re-applying.
func testMetadataDiff(t *testing.T, env *metadataEnv) {
	s, tplGitOps, argoV2 := env.s, env.tplGitOps, env.argoV2
	out, code := s.kubectlCode(t, "diff", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
	if code != 0 || out != "" {
		t.Fatalf("diff of the configuration just applied: exit %d\n%s\nwant exit 0 and no output", code, out)
	}
	// A label the configuration adds: the dry run must return it.
	withLabel := strings.Replace(argoV2, "    kustomize.toolkit.fluxcd.io/name: demo\n", "    kustomize.toolkit.fluxcd.io/name: demo\n    example.com/new: added\n", 1)
	out, code = s.kubectlCode(t, "diff", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, withLabel))
	if code != 1 || !hasDiffLine(out, "+", "example.com/new: added") {
		t.Errorf("diff of a configuration adding a label: exit %d\n%s\nwant exit 1 and the label added", code, out)
	}
	// A change made in Coder shows as drift, and re-applying heals it.
	s.coderCLI(t, "templates", "edit", "gitops", "--display-name", "Changed in Coder", "--yes")
	testenv.WaitFor(t, 30*time.Second, func() error {
		out, code = s.kubectlCode(t, "diff", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
		if code != 1 || !hasDiffLine(out, "-", "displayName: Changed in Coder") || !hasDiffLine(out, "+", "displayName: GitOps") {
			return errNotYet(fmt.Sprintf("diff after the change in Coder: exit %d\n%s", code, out))
		}
		return nil
	})
	s.must(t, "apply", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
	if got := s.coderTemplate(t, "gitops").DisplayName; got != "GitOps" {
		t.Errorf("re-applying did not set the display name back in coderd: %q", got)
	}
	out, code = s.kubectlCode(t, "diff", "--server-side", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
	if code != 0 || out != "" {
		t.Errorf("diff after re-applying: exit %d\n%s\nwant exit 0 and no output", code, out)
	}
	// Metadata changed by someone else shows as drift too.
	s.must(t, "annotate", "ctpl", tplGitOps, "-n", s.ns, "--overwrite", "argocd.argoproj.io/tracking-id=someone-else")
	out, code = s.kubectlCode(t, "diff", "--server-side", "--force-conflicts", "--field-manager=argocd-controller", "-f", writeManifest(t, argoV2))
	if code != 1 || !hasDiffLine(out, "-", "argocd.argoproj.io/tracking-id: someone-else") {
		t.Errorf("diff after kubectl annotate: exit %d\n%s\nwant exit 1 and the annotation's change", code, out)
	}
}

// testMetadataPrune checks that kubectl apply --prune -l deletes the object that left the set.
func testMetadataPrune(t *testing.T, env *metadataEnv) {
	ctx, s := context.Background(), env.s
	dir, err := os.MkdirTemp("", "prune-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	names := []string{s.workspaceName("ws-p1"), s.workspaceName("ws-p2")}
	for i, n := range names {
		m := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
  namespace: %s
  labels: {example.com/set: prune-demo}
spec: {templateName: base, running: false}
`, n, s.ns)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("ws-%d.yaml", i)), []byte(m), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	prune := []string{"apply", "-f", dir, "--prune", "-l", "example.com/set=prune-demo", "--prune-allowlist=aggregation.coder.com/v1alpha1/CoderWorkspace"}
	out := s.must(t, prune...)
	for _, n := range names {
		if want := "coderworkspace.aggregation.coder.com/" + n + " created"; !strings.Contains(out, want) {
			t.Errorf("apply --prune printed %q, want %q", out, want)
		}
		// coderd refuses a delete build while the builds of the
		// creation run.
		s.must(t, "wait", "--for=condition=Building=False", "cws/"+n, "-n", s.ns, "--timeout=90s")
		if a := s.getObj(t, workspacesGVR, n).GetAnnotations()[corev1.LastAppliedConfigAnnotation]; !strings.Contains(a, n) {
			t.Errorf("%s: kubectl's last-applied-configuration annotation is %q", n, a)
		}
	}
	// The same set again: nothing to do.
	out = s.must(t, prune...)
	for _, n := range names {
		if want := "coderworkspace.aggregation.coder.com/" + n + " unchanged"; !strings.Contains(out, want) {
			t.Errorf("second apply --prune printed %q, want %q", out, want)
		}
	}
	if err := os.Remove(filepath.Join(dir, "ws-1.yaml")); err != nil {
		t.Fatal(err)
	}
	out = s.must(t, prune...)
	if want := "coderworkspace.aggregation.coder.com/" + names[1] + " pruned"; !strings.Contains(out, want) {
		t.Errorf("apply --prune without %s printed %q, want %q", names[1], out, want)
	}
	if want := "coderworkspace.aggregation.coder.com/" + names[0] + " unchanged"; !strings.Contains(out, want) {
		t.Errorf("apply --prune printed %q, want %q", out, want)
	}
	s.must(t, "wait", "--for=delete", "cws/"+names[1], "-n", s.ns, "--timeout=90s")
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-p2", codersdk.WorkspaceOptions{}); err == nil {
		t.Errorf("coderd still has the pruned workspace ws-p2")
	}
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-p1", codersdk.WorkspaceOptions{}); err != nil {
		t.Errorf("coderd lost ws-p1, still in the set: %v", err)
	}
}

// testMetadataGeneration checks that metadata.generation counts spec changes and conditions carry observedGeneration.
func testMetadataGeneration(t *testing.T, env *metadataEnv) {
	s := env.s
	name := s.workspaceName("ws-gen")
	s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: %s}
spec: {templateName: base, running: false}
`, name, s.ns)))
	s.must(t, "wait", "--for=jsonpath={.status.phase}=stopped", "cws/"+name, "-n", s.ns, "--timeout=90s")
	gen := func(want int64, what string) {
		t.Helper()
		u := s.getObj(t, workspacesGVR, name)
		if g := u.GetGeneration(); g != want {
			t.Errorf("metadata.generation after %s: %d, want %d", what, g, want)
		}
		checkObservedGeneration(t, u, want)
	}
	gen(1, "the create")
	s.must(t, "label", "cws", name, "-n", s.ns, "example.com/x=1")
	s.must(t, "annotate", "cws", name, "-n", s.ns, "example.com/y=2")
	gen(1, "a label and an annotation")
	s.must(t, "patch", "cws", name, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"ttlMillis":3600000}}`)
	gen(2, "a spec change (ttlMillis)")
	s.must(t, "patch", "cws", name, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"ttlMillis":3600000}}`)
	gen(2, "a patch that changes nothing")
	// kubectl wait sees the current generation's Ready condition.
	s.must(t, "patch", "cws", name, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":true}}`)
	s.must(t, "wait", "--for=condition=Ready", "cws/"+name, "-n", s.ns, "--timeout=90s")
	gen(3, "a spec change (running)")
	// A spec change made in Coder counts too.
	s.coderCLI(t, "schedule", "stop", s.coder.Username+"/ws-gen", "2h")
	testenv.WaitFor(t, 30*time.Second, func() error {
		u := s.getObj(t, workspacesGVR, name)
		if ttl, _, _ := unstructured.NestedInt64(u.Object, "spec", "ttlMillis"); ttl != int64(2*time.Hour/time.Millisecond) {
			return errNotYet(fmt.Sprintf("spec.ttlMillis %d", ttl))
		}
		if g := u.GetGeneration(); g != 4 {
			return errNotYet(fmt.Sprintf("metadata.generation %d after a TTL change made in Coder, want 4", g))
		}
		return nil
	})
	gen(4, "a spec change made in Coder")
}

// testMetadataFinalizer checks that a user finalizer holds a delete until it is removed.
func testMetadataFinalizer(t *testing.T, env *metadataEnv) {
	ctx, s := context.Background(), env.s
	name := s.workspaceName("ws-fin")
	s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
  namespace: %s
  finalizers: [example.com/hold]
spec: {templateName: base, running: false}
`, name, s.ns)))
	s.must(t, "wait", "--for=condition=Building=False", "cws/"+name, "-n", s.ns, "--timeout=90s")
	if f := s.getObj(t, workspacesGVR, name).GetFinalizers(); !slices.Equal(f, []string{"example.com/hold"}) {
		t.Fatalf("finalizers %v, want [example.com/hold]", f)
	}
	before := s.coderWorkspace(t, "ws-fin")
	out := s.must(t, "delete", "cws", name, "-n", s.ns, "--wait=false")
	if want := `coderworkspace.aggregation.coder.com "` + name + `" deleted`; !strings.Contains(out, want) {
		t.Errorf("delete printed %q, want %q", out, want)
	}
	// Held: the object shows the deletion, Coder is untouched, for
	// several poll intervals.
	time.Sleep(3 * pollInterval)
	u := s.getObj(t, workspacesGVR, name)
	if u.GetDeletionTimestamp() == nil {
		t.Errorf("no deletionTimestamp after the delete")
	}
	if f := u.GetFinalizers(); !slices.Equal(f, []string{"example.com/hold"}) {
		t.Errorf("finalizers while held: %v, want [example.com/hold]", f)
	}
	after := s.coderWorkspace(t, "ws-fin")
	if after.LatestBuild.ID != before.LatestBuild.ID || after.LatestBuild.Transition == codersdk.WorkspaceTransitionDelete {
		t.Errorf("coderd started build %d (%s) although a finalizer holds the delete", after.LatestBuild.BuildNumber, after.LatestBuild.Transition)
	}
	out, err := s.run("label", "cws", name, "-n", s.ns, "example.com/while-deleting=yes")
	if err != nil {
		t.Errorf("a label change while the delete is held: %v\n%s", err, out)
	}

	s.must(t, "patch", "cws", name, "-n", s.ns, "--type", "json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
	s.must(t, "wait", "--for=delete", "cws/"+name, "-n", s.ns, "--timeout=90s")
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-fin", codersdk.WorkspaceOptions{}); err == nil {
		t.Errorf("coderd still has ws-fin after its last finalizer was removed and the object disappeared")
	}
}

// testMetadataDerivedLabels checks that derived labels cannot be overridden, and that their own value is accepted but not stored.
func testMetadataDerivedLabels(t *testing.T, env *metadataEnv) {
	ctx, s, wsMeta, recordKey, tplBase := context.Background(), env.s, env.wsMeta, env.recordKey, env.tplBase
	for _, c := range []struct {
		kind, name, key, bad, good string
	}{
		{"cws", wsMeta, aggv1.LabelOwner, "mallory", s.coder.Username},
		{"cws", wsMeta, aggv1.LabelTemplate, "other", "base"},
		{"ctpl", tplBase, aggv1.LabelOrganization, "other", s.org},
	} {
		out, err := s.run("label", c.kind, c.name, "-n", s.ns, "--overwrite", c.key+"="+c.bad)
		if err == nil || !strings.Contains(out, "is invalid: metadata.labels["+c.key+"]") {
			t.Errorf("kubectl label %s %s=%s: %v\n%s\nwant 422 Invalid naming metadata.labels[%s]", c.name, c.key, c.bad, err, out, c.key)
		}
		if !strings.Contains(out, "Invalid value") {
			t.Errorf("kubectl label %s %s=%s: %s\nwant Invalid value", c.name, c.key, c.bad, out)
		}
		gvr := workspacesGVR
		if c.kind == "ctpl" {
			gvr = templatesGVR
		}
		if got := s.getObj(t, gvr, c.name).GetLabels()[c.key]; got != c.good {
			t.Errorf("%s label %s is %q after the refused write, want %q", c.name, c.key, got, c.good)
		}
	}
	// The derived value itself is accepted (and stays derived).
	s.must(t, "apply", "--server-side", "--field-manager=same-value", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
  namespace: %s
  labels: {%s: %s}
`, wsMeta, s.ns, aggv1.LabelOwner, s.coder.Username)))
	var rec coderv1alpha1.CoderObjectRecord
	if err := s.c.Get(ctx, recordKey.NamespacedName(), &rec); err != nil {
		t.Fatal(err)
	}
	if _, ok := rec.Spec.Labels[aggv1.LabelOwner]; ok {
		t.Errorf("an apply of the derived label's own value stored it in the record: %v", rec.Spec.Labels)
	}
}

// testMetadataDryRun checks that --dry-run=server returns what the write then returns, and writes nothing.
func testMetadataDryRun(t *testing.T, env *metadataEnv) {
	ctx, s, wsMeta, tplBase, baseTpl := context.Background(), env.s, env.wsMeta, env.tplBase, env.baseTpl
	// A metadata-only update (kubectl label).
	dry := s.kubectlJSON(t, "label", "cws", wsMeta, "-n", s.ns, "example.com/dry=run", "--dry-run=server", "-o", "json")
	if _, ok := s.getObj(t, workspacesGVR, wsMeta).GetLabels()["example.com/dry"]; ok {
		t.Fatalf("kubectl label --dry-run=server stored the label")
	}
	real := s.kubectlJSON(t, "label", "cws", wsMeta, "-n", s.ns, "example.com/dry=run", "-o", "json")
	if real.GetLabels()["example.com/dry"] != "run" {
		t.Fatalf("kubectl label -o json: labels %v", real.GetLabels())
	}
	compareDryRun(t, "kubectl label", "kubectl-label", dry, real, false)

	// A server-side apply of labels and annotations on a template.
	cfg := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: %s
  namespace: %s
  labels: {example.com/dry: run}
  annotations: {example.com/applied: "yes"}
`, tplBase, s.ns)
	dry = s.kubectlJSON(t, "apply", "--server-side", "--field-manager=dry-runner", "--dry-run=server", "-o", "json", "-f", writeManifest(t, cfg))
	if _, ok := s.getObj(t, templatesGVR, tplBase).GetAnnotations()["example.com/applied"]; ok {
		t.Fatalf("apply --dry-run=server stored the annotation")
	}
	real = s.kubectlJSON(t, "apply", "--server-side", "--field-manager=dry-runner", "-o", "json", "-f", writeManifest(t, cfg))
	compareDryRun(t, "kubectl apply --server-side", "dry-runner", dry, real, false)
	if tpl := s.coderTemplate(t, "base"); tpl.ActiveVersionID != baseTpl.ActiveVersionID {
		t.Errorf("a metadata-only apply made a new template version")
	}

	// A create: Coder assigns the UID (its ID), the creation time and
	// the status, so only the rest can be compared.
	name := s.workspaceName("ws-dry")
	ws := fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
  namespace: %s
  labels: {example.com/dry: run}
  annotations: {example.com/created: "yes"}
  finalizers: [example.com/hold]
spec: {templateName: base, running: false}
`, name, s.ns)
	dry = s.kubectlJSON(t, "apply", "--server-side", "--field-manager=dry-runner", "--dry-run=server", "-o", "json", "-f", writeManifest(t, ws))
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-dry", codersdk.WorkspaceOptions{}); err == nil {
		t.Fatalf("a dry-run create made a workspace in coderd")
	}
	if _, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after a dry-run create, GET %s: %v, want NotFound", name, err)
	}
	real = s.kubectlJSON(t, "apply", "--server-side", "--field-manager=dry-runner", "-o", "json", "-f", writeManifest(t, ws))
	compareDryRun(t, "create with kubectl apply --server-side", "dry-runner", dry, real, true)
	// Let it go for good.
	s.must(t, "wait", "--for=condition=Building=False", "cws/"+name, "-n", s.ns, "--timeout=90s")
	s.must(t, "patch", "cws", name, "-n", s.ns, "--type", "json", "-p", `[{"op":"remove","path":"/metadata/finalizers"}]`)
	s.must(t, "delete", "cws", name, "-n", s.ns, "--timeout=90s")
}

// testMetadataRecordDeleted checks that the CoderObjectRecord goes when its workspace is deleted in Coder.
func testMetadataRecordDeleted(t *testing.T, env *metadataEnv) {
	ctx, s := context.Background(), env.s
	ws := s.coderWorkspace(t, "ws-p1")
	key := records.Key{Namespace: s.ns, Resource: "coderworkspaces", ControlPlane: "coder", CoderID: ws.ID.String()}
	var rec coderv1alpha1.CoderObjectRecord
	if err := s.c.Get(ctx, key.NamespacedName(), &rec); err != nil {
		t.Fatalf("ws-p1, applied with a label, has no CoderObjectRecord %s: %v", key.NamespacedName(), err)
	}
	if rec.Spec.Labels["example.com/set"] != "prune-demo" {
		t.Errorf("record %s labels %v", key.NamespacedName(), rec.Spec.Labels)
	}
	// In a cluster a watch on coderworkspaces is always open (the
	// garbage collector's, Argo CD's): the poller's full lists then
	// find what Coder no longer has.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.dyn.Resource(workspacesGVR).Watch(wctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for range w.ResultChan() {
		}
	}()
	s.coderCLI(t, "delete", s.coder.Username+"/ws-p1", "--yes")
	testenv.WaitFor(t, 90*time.Second, func() error {
		err := s.c.Get(ctx, key.NamespacedName(), &rec)
		if !apierrors.IsNotFound(err) {
			return errNotYet(fmt.Sprintf("record %s after coder delete: %v", key.NamespacedName(), err))
		}
		return nil
	})
	if _, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, s.workspaceName("ws-p1"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("GET ws-p1 after Coder deleted it and its record went: %v, want NotFound", err)
	}
}

// testMetadataRestart checks that metadata survives an operator restart.
func testMetadataRestart(t *testing.T, env *metadataEnv) {
	s, wsMeta, tplGitOps := env.s, env.wsMeta, env.tplGitOps
	s.op.Stop(30 * time.Second)
	s.op = s.startOperator(t, OperatorOptions{})
	s.routeAPIService(t, s.op)
	testenv.WaitFor(t, 60*time.Second, func() error {
		out, err := s.run("get", "cws", "-n", s.ns, "-o", "name", "-l", "example.com/team=old")
		if err != nil {
			return err
		}
		if want := "coderworkspace.aggregation.coder.com/" + wsMeta + "\n"; out != want {
			return errNotYet(fmt.Sprintf("-l example.com/team=old after the restart: %q, want %q", out, want))
		}
		return nil
	})
	u := s.getObj(t, templatesGVR, tplGitOps)
	if got := u.GetAnnotations()["argocd.argoproj.io/tracking-id"]; got != "someone-else" {
		t.Errorf("tracking annotation after the restart: %q", got)
	}
	managerEntry(t, u, "argocd-controller", metav1.ManagedFieldsOperationApply)
	managerEntry(t, u, "flux", metav1.ManagedFieldsOperationApply)
	// The create, flux's description, the display name changed in
	// Coder and argocd-controller's apply setting it back.
	if g := u.GetGeneration(); g != 4 {
		t.Errorf("metadata.generation after the restart: %d, want 4", g)
	}
}

// getObj GETs a namespaced aggregated object of the stack's namespace
// through kube-apiserver.
func (s *aggStack) getObj(t *testing.T, gvr schema.GroupVersionResource, name string) *unstructured.Unstructured {
	t.Helper()
	u, err := s.dyn.Resource(gvr).Namespace(s.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s %s: %v\noperator log:\n%s", gvr.Resource, name, err, s.op.LogTail(20))
	}
	return u
}

// kubectlCode runs kubectl and returns its combined output and exit code
// (for commands whose exit code means something, like kubectl diff).
func (s *aggStack) kubectlCode(t *testing.T, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r, err := s.k.Kubectl(s.kubectl).Run(ctx, "", args...)
	if err != nil && r.ExitCode < 0 {
		t.Fatal(err)
	}
	return r.Combined, r.ExitCode
}

// kubectlJSON runs kubectl with JSON output and parses its stdout.
func (s *aggStack) kubectlJSON(t *testing.T, args ...string) *unstructured.Unstructured {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// kubectl leaves managedFields out of its output unless asked.
	args = append(args, "--show-managed-fields")
	r, err := s.k.Kubectl(s.kubectl).Run(ctx, "", args...)
	if err != nil {
		t.Fatalf("%v\noperator log:\n%s", err, s.op.LogTail(20))
	}
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(r.Stdout), &u.Object); err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, r.Stdout)
	}
	return u
}

// compareDryRun fails unless the dry run's object equals the real write's,
// apart from what cannot be equal: the resourceVersion (a dry run makes no
// new version; kube-apiserver's own dry-run updates return the current
// one) and the managedFields timestamps (the requests ran at different
// times). For a create also the UID (Coder's ID for the object), the
// creation time (Coder's) and the status (Coder's build of it): a dry run
// creates nothing in Coder.
func compareDryRun(t *testing.T, what, manager string, dry, real *unstructured.Unstructured, create bool) {
	t.Helper()
	norm := func(u *unstructured.Unstructured) map[string]any {
		c := u.DeepCopy()
		c.SetResourceVersion("")
		mf := c.GetManagedFields()
		for i := range mf {
			mf[i].Time = nil
		}
		c.SetManagedFields(mf)
		if create {
			c.SetUID("")
			c.SetCreationTimestamp(metav1.Time{})
			delete(c.Object, "status")
		}
		return c.Object
	}
	if !slices.ContainsFunc(real.GetManagedFields(), func(e metav1.ManagedFieldsEntry) bool { return e.Manager == manager }) {
		t.Errorf("%s: the write returned managedFields %s, want an entry of %s", what, mustJSON(real.GetManagedFields()), manager)
	}
	d, r := mustJSON(norm(dry)), mustJSON(norm(real))
	if d != r {
		t.Errorf("%s: the dry run returned\n%s\nthe write returned\n%s", what, d, r)
	}
}

// checkObservedGeneration fails unless status.observedGeneration and every
// condition's observedGeneration are want.
func checkObservedGeneration(t *testing.T, u *unstructured.Unstructured, want int64) {
	t.Helper()
	if g, found, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); !found || g != want {
		t.Errorf("%s: status.observedGeneration %d (set: %v), want %d", u.GetName(), g, found, want)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	if len(conds) == 0 {
		t.Errorf("%s: no conditions", u.GetName())
	}
	for _, c := range conds {
		m, _ := c.(map[string]any)
		g, found, _ := unstructured.NestedInt64(m, "observedGeneration")
		if !found || g != want {
			t.Errorf("%s: condition %v observedGeneration %d (set: %v), want %d", u.GetName(), m["type"], g, found, want)
		}
	}
}

// waitTemplateReady waits until a template's Ready condition is True.
func waitTemplateReady(t *testing.T, s *aggStack, name string) {
	t.Helper()
	s.must(t, "wait", "--for=condition=Ready", "ctpl/"+name, "-n", s.ns, "--timeout=120s")
}

// waitWatchEvent returns the first event from w that match accepts.
func waitWatchEvent(t *testing.T, w watch.Interface, timeout time.Duration, match func(watch.Event) bool) watch.Event {
	t.Helper()
	deadline := time.After(timeout)
	var seen []string
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended; events seen: %v", seen)
			}
			if match(ev) {
				return ev
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				seen = append(seen, fmt.Sprintf("%s %s rv=%s labels=%v", ev.Type, u.GetName(), u.GetResourceVersion(), u.GetLabels()))
			} else {
				seen = append(seen, fmt.Sprintf("%s %T", ev.Type, ev.Object))
			}
		case <-deadline:
			t.Fatalf("no matching watch event within %s; events seen: %v", timeout, seen)
		}
	}
}

// managerEntry is the managedFields entry of manager with operation op.
func managerEntry(t *testing.T, u *unstructured.Unstructured, manager string, op metav1.ManagedFieldsOperationType) metav1.ManagedFieldsEntry {
	t.Helper()
	for _, e := range u.GetManagedFields() {
		if e.Manager == manager && e.Operation == op {
			return e
		}
	}
	t.Fatalf("%s: no managedFields entry of %s (%s): %s", u.GetName(), manager, op, mustJSON(u.GetManagedFields()))
	return metav1.ManagedFieldsEntry{}
}

// ownsField reports whether a managedFields entry's fieldsV1 holds path.
func ownsField(e metav1.ManagedFieldsEntry, path ...string) bool {
	if e.FieldsV1 == nil {
		return false
	}
	var m map[string]any
	if err := json.Unmarshal(e.FieldsV1.GetRawBytes(), &m); err != nil {
		return false
	}
	for _, p := range path {
		next, ok := m[p].(map[string]any)
		if !ok {
			return false
		}
		m = next
	}
	return true
}

// hasDiffLine reports whether a unified diff has a line starting with sign
// ("+" or "-") whose rest, trimmed, is text.
func hasDiffLine(diff, sign, text string) bool {
	for _, l := range strings.Split(diff, "\n") {
		if rest, ok := strings.CutPrefix(l, sign); ok && !strings.HasPrefix(l, sign+sign) && strings.TrimSpace(rest) == text {
			return true
		}
	}
	return false
}

func ownerRefsEqual(a, b []metav1.OwnerReference) bool {
	return mustJSON(a) == mustJSON(b)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(b)
}
