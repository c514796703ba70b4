package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/tools/cache"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/testenv"
)

// mainTF is a provider-free template: it builds offline in about a second.
const mainTF = `variable "greeting" {
  default = "hello"
}

output "greeting" {
  value = var.greeting
}
`

// TestAggregatedAPI drives aggregation.coder.com through kube-apiserver's
// aggregation layer with kubectl, client-go and informers, against a real
// coderd, and checks every change in coderd itself.
func TestAggregatedAPI(t *testing.T) {
	t.Parallel()
	env := newAggregatedEnv(t)
	runSubtests(t, env, []subtest[*aggregatedEnv]{
		{"discovery, short names, category and explain", testAggregatedDiscovery},
		{"template: server-side apply with files builds in the background, promotes and is idempotent", testAggregatedTemplateApply},
		{"template: bad files are refused naming the file, and a failed build shows Coder's error", testAggregatedTemplateBadFiles},
		{"workspace: created stopped, started with kubectl patch, waited for", testAggregatedWorkspaceStart},
		{"kubectl get -w shows a stop made with the coder CLI", testAggregatedWatchCoderStop},
		{"informers sync and see changes, with and without watch-list", testAggregatedInformers},
		{"stale resourceVersion is a conflict", testAggregatedStaleConflict},
		{"dry run makes no change in Coder", testAggregatedDryRun},
		{"label and field selectors", testAggregatedSelectors},
		{"watch from a too old resourceVersion is 410 Gone", testAggregatedWatchGone},
		{"errors carry Kubernetes statuses", testAggregatedErrors},
		{"delete starts a delete build; the object stays until coderd removes it", testAggregatedDelete},
		{"RBAC applies through kube-apiserver; anonymous calls are refused", testAggregatedRBAC},
		{"several control planes in one namespace get prefixed names", testAggregatedControlPlanes},
		{"deleting a namespace never deletes Coder workspaces or templates", testAggregatedNamespaceDelete},
	})
}

// aggregatedEnv is what TestAggregatedAPI's subtests share: the stack,
// with template base in Coder, and the object names of workspaces ws-a and
// ws-b, which subtests create and later ones use.
type aggregatedEnv struct {
	s        *aggStack
	wsA, wsB string
}

// newAggregatedEnv builds the stack and pushes template base to Coder.
func newAggregatedEnv(t *testing.T) *aggregatedEnv {
	s := newStack(t)
	ctx := context.Background()
	if _, err := s.coder.PushTemplate(ctx, "base", testenv.ProviderFreeTemplate()); err != nil {
		t.Fatal(err)
	}
	wsA := s.workspaceName("ws-a")
	wsB := s.workspaceName("ws-b")
	return &aggregatedEnv{s: s, wsA: wsA, wsB: wsB}
}

// testAggregatedDiscovery checks discovery, the short names, the category and kubectl explain.
func testAggregatedDiscovery(t *testing.T, env *aggregatedEnv) {
	s := env.s
	out := s.must(t, "api-resources", "--api-group", aggv1.GroupName, "-o", "wide")
	for _, want := range []string{"coderworkspaces", "cws", "codertemplates", "ctpl", "coder", "watch"} {
		if !strings.Contains(out, want) {
			t.Errorf("api-resources lacks %q:\n%s", want, out)
		}
	}
	out = s.must(t, "explain", "codertemplate.spec.files")
	if !strings.Contains(out, "template source") {
		t.Errorf("explain codertemplate.spec.files:\n%s", out)
	}
	out = s.must(t, "explain", "coderworkspace.spec")
	for _, want := range []string{"running", "templateName", "ttlMillis", "parameters"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain coderworkspace.spec lacks %q:\n%s", want, out)
		}
	}
	out = s.must(t, "get", "coder", "-n", s.ns)
	if !strings.Contains(out, "coder.base") {
		t.Errorf("kubectl get coder (the category) does not list template coder.base:\n%s", out)
	}
}

// testAggregatedTemplateApply checks that a template applied server-side with files builds in the background, is promoted and is idempotent.
func testAggregatedTemplateApply(t *testing.T, env *aggregatedEnv) {
	ctx, s := context.Background(), env.s
	apply := func(tf string) (string, error) {
		return s.run("apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: coder.demo
  namespace: coder
spec:
  displayName: Demo
  description: made with kubectl
  files:
    main.tf: |
%s`, indent(tf, 6))))
	}
	if out, err := apply(mainTF); err != nil {
		t.Fatalf("%v\noperator log:\n%s", err, s.op.LogTail(30))
	} else if !strings.Contains(out, "serverside-applied") {
		t.Errorf("apply output: %s", out)
	}
	s.must(t, "wait", "--for=condition=Ready", "ctpl/coder.demo", "-n", s.ns, "--timeout=3m")
	tpl, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "demo")
	if err != nil {
		t.Fatalf("coderd has no template demo: %v", err)
	}
	if tpl.DisplayName != "Demo" || tpl.Description != "made with kubectl" {
		t.Errorf("coderd template: display %q description %q", tpl.DisplayName, tpl.Description)
	}
	v, err := s.coder.Client.TemplateVersion(ctx, tpl.ActiveVersionID)
	if err != nil || v.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Fatalf("active version %s: %v %s", tpl.ActiveVersionID, err, v.Job.Status)
	}
	if got := s.must(t, "get", "ctpl", "coder.demo", "-n", s.ns, "-o", "jsonpath={.status.buildStatus} {.status.activeVersionID}"); got != "succeeded "+tpl.ActiveVersionID.String() {
		t.Errorf("status: %q, coderd active version %s", got, tpl.ActiveVersionID)
	}

	// The same manifest again changes nothing in coderd.
	if _, err := apply(mainTF); err != nil {
		t.Fatal(err)
	}
	again := s.coderTemplate(t, "demo")
	if again.ActiveVersionID != tpl.ActiveVersionID {
		t.Errorf("re-applying the same files made a new version: %s → %s", tpl.ActiveVersionID, again.ActiveVersionID)
	}

	// Changed files: a new version, built and promoted in the
	// background; kubectl wait sees it Ready once it is active.
	if _, err := apply(mainTF + "\noutput \"extra\" {\n  value = 1\n}\n"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 3*time.Minute, func() error {
		if s.coderTemplate(t, "demo").ActiveVersionID == tpl.ActiveVersionID {
			return errNotYet("changing spec.files has not promoted a new version yet")
		}
		return nil
	})
	s.must(t, "wait", "--for=condition=Ready", "ctpl/coder.demo", "-n", s.ns, "--timeout=1m")
	files := s.must(t, "get", "ctpl", "coder.demo", "-n", s.ns, "-o", "jsonpath={.spec.files.main\\.tf}")
	if !strings.Contains(files, `output "extra"`) {
		t.Errorf("spec.files does not show the new source:\n%s", files)
	}

	out := s.must(t, "get", "ctpl", "-n", s.ns, "-o", "wide")
	for _, col := range []string{"NAME", "ORGANIZATION", "ACTIVE VERSION", "BUILD STATUS", "AGE", "DISPLAY NAME", "FILES"} {
		if !strings.Contains(out, col) {
			t.Errorf("kubectl get ctpl -o wide lacks column %s:\n%s", col, out)
		}
	}
}

// testAggregatedTemplateBadFiles checks that bad files are refused naming the file, and that a failed build shows Coder's error.
func testAggregatedTemplateBadFiles(t *testing.T, env *aggregatedEnv) {
	s := env.s
	out, err := s.run("apply", "--server-side", "-f", writeManifest(t, `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: coder.evil, namespace: coder}
spec:
  files:
    ../evil.tf: "x"
`))
	if err == nil || !strings.Contains(out, "spec.files[../evil.tf]") {
		t.Errorf("a traversal path was not refused naming the file: %v\n%s", err, out)
	}
	out, err = s.run("apply", "--server-side", "-f", writeManifest(t, `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata: {name: coder.broken, namespace: coder}
spec:
  files:
    main.tf: "this is not terraform {"
`))
	if err != nil {
		t.Fatalf("the create waited for the build or was refused: %v\n%s", err, out)
	}
	// It builds in the background and fails: Ready=False BuildFailed
	// with Coder's error.
	s.must(t, "wait", "--for=jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}=BuildFailed", "ctpl/coder.broken", "-n", s.ns, "--timeout=3m")
	msg := s.must(t, "get", "ctpl", "coder.broken", "-n", s.ns, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].message}")
	if !strings.Contains(msg, "did not build") {
		t.Errorf("the BuildFailed message does not say the version did not build: %q", msg)
	}
	s.must(t, "delete", "ctpl", "coder.broken", "-n", s.ns)
}

// testAggregatedWorkspaceStart checks that a workspace is created stopped, started with kubectl patch and waited for.
func testAggregatedWorkspaceStart(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: coder}
spec:
  templateName: base
  running: false
`, wsA)))
	w, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-a", codersdk.WorkspaceOptions{})
	if err != nil {
		t.Fatalf("coderd has no workspace ws-a: %v", err)
	}
	if w.LatestBuild.Transition != codersdk.WorkspaceTransitionStop {
		t.Errorf("latest build of a workspace created with running: false is %s", w.LatestBuild.Transition)
	}
	s.must(t, "wait", "--for=jsonpath={.status.phase}=stopped", "cws/"+wsA, "-n", s.ns, "--timeout=90s")
	// coderd queues a start build with every new workspace; it must
	// never have succeeded.
	builds, err := s.coder.Client.WorkspaceBuilds(ctx, codersdk.WorkspaceBuildsRequest{WorkspaceID: w.ID})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range builds {
		if b.Transition == codersdk.WorkspaceTransitionStart && b.Job.Status == codersdk.ProvisionerJobSucceeded {
			t.Errorf("build %d started the workspace created with running: false", b.BuildNumber)
		}
	}

	s.must(t, "patch", "cws", wsA, "-n", s.ns, "--type", "merge", "-p", `{"spec":{"running":true}}`)
	s.must(t, "wait", "--for=condition=Ready", "cws/"+wsA, "-n", s.ns, "--timeout=90s")
	w = s.coderWorkspace(t, "ws-a")
	if w.LatestBuild.Transition != codersdk.WorkspaceTransitionStart || w.LatestBuild.Job.Status != codersdk.ProvisionerJobSucceeded {
		t.Errorf("coderd: latest build %s %s", w.LatestBuild.Transition, w.LatestBuild.Job.Status)
	}

	s.must(t, "patch", "cws", wsA, "-n", s.ns, "--type", "json", "-p", `[{"op":"add","path":"/spec/ttlMillis","value":3600000}]`)
	s.must(t, "patch", "cws", wsA, "-n", s.ns, "--type", "strategic", "-p", `{"spec":{"autostartSchedule":"CRON_TZ=UTC 30 9 * * 1-5"}}`)
	w = s.coderWorkspace(t, "ws-a")
	if w.TTLMillis == nil || *w.TTLMillis != 3600000 {
		t.Errorf("JSON patch of spec.ttlMillis: coderd has %v", w.TTLMillis)
	}
	if w.AutostartSchedule == nil || *w.AutostartSchedule != "CRON_TZ=UTC 30 9 * * 1-5" {
		t.Errorf("strategic merge patch of spec.autostartSchedule: coderd has %v", w.AutostartSchedule)
	}

	out := s.must(t, "get", "cws", "-n", s.ns, "-o", "wide")
	for _, col := range []string{"NAME", "OWNER", "TEMPLATE", "STATUS", "RUNNING", "LAST BUILT", "AGE", "ORGANIZATION", "VERSION"} {
		if !strings.Contains(out, col) {
			t.Errorf("kubectl get cws -o wide lacks column %s:\n%s", col, out)
		}
	}
	if !strings.Contains(out, wsA) || !strings.Contains(out, "running") {
		t.Errorf("kubectl get cws -o wide:\n%s", out)
	}
}

// testAggregatedWatchCoderStop checks that kubectl get -w shows a stop made with the coder CLI.
func testAggregatedWatchCoderStop(t *testing.T, env *aggregatedEnv) {
	s, wsA := env.s, env.wsA
	w := s.startKubectl(t, "get", "cws", "-n", s.ns, "-w", "--output-watch-events")
	w.waitLine(t, 30*time.Second, "ADDED", wsA)
	start := time.Now()
	s.coderCLI(t, "stop", s.coder.Username+"/ws-a", "--yes")
	line := w.waitLine(t, 30*time.Second, "MODIFIED", wsA, "stopped")
	t.Logf("watch event %q %s after coder stop returned", line, time.Since(start).Round(time.Millisecond))
}

// testAggregatedInformers checks that informers sync and see changes, with and without watch-list.
func testAggregatedInformers(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	for _, watchList := range []bool{true, false} {
		t.Run(fmt.Sprintf("WatchListClient=%v", watchList), func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, watchList)
			dyn, err := dynamic.NewForConfig(s.k.Config)
			if err != nil {
				t.Fatal(err)
			}
			f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, s.ns, nil)
			inf := f.ForResource(workspacesGVR).Informer()
			phases := make(chan string, 100)
			if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				UpdateFunc: func(_, obj any) {
					u := obj.(*unstructured.Unstructured)
					if u.GetName() == wsA {
						p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
						phases <- p
					}
				},
			}); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			defer close(stop)
			f.Start(stop)
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
				t.Fatalf("informer did not sync\noperator log:\n%s", s.op.LogTail(30))
			}
			if _, ok, _ := inf.GetStore().GetByKey(s.ns + "/" + wsA); !ok {
				t.Fatalf("informer store lacks %s", wsA)
			}
			transition := "start"
			want := "running"
			w := s.coderWorkspace(t, "ws-a")
			if w.LatestBuild.Transition == codersdk.WorkspaceTransitionStart {
				transition, want = "stop", "stopped"
			}
			s.coderCLI(t, transition, s.coder.Username+"/ws-a", "--yes")
			timeout := time.After(30 * time.Second)
			for {
				select {
				case p := <-phases:
					if p == want {
						return
					}
				case <-timeout:
					t.Fatalf("informer saw no update to %s after coder %s", want, transition)
				}
			}
		})
	}
}

// testAggregatedStaleConflict checks that an update with a stale resourceVersion is a conflict.
func testAggregatedStaleConflict(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	var old aggv1.CoderWorkspace
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: wsA}, &old); err != nil {
		t.Fatal(err)
	}
	w := s.coderWorkspace(t, "ws-a")
	ttl := int64(7200000)
	if err := s.coder.Client.UpdateWorkspaceTTL(ctx, w.ID, codersdk.UpdateWorkspaceTTLRequest{TTLMillis: &ttl}); err != nil {
		t.Fatal(err)
	}
	if got := s.coderWorkspace(t, "ws-a").TTLMillis; got == nil || *got != ttl {
		t.Fatalf("coderd has TTL %v ms after UpdateWorkspaceTTL, want %d", ptrString(got), ttl)
	}
	stale := old.DeepCopy()
	other := int64(1800000)
	stale.Spec.TTLMillis = &other
	if err := s.c.Update(ctx, stale); !apierrors.IsConflict(err) {
		t.Fatalf("update with a stale resourceVersion: %v, want 409 Conflict", err)
	}
	if got := s.coderWorkspace(t, "ws-a").TTLMillis; got == nil || *got != ttl {
		t.Fatalf("after the refused stale update coderd has TTL %v ms, want %d", ptrString(got), ttl)
	}
	var fresh aggv1.CoderWorkspace
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: s.ns, Name: wsA}, &fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Spec.TTLMillis == nil || *fresh.Spec.TTLMillis != ttl {
		t.Fatalf("fresh object ttl %v, coderd has %d", fresh.Spec.TTLMillis, ttl)
	}
	fresh.Spec.TTLMillis = &other
	if err := s.c.Update(ctx, &fresh); err != nil {
		t.Fatalf("update with the current resourceVersion: %v", err)
	}
	// The update reached coderd, and the stale one before it did not.
	if got := s.coderWorkspace(t, "ws-a").TTLMillis; got == nil || *got != other {
		t.Errorf("after the update with the current resourceVersion coderd has TTL %v ms, want %d", ptrString(got), other)
	}
}

// testAggregatedDryRun checks that a dry run makes no change in Coder.
func testAggregatedDryRun(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	s.must(t, "apply", "--server-side", "--dry-run=server", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: coder}
spec: {templateName: base, running: true}
`, s.workspaceName("ws-dry"))))
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-dry", codersdk.WorkspaceOptions{}); err == nil {
		t.Errorf("a dry-run create made a workspace in coderd")
	}
	before := s.coderWorkspace(t, "ws-a")
	s.must(t, "delete", "cws", wsA, "-n", s.ns, "--dry-run=server")
	s.must(t, "patch", "cws", wsA, "-n", s.ns, "--dry-run=server", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"running":%v}}`, before.LatestBuild.Transition != codersdk.WorkspaceTransitionStart))
	after := s.coderWorkspace(t, "ws-a")
	if after.LatestBuild.ID != before.LatestBuild.ID {
		t.Errorf("a dry-run delete or patch started build %d", after.LatestBuild.BuildNumber)
	}
}

// testAggregatedSelectors checks label and field selectors.
func testAggregatedSelectors(t *testing.T, env *aggregatedEnv) {
	s, wsA, wsB := env.s, env.wsA, env.wsB
	s.must(t, "apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: coder}
spec: {templateName: demo, running: false}
`, wsB)))
	out := s.must(t, "get", "cws", "-n", s.ns, "-o", "name", "-l", aggv1.LabelTemplate+"=demo")
	if !strings.Contains(out, wsB) || strings.Contains(out, wsA) {
		t.Errorf("-l template=demo:\n%s", out)
	}
	out = s.must(t, "get", "cws", "-A", "-o", "name", "-l", aggv1.LabelOwner+"="+s.coder.Username)
	if !strings.Contains(out, wsB) || !strings.Contains(out, wsA) {
		t.Errorf("-l owner=%s:\n%s", s.coder.Username, out)
	}
	out = s.must(t, "get", "cws", "-n", s.ns, "-o", "name", "--field-selector", "spec.templateName=base,status.owner="+s.coder.Username)
	if !strings.Contains(out, wsA) || strings.Contains(out, wsB) {
		t.Errorf("--field-selector spec.templateName=base:\n%s", out)
	}
	out = s.must(t, "get", "cws", "-n", s.ns, "--field-selector", "status.owner=nobody")
	if !strings.Contains(out, "No resources found") {
		t.Errorf("--field-selector status.owner=nobody:\n%s", out)
	}
	out, err := s.run("get", "cws", "-n", s.ns, "--field-selector", "spec.nonsense=1")
	if err == nil || !strings.Contains(out, "not supported") {
		t.Errorf("an unknown field selector was not refused: %v\n%s", err, out)
	}
}

// testAggregatedWatchGone checks that a watch from a too old resourceVersion is 410 Gone.
func testAggregatedWatchGone(t *testing.T, env *aggregatedEnv) {
	ctx, s := context.Background(), env.s
	_, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: "1000000"})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("watch from resourceVersion 1000000: %v, want 410 Gone", err)
	}
}

// testAggregatedErrors checks that errors carry Kubernetes statuses.
func testAggregatedErrors(t *testing.T, env *aggregatedEnv) {
	ctx, s := context.Background(), env.s
	_, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, s.workspaceName("nothing"), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("get a missing workspace: %v, want NotFound", err)
	}
	out, err := s.run("apply", "--server-side", "-f", writeManifest(t, fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: %s, namespace: coder}
spec: {templateName: no-such-template, running: true}
`, s.workspaceName("ws-x"))))
	if err == nil || !strings.Contains(out, "spec.templateName") {
		t.Errorf("unknown template: %v\n%s", err, out)
	}
	out, err = s.run("apply", "--server-side", "-f", writeManifest(t, `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata: {name: just-a-name, namespace: coder}
spec: {templateName: base, running: true}
`))
	if err == nil || !strings.Contains(out, "<organization>.<owner>.<workspace>") {
		t.Errorf("a malformed name: %v\n%s", err, out)
	}
}

// testAggregatedDelete checks that a delete starts a delete build and the object stays until coderd removes the workspace.
func testAggregatedDelete(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsB := context.Background(), env.s, env.wsB
	// coderd refuses a delete build (409) while another build of the
	// workspace runs: wait for the builds of its creation to end.
	s.must(t, "wait", "--for=condition=Building=False", "cws/"+wsB, "-n", s.ns, "--timeout=90s")
	raw, err := s.k.Clientset.CoreV1().RESTClient().Delete().
		AbsPath("/apis/aggregation.coder.com/v1alpha1/namespaces", s.ns, "coderworkspaces", wsB).Do(ctx).Raw()
	if err != nil {
		t.Fatal(err)
	}
	var deleted aggv1.CoderWorkspace
	if err := json.Unmarshal(raw, &deleted); err != nil {
		t.Fatalf("delete response: %v\n%s", err, raw)
	}
	if deleted.DeletionTimestamp == nil || len(deleted.Finalizers) == 0 {
		t.Errorf("the delete response has no deletionTimestamp/finalizer: %s", raw)
	}
	s.must(t, "wait", "--for=delete", "cws/"+wsB, "-n", s.ns, "--timeout=90s")
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-b", codersdk.WorkspaceOptions{}); err == nil {
		t.Errorf("coderd still has ws-b after the object disappeared")
	}
}

// testAggregatedRBAC checks that RBAC applies through kube-apiserver and anonymous calls are refused.
func testAggregatedRBAC(t *testing.T, env *aggregatedEnv) {
	ctx, s := context.Background(), env.s
	cfg, err := s.k.UserConfig("alice")
	if err != nil {
		t.Fatal(err)
	}
	alice, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := alice.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("alice without RBAC: %v, want 403", err)
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "workspace-reader", Namespace: s.ns},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{aggv1.GroupName}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list", "watch"}}},
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-reads", Namespace: s.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}},
	}
	if err := s.c.Create(ctx, role); err != nil {
		t.Fatal(err)
	}
	if err := s.c.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := alice.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
		return err
	})
	if _, err := alice.Resource(templatesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice may read workspaces only, but listing templates gave %v", err)
	}

	insecure := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	code, _, err := getWith(insecure, s.op.Aggregated+"/apis/aggregation.coder.com/v1alpha1/coderworkspaces")
	if err != nil || code != http.StatusUnauthorized {
		t.Errorf("anonymous list on the secure port: %d %v, want 401", code, err)
	}
	code, _, err = getWith(insecure, s.op.Aggregated+"/readyz")
	if err != nil || code != http.StatusOK {
		t.Errorf("anonymous /readyz: %d %v, want 200", code, err)
	}
}

// testAggregatedControlPlanes checks that several control planes in one namespace get prefixed names.
func testAggregatedControlPlanes(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	adoptControlPlane(t, s, s.ns, "second", s.coder.URL.String())
	var list *unstructured.UnstructuredList
	testenv.WaitFor(t, 30*time.Second, func() error {
		var err error
		list, err = s.dyn.Resource(workspacesGVR).Namespace(s.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		names := map[string]bool{}
		for _, it := range list.Items {
			names[it.GetName()] = true
		}
		if !names["coder."+wsA] || !names["second."+wsA] {
			return errNotYet(fmt.Sprintf("names %v", names))
		}
		return nil
	})
	if _, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, "second."+wsA, metav1.GetOptions{}); err != nil {
		t.Errorf("get by prefixed name: %v", err)
	}
	_, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, wsA, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), "several control planes") {
		t.Errorf("unprefixed name with two control planes: %v", err)
	}
	all, err := s.dyn.Resource(workspacesGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Items) != len(list.Items) {
		t.Errorf("list across namespaces: %d items, namespace %s alone: %d", len(all.Items), s.ns, len(list.Items))
	}
	ccp := &unstructured.Unstructured{}
	ccp.SetAPIVersion("coder.com/v1alpha1")
	ccp.SetKind("CoderControlPlane")
	ccp.SetNamespace(s.ns)
	ccp.SetName("second")
	if err := s.c.Delete(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 60*time.Second, func() error {
		_, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, wsA, metav1.GetOptions{})
		return err
	})
}

// testAggregatedNamespaceDelete checks that deleting a namespace never deletes Coder workspaces or templates.
func testAggregatedNamespaceDelete(t *testing.T, env *aggregatedEnv) {
	ctx, s, wsA := context.Background(), env.s, env.wsA
	adoptControlPlane(t, s, "team", "coder", s.coder.URL.String())
	testenv.WaitFor(t, 30*time.Second, func() error {
		_, err := s.dyn.Resource(workspacesGVR).Namespace("team").Get(ctx, wsA, metav1.GetOptions{})
		return err
	})
	s.k.NewControllerManager(t, "namespace")
	s.must(t, "delete", "namespace", "team", "--timeout=120s")
	if _, err := s.coder.Client.WorkspaceByOwnerAndName(ctx, s.coder.Username, "ws-a", codersdk.WorkspaceOptions{}); err != nil {
		t.Errorf("coderd lost ws-a when namespace team was deleted: %v", err)
	}
	if _, err := s.coder.Client.TemplateByName(ctx, s.coder.OrganizationID, "demo"); err != nil {
		t.Errorf("coderd lost template demo when namespace team was deleted: %v", err)
	}
	if _, err := s.dyn.Resource(workspacesGVR).Namespace(s.ns).Get(ctx, wsA, metav1.GetOptions{}); err != nil {
		t.Errorf("ws-a is no longer visible in namespace %s: %v", s.ns, err)
	}
}

func getWith(c *http.Client, url string) (int, string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = fmt.Fprint(&b, resp.Status)
	return resp.StatusCode, b.String(), nil
}

// ptrString prints what p points at, or nil.
func ptrString[T any](p *T) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}
