package argocd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/argoproj/gitops-engine/pkg/cache"
	"github.com/argoproj/gitops-engine/pkg/diff"
	"github.com/argoproj/gitops-engine/pkg/health"
	"github.com/argoproj/gitops-engine/pkg/sync"
	"github.com/argoproj/gitops-engine/pkg/sync/common"
	"github.com/argoproj/gitops-engine/pkg/utils/kube"
	"github.com/argoproj/gitops-engine/pkg/utils/tracing"
	"github.com/go-logr/logr/testr"
	lua "github.com/yuin/gopher-lua"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

const (
	app           = "coder-gitops"
	templateName  = "argo-tpl"
	workspaceName = "argo-ws"
	displayName   = "Argo CD template"
	// trackingAnnotation is Argo CD's annotation tracking
	// (application.resourceTrackingMethod: annotation, the default since
	// Argo CD 3.0): <app>:<group>/<kind>:<namespace>/<name>.
	trackingAnnotation = "argocd.argoproj.io/tracking-id"
)

var (
	templates  = schema.GroupVersionResource{Group: "aggregation.coder.com", Version: "v1alpha1", Resource: "codertemplates"}
	workspaces = schema.GroupVersionResource{Group: "aggregation.coder.com", Version: "v1alpha1", Resource: "coderworkspaces"}
)

// The Application's manifests. The template is in sync wave 0 and the
// workspace in wave 1: the engine applies the workspace once the template
// is Healthy (built), and prunes in the reverse order.
const manifests = `apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: coder.` + templateName + `
  namespace: %[1]s
  annotations:
    argocd.argoproj.io/sync-wave: "0"
spec:
  displayName: ` + displayName + `
  description: Synced by Argo CD's gitops-engine
  defaultTTL: 8h
  activityBump: 90m
  versionName: release-1.0
  versionMessage: Released through Argo CD's gitops-engine
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
      value: argo cd
---
apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: coder.admin.` + workspaceName + `
  namespace: %[1]s
  annotations:
    argocd.argoproj.io/sync-wave: "1"
spec:
  templateName: ` + templateName + `
  running: true`

// variablesSecret holds a value of the template's variables: it is not in
// Git, as a credential would not be.
const variablesSecret = "argocd-tpl-vars"

// application is an Argo CD Application: its name and destination
// namespace, and the credentials the application controller syncs it with
// (nil: the admin's).
type application struct {
	name, namespace string
	cfg             *rest.Config
}

// coderApp is the Application of the Coder template and workspace, in the
// control plane's namespace.
func coderApp() application { return application{name: app, namespace: env.Namespace} }

// targets are the manifests as Argo CD's controller hands them to the
// engine: with the tracking annotation set.
func targets(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	return coderApp().targets(t, fmt.Sprintf(manifests, env.Namespace))
}

// targets decodes manifests (YAML documents) with a's tracking annotation
// set, as Argo CD's controller hands them to the engine.
func (a application) targets(t *testing.T, manifests string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(manifests, "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("manifest: %v", err)
		}
		ann := u.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[trackingAnnotation] = trackingID(a.name, u)
		u.SetAnnotations(ann)
		objs = append(objs, u)
	}
	return objs
}

// trackingID is the tracking annotation of u in application appName.
func trackingID(appName string, u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	return fmt.Sprintf("%s:%s/%s:%s/%s", appName, gvk.Group, gvk.Kind, u.GetNamespace(), u.GetName())
}

// trackedApp is what Argo CD's cluster cache records for a resource: the
// application its tracking annotation names, when the annotation describes
// this very resource (a copied annotation does not count).
func trackedApp(u *unstructured.Unstructured) string {
	id := u.GetAnnotations()[trackingAnnotation]
	name, _, ok := strings.Cut(id, ":")
	if !ok || id != trackingID(name, u) {
		return ""
	}
	return name
}

// isManaged reports whether the cluster cache recorded r as a's.
func (a application) isManaged(r *cache.Resource) bool {
	info, _ := r.Info.(string)
	return info == a.name
}

// luaHealth is the health check docs/gitops.md tells Argo CD users to add
// (resource.customizations.health.aggregation.coder.com_<Kind> in argocd-cm),
// run as Argo CD runs such scripts: gopher-lua (the version Argo CD v3.3.0
// uses) with the live object as the global obj, returning hs.status and
// hs.message. The engine calls it through health.GetResourceHealth, like its
// built-in checks.
type luaHealth struct{ script string }

func (h luaHealth) GetResourceHealth(u *unstructured.Unstructured) (*health.HealthStatus, error) {
	// The kinds docs/gitops.md registers the script for; the others (a
	// CoderUser) have no health check.
	if u.GetAPIVersion() != "aggregation.coder.com/v1alpha1" || (u.GetKind() != "CoderTemplate" && u.GetKind() != "CoderWorkspace") {
		return nil, nil
	}
	l := lua.NewState()
	defer l.Close()
	l.SetGlobal("obj", toLua(l, u.Object))
	if err := l.DoString(h.script); err != nil {
		return nil, fmt.Errorf("health script: %w", err)
	}
	hs, ok := l.Get(-1).(*lua.LTable)
	if !ok {
		return nil, fmt.Errorf("health script returned %s, want a table", l.Get(-1).Type())
	}
	return &health.HealthStatus{
		Status:  health.HealthStatusCode(lua.LVAsString(hs.RawGetString("status"))),
		Message: lua.LVAsString(hs.RawGetString("message")),
	}, nil
}

// toLua converts a decoded JSON value into Lua values, as Argo CD's Lua VM
// does.
func toLua(l *lua.LState, v any) lua.LValue {
	switch v := v.(type) {
	case map[string]any:
		t := l.NewTable()
		for k, e := range v {
			t.RawSetString(k, toLua(l, e))
		}
		return t
	case []any:
		t := l.NewTable()
		for _, e := range v {
			t.Append(toLua(l, e))
		}
		return t
	case string:
		return lua.LString(v)
	case bool:
		return lua.LBool(v)
	case int64:
		return lua.LNumber(v)
	case float64:
		return lua.LNumber(v)
	}
	return lua.LNil
}

// docsHealthScript is the Lua block of docs/gitops.md.
func docsHealthScript(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "gitops.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "```lua\n")
	script, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("docs/gitops.md has no lua block")
	}
	return script
}

// healthCheck is the health check in use (docs/gitops.md's script).
var healthCheck health.HealthOverride

// resourceStatus is one row of the Application's resource tree.
type resourceStatus struct {
	key    string
	synced bool
	health health.HealthStatusCode
	diff   string
}

// appStatus is what Argo CD's controller computes on a refresh: the managed
// live objects from the cluster cache, reconciled with the targets, diffed,
// and their health.
type appStatus struct {
	resources []resourceStatus
	// live counts the managed live objects.
	live int
}

func (s appStatus) synced() bool {
	for _, r := range s.resources {
		if !r.synced {
			return false
		}
	}
	return true
}

// healthy reports whether every resource is Healthy or, like a ConfigMap,
// has no health check (Argo CD leaves those out of the app's health).
func (s appStatus) healthy() bool {
	for _, r := range s.resources {
		if r.health != health.HealthStatusHealthy && r.health != noHealthCheck {
			return false
		}
	}
	return true
}

func (s appStatus) String() string {
	var b strings.Builder
	for _, r := range s.resources {
		sync := "Synced"
		if !r.synced {
			sync = "OutOfSync"
		}
		h := string(r.health)
		if r.health == noHealthCheck {
			h = "(no health check)"
		}
		fmt.Fprintf(&b, "  %s: %s %s", r.key, sync, h)
		if r.diff != "" {
			fmt.Fprintf(&b, "\n    diff: %s", r.diff)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// noHealthCheck is the health of a live resource without a health check.
const noHealthCheck health.HealthStatusCode = ""

func refresh(t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured) appStatus {
	t.Helper()
	return coderApp().refresh(t, cc, targetObjs)
}

// refresh computes a's status as Argo CD's controller does on a refresh.
func (a application) refresh(t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured) appStatus {
	t.Helper()
	requireSynced(t, cc)
	live, err := cc.GetManagedLiveObjs(targetObjs, a.isManaged)
	if err != nil {
		t.Fatalf("managed live objects: %v", err)
	}
	res := sync.Reconcile(targetObjs, live, a.namespace, cc)
	diffs, err := diff.DiffArray(res.Target, res.Live)
	if err != nil {
		t.Fatalf("diff: %v", err)
	}
	var st appStatus
	for i := range res.Target {
		tgt, lv := res.Target[i], res.Live[i]
		obj := tgt
		if obj == nil {
			obj = lv
		}
		r := resourceStatus{key: obj.GetKind() + "/" + obj.GetName(), synced: tgt != nil && lv != nil && !diffs.Diffs[i].Modified, health: health.HealthStatusMissing}
		if lv != nil {
			st.live++
			h, err := health.GetResourceHealth(lv, healthCheck)
			if err != nil {
				t.Fatalf("health of %s: %v", r.key, err)
			}
			r.health = noHealthCheck
			if h != nil {
				r.health = h.Status
			}
		}
		if diffs.Diffs[i].Modified && tgt != nil && lv != nil {
			r.diff = fmt.Sprintf("live %s, want %s", diffs.Diffs[i].NormalizedLive, diffs.Diffs[i].PredictedLive)
		}
		st.resources = append(st.resources, r)
	}
	return st
}

// requireSynced fails t unless the cluster cache has synced, which Argo
// CD's controller requires before every comparison and sync
// (getSyncedCluster): otherwise every Application on the cluster shows a
// ComparisonError.
func requireSynced(t *testing.T, cc cache.ClusterCache) {
	t.Helper()
	if err := cc.EnsureSynced(); err != nil {
		t.Fatalf("ComparisonError: the cluster cache has not synced: %v\ncoder-k8s log:\n%s", err, env.OperatorLogTail(30))
	}
}

// waitStatus refreshes until ok says the status is the expected one.
func waitStatus(t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured, what string, ok func(appStatus) bool) appStatus {
	t.Helper()
	return coderApp().waitStatus(t, cc, targetObjs, what, ok)
}

// waitStatus refreshes a until ok says the status is the expected one.
func (a application) waitStatus(t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured, what string, ok func(appStatus) bool) appStatus {
	t.Helper()
	start := time.Now()
	var st appStatus
	for time.Since(start) < within {
		st = a.refresh(t, cc, targetObjs)
		if ok(st) {
			t.Logf("%s after %s:\n%s", what, time.Since(start).Round(time.Millisecond), st)
			return st
		}
		time.Sleep(time.Second)
	}
	t.Fatalf("not %s after %s:\n%s\ncoder-k8s log:\n%s", what, within, st, env.OperatorLogTail(30))
	return st
}

// syncApp runs one sync operation as Argo CD's application controller does:
// on every reconciliation (here each second) it reconciles the targets with
// the cluster cache's current live objects, creates a sync context carrying
// the operation's state so far (sync.WithInitialState) and advances it one
// step. (engine.Sync keeps one sync context with the live objects of its
// start, so it never sees a resource become healthy and cannot pass a sync
// wave; Argo CD does not use it.)
func syncApp(ctx context.Context, t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured, revision string) []common.ResourceSyncResult {
	t.Helper()
	return coderApp().sync(ctx, t, cc, targetObjs, revision)
}

// sync runs one sync operation of a (see syncApp).
func (a application) sync(ctx context.Context, t *testing.T, cc cache.ClusterCache, targetObjs []*unstructured.Unstructured, revision string) []common.ResourceSyncResult {
	t.Helper()
	log := testr.NewWithOptions(t, testr.Options{Verbosity: 0})
	kubectl := &kube.KubectlCmd{Log: log, Tracer: tracing.NopTracer{}}
	start := time.Now()
	startedAt := metav1.Now()
	var (
		phase   common.OperationPhase
		message string
		results []common.ResourceSyncResult
	)
	for {
		requireSynced(t, cc)
		live, err := cc.GetManagedLiveObjs(targetObjs, a.isManaged)
		if err != nil {
			t.Fatalf("managed live objects: %v", err)
		}
		res := sync.Reconcile(targetObjs, live, a.namespace, cc)
		cfg := a.cfg
		if cfg == nil {
			cfg = restCfg
		}
		syncCtx, cleanup, err := sync.NewSyncContext(revision, res, cfg, cfg, kubectl, a.namespace, cc.GetOpenAPISchema(),
			sync.WithInitialState(phase, message, results, startedAt),
			sync.WithPrune(true), sync.WithHealthOverride(healthCheck), sync.WithLogr(log))
		if err != nil {
			t.Fatalf("sync context: %v", err)
		}
		syncCtx.Sync()
		phase, message, results = syncCtx.GetState()
		cleanup()
		if phase.Completed() {
			break
		}
		if time.Since(start) > within {
			t.Fatalf("sync %s: still %s after %s: %s\ncoder-k8s log:\n%s", revision, phase, within, message, env.OperatorLogTail(30))
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(time.Second):
		}
	}
	var b strings.Builder
	for _, r := range results {
		fmt.Fprintf(&b, "  %s %s: %s %s\n", r.ResourceKey.Kind, r.ResourceKey.Name, r.Status, r.Message)
	}
	if phase != common.OperationSucceeded {
		t.Fatalf("sync %s: %s: %s\n%scoder-k8s log:\n%s", revision, phase, message, b.String(), env.OperatorLogTail(30))
	}
	t.Logf("sync %s: %s in %s:\n%s", revision, phase, time.Since(start).Round(time.Millisecond), b.String())
	return results
}

func requireResults(t *testing.T, results []common.ResourceSyncResult, want common.ResultCode, n int) {
	t.Helper()
	got := 0
	for _, r := range results {
		if r.Status != want {
			t.Errorf("%s %s: %s (%s), want %s", r.ResourceKey.Kind, r.ResourceKey.Name, r.Status, r.Message, want)
		}
		got++
	}
	if got != n {
		t.Errorf("%d resource results, want %d", got, n)
	}
}

func TestArgoCDEngine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	// Argo CD's cluster cache for the destination namespace, recording
	// each resource's application from its tracking annotation and keeping
	// the manifests of tracked ones (as Argo CD does).
	cc := cache.NewClusterCache(restCfg,
		cache.SetNamespaces([]string{env.Namespace}),
		cache.SetLogr(testr.NewWithOptions(t, testr.Options{Verbosity: 0})),
		cache.SetPopulateResourceInfoHandler(func(u *unstructured.Unstructured, _ bool) (any, bool) {
			a := trackedApp(u)
			return a, a != ""
		}))
	if err := cc.EnsureSynced(); err != nil {
		t.Fatalf("cluster cache: %v", err)
	}
	defer cc.Invalidate()
	tgt := targets(t)
	healthCheck = luaHealth{script: docsHealthScript(t)}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": variablesSecret}, "stringData": map[string]any{"greeting": "hello"}}}
	if _, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace(env.Namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("sync: Synced and Healthy", func(t *testing.T) {
		st := refresh(t, cc, tgt)
		if st.synced() || st.live != 0 {
			t.Fatalf("before the first sync: want OutOfSync, nothing live:\n%s", st)
		}
		requireResults(t, syncApp(ctx, t, cc, tgt, "rev1"), common.ResultCodeSynced, 2)
		waitStatus(t, cc, tgt, "Synced and Healthy", func(s appStatus) bool { return s.synced() && s.healthy() })
	})
	if t.Failed() {
		return
	}

	t.Run("no diff on the next refresh", func(t *testing.T) {
		// A hard refresh: the cluster cache relists everything.
		cc.Invalidate()
		if err := cc.EnsureSynced(); err != nil {
			t.Fatal(err)
		}
		if st := refresh(t, cc, tgt); !st.synced() || !st.healthy() || st.live != 2 {
			t.Fatalf("after a hard refresh, want both Synced and Healthy:\n%s", st)
		}
		// The tracking annotation is what made them the app's.
		for _, o := range []struct {
			gvr  schema.GroupVersionResource
			name string
		}{{templates, "coder." + templateName}, {workspaces, "coder.admin." + workspaceName}} {
			live, err := dyn.Resource(o.gvr).Namespace(env.Namespace).Get(ctx, o.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := live.GetAnnotations()[trackingAnnotation]; got != trackingID(app, live) {
				t.Errorf("%s %s: %s = %q, want %q", o.gvr.Resource, o.name, trackingAnnotation, got, trackingID(app, live))
			}
		}
	})

	t.Run("drift made in Coder: OutOfSync, then healed", func(t *testing.T) {
		if _, err := env.Coder(ctx, "templates", "edit", templateName, "--display-name", "Changed in Coder", "--default-ttl", "2h", "--yes"); err != nil {
			t.Fatal(err)
		}
		if _, err := env.Coder(ctx, "stop", workspaceName, "--yes"); err != nil {
			t.Fatal(err)
		}
		st := waitStatus(t, cc, tgt, "OutOfSync (both)", func(s appStatus) bool {
			for _, r := range s.resources {
				if r.synced {
					return false
				}
			}
			return len(s.resources) == 2
		})
		for _, r := range st.resources {
			if r.health == health.HealthStatusMissing {
				t.Errorf("%s is Missing: the change in Coder lost the object's tracking", r.key)
			}
		}
		// Self-heal: Argo CD syncs an OutOfSync app with automated.selfHeal.
		requireResults(t, syncApp(ctx, t, cc, tgt, "rev1"), common.ResultCodeSynced, 2)
		waitStatus(t, cc, tgt, "Synced and Healthy again", func(s appStatus) bool { return s.synced() && s.healthy() })
		live, err := dyn.Resource(templates).Namespace(env.Namespace).Get(ctx, "coder."+templateName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := unstructured.NestedString(live.Object, "spec", "displayName"); got != displayName {
			t.Errorf("template displayName %q after the sync, want %q", got, displayName)
		}
		// The default TTL changed in Coder is healed, and read back as
		// written.
		if got, _, _ := unstructured.NestedString(live.Object, "spec", "defaultTTL"); got != "8h" {
			t.Errorf("template defaultTTL %q after the sync, want 8h", got)
		}
	})

	t.Run("prune", func(t *testing.T) {
		// The manifests are gone from Git: the sync prunes both.
		requireResults(t, syncApp(ctx, t, cc, nil, "rev2"), common.ResultCodePruned, 2)
		for _, o := range []struct {
			gvr  schema.GroupVersionResource
			name string
		}{{workspaces, "coder.admin." + workspaceName}, {templates, "coder." + templateName}} {
			_, err := dyn.Resource(o.gvr).Namespace(env.Namespace).Get(ctx, o.name, metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				t.Errorf("%s %s after the prune: %v, want NotFound", o.gvr.Resource, o.name, err)
			}
		}
		if st := refresh(t, cc, nil); st.live != 0 {
			t.Errorf("managed live objects after the prune:\n%s", st)
		}
		if out, err := env.Coder(ctx, "templates", "list", "--output", "json"); err != nil || strings.Contains(out, `"`+templateName+`"`) {
			t.Errorf("coder templates list after the prune: %v\n%s", err, out)
		}
	})
}
