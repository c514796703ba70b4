package chart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// fieldManager is the server-side apply field manager of the install
// steps, standing in for Helm.
const fieldManager = "helm-test"

// optionalGroups are API groups of other projects' CRDs the chart renders
// objects of only when asked to (ServiceMonitor, cert-manager). The test
// stack has neither CRD, so those objects are rendered and parsed but not
// installed; any other kind the API does not know fails the test.
var optionalGroups = []string{"monitoring.coreos.com", "cert-manager.io"}

// TestInstall installs the chart into a real kube-apiserver (every object
// validated by the real API), upgrades it through a TLS mode change and
// changed values, validates every ci values file with a server-side dry
// run, uninstalls it, and then applies the GitOps examples the way Argo
// CD and Flux would, twice, expecting no drift.
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver and etcd from bin/")
	}
	start := time.Now()
	// No CRDs from the test stack: the chart installs its own.
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{CRDDirs: []string{t.TempDir()}})
	t.Logf("kube-apiserver up in %s", time.Since(start).Round(time.Millisecond))
	c := newCluster(t, k)
	ctx := context.Background()
	if err := k.EnsureNamespace(ctx, releaseNamespace); err != nil {
		t.Fatal(err)
	}
	rel := &release{name: releaseName, namespace: releaseNamespace, manager: fieldManager}
	renderFor := func(t *testing.T, vals map[string]any) *manifest {
		return mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, vals)
	}

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	var rev1 *manifest
	step("install", func(t *testing.T) {
		rev1 = renderFor(t, ciValues(t, "default"))
		c.upgrade(t, rel, rev1)
		for _, crd := range rev1.all("CustomResourceDefinition") {
			c.get(t, crd.u) // established: upgrade waited for it
		}
		as := c.apiService(t)
		if as.Spec.Service == nil || as.Spec.Service.Name != releaseName+"-aggregated" || *as.Spec.Service.Port != 443 {
			t.Errorf("live APIService service %+v", as.Spec.Service)
		}
		if len(as.Spec.CABundle) > 0 {
			t.Error("tls.mode auto: the live APIService has a caBundle before coder-k8s wrote one")
		}
		c.liveConfig(t, rel)
		c.diffEmpty(t, rel, rev1)
	})

	step("upgrade to tls.mode secret", func(t *testing.T) {
		rev2 := renderFor(t, ciValues(t, "tls-secret"))
		removed := c.upgrade(t, rel, rev2)
		// tls.mode auto's RBAC is gone, like `helm upgrade` deletes what the
		// new revision no longer renders.
		for _, kind := range []string{"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"} {
			if !slices.Contains(removed, kind+" "+releaseName+"-autotls") && !slices.Contains(removed, kind+" "+releaseNamespace+"/"+releaseName+"-autotls") {
				t.Errorf("%s %s-autotls was not removed (removed: %v)", kind, releaseName, removed)
			}
		}
		as := c.apiService(t)
		if string(as.Spec.CABundle) != lookupString(ciValues(t, "tls-secret"), "tls.caBundle") {
			t.Errorf("live APIService caBundle is not tls.caBundle")
		}
		cfg := c.liveConfig(t, rel)
		if cfg.AggregatedAPIServer.AutoTLS.Enabled || cfg.AggregatedAPIServer.CertDir == "" {
			t.Errorf("live config: autoTLS %v, certDir %q", cfg.AggregatedAPIServer.AutoTLS.Enabled, cfg.AggregatedAPIServer.CertDir)
		}
		c.diffEmpty(t, rel, rev2)
	})

	var before *appsv1.Deployment
	step("upgrade with changed values", func(t *testing.T) {
		before = c.deployment(t)
		vals := merged(ciValues(t, "default"), valuesFromYAML(t, `
replicas: 2
podDisruptionBudget: {enabled: true}
config:
  logging: {level: debug}
  aggregatedAPIServer: {watchPollInterval: 15s}
`))
		rev3 := renderFor(t, vals)
		// kubectl diff sees the change before it is applied (so an empty
		// diff later means something).
		if out, code := c.diff(t, rel, rev3); code != 1 || !strings.Contains(out, "+  replicas: 2") {
			t.Errorf("kubectl diff before the upgrade: exit code %d, want 1 and the replicas change:\n%s", code, out)
		}
		if removed := c.upgrade(t, rel, rev3); len(removed) > 0 {
			t.Errorf("removed %v; tls.mode auto renders everything tls.mode secret did", removed)
		}
		d := c.deployment(t)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
			t.Errorf("live Deployment replicas %v, want 2", d.Spec.Replicas)
		}
		if d.Generation == before.Generation {
			t.Errorf("the Deployment did not change (generation %d)", d.Generation)
		}
		if a, b := d.Spec.Template.Annotations["checksum/config"], before.Spec.Template.Annotations["checksum/config"]; a == b {
			t.Errorf("checksum/config did not change (%s): the pods would not roll", a)
		}
		c.get(t, rev3.all("PodDisruptionBudget")[0].u)
		cfg := c.liveConfig(t, rel)
		if cfg.Logging.Level != "debug" || cfg.AggregatedAPIServer.WatchPollInterval.Duration != 15*time.Second {
			t.Errorf("live config: logging.level %s, watchPollInterval %s", cfg.Logging.Level, cfg.AggregatedAPIServer.WatchPollInterval)
		}
		// Back to tls.mode auto: server-side apply drops the caBundle the
		// field manager no longer applies, and the autoTLS RBAC is back.
		if as := c.apiService(t); len(as.Spec.CABundle) > 0 {
			t.Error("the caBundle of tls.mode secret is still in the live APIService")
		}
		for _, o := range rev3.objects {
			if strings.HasSuffix(o.u.GetName(), "-autotls") {
				c.get(t, o.u)
			}
		}
		c.diffEmpty(t, rel, rev3)
	})

	step("upgrade removing an optional object", func(t *testing.T) {
		vals := merged(ciValues(t, "default"), valuesFromYAML(t, "replicas: 2\nconfig: {logging: {level: debug}}"))
		rev4 := renderFor(t, vals)
		removed := c.upgrade(t, rel, rev4)
		if !slices.Equal(removed, []string{"PodDisruptionBudget " + releaseNamespace + "/" + releaseName}) {
			t.Errorf("removed %v, want only the PodDisruptionBudget", removed)
		}
		c.diffEmpty(t, rel, rev4)
	})

	step("every ci values file passes a server-side dry run", func(t *testing.T) {
		for _, cc := range ciCases(t) {
			start := time.Now()
			m := renderFor(t, cc.vals)
			applied, skipped := c.apply(t, m.objects, fieldManager, true)
			t.Logf("%s: %d objects validated in %s; not installable here: %v", cc.name, len(applied), time.Since(start).Round(time.Millisecond), skipped)
		}
	})

	step("uninstall keeps the CRDs", func(t *testing.T) {
		kept := c.uninstall(t, rel)
		var crds []string
		for _, o := range kept {
			if o.gvk.Kind != "CustomResourceDefinition" {
				t.Errorf("uninstall kept %s", o)
			}
			crds = append(crds, o.name)
		}
		if len(crds) != len(rev1.all("CustomResourceDefinition")) {
			t.Errorf("uninstall kept CRDs %v", crds)
		}
	})

	// GitOps: render the examples' values as Argo CD and Flux do (helm
	// template), apply with server-side apply twice, and expect the second
	// apply to change nothing and `kubectl diff --server-side` to report
	// nothing: no drift, so no ignore rules are needed.
	for _, ex := range gitOpsExamples(t) {
		step("GitOps "+ex.name, func(t *testing.T) {
			if err := k.EnsureNamespace(ctx, ex.namespace); err != nil {
				t.Fatal(err)
			}
			m := mustRender(t, renderOptions{release: ex.release, namespace: ex.namespace, kubeVersion: c.kubeVersion}, ex.values)
			gitops := &release{name: ex.release, namespace: ex.namespace, manager: ex.manager}
			file := c.writeInstallable(t, m)
			c.kubectl(t, "apply", "--server-side", "--field-manager", ex.manager, "-f", file)
			// The CRDs must be established before they are used; the
			// chart renders no custom resources, so one apply is enough.
			gitops.objects = c.refs(t, m)
			first := c.resourceVersions(t, gitops)
			c.kubectl(t, "apply", "--server-side", "--field-manager", ex.manager, "-f", file)
			second := c.resourceVersions(t, gitops)
			for key, rv := range first {
				if second[key] != rv {
					t.Errorf("the second apply changed %s (resourceVersion %s → %s)", key, rv, second[key])
				}
			}
			c.diffEmpty(t, gitops, m)
			c.uninstall(t, gitops)
		})
	}
	t.Logf("total %s", time.Since(start).Round(time.Millisecond))
}

// gitOpsExample is the chart values, release and namespace of one of
// examples/.
type gitOpsExample struct {
	name, release, namespace, manager string
	values                            map[string]any
}

func gitOpsExamples(t *testing.T) []gitOpsExample {
	read := func(path string) map[string]any {
		b, err := os.ReadFile(repoPath(t, path))
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return v
	}
	argo := read("examples/argocd/application.yaml")
	flux := read("examples/flux/helmrelease.yaml")
	examples := []gitOpsExample{{
		name:      "Argo CD Application",
		release:   lookupString(argo, "spec.source.helm.releaseName"),
		namespace: lookupString(argo, "spec.destination.namespace"),
		manager:   "argocd-controller",
		values:    chartValues(t, lookup(argo, "spec.source.helm.valuesObject")),
	}, {
		name:      "Flux HelmRelease",
		release:   lookupString(flux, "spec.releaseName"),
		namespace: lookupString(flux, "spec.targetNamespace"),
		manager:   "helm-controller",
		values:    chartValues(t, lookup(flux, "spec.values")),
	}}
	for _, ex := range examples {
		if ex.release == "" || ex.namespace == "" || len(ex.values) == 0 {
			t.Fatalf("%s: release %q, namespace %q, %d values", ex.name, ex.release, ex.namespace, len(ex.values))
		}
	}
	return examples
}

// chartValues turns values parsed from a manifest into chart values (as
// Helm reads them: numbers as float64 or int64 like a values file).
func chartValues(t *testing.T, v any) map[string]any {
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return valuesFromYAML(t, string(b))
}

// cluster is the test stack's kube-apiserver as Helm would see it.
type cluster struct {
	k           *testenv.KubeAPI
	dyn         dynamic.Interface
	mapper      *restmapper.DeferredDiscoveryRESTMapper
	kubeVersion *chartutil.KubeVersion
	kubectlBin  string
	cacheDir    string
}

func newCluster(t *testing.T, k *testenv.KubeAPI) *cluster {
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	info, err := k.Clientset.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	// Rendered for the server's version, as `helm install` does.
	kv, err := chartutil.ParseKubeVersion(info.GitVersion)
	if err != nil {
		t.Fatalf("server version %q: %v", info.GitVersion, err)
	}
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{
		k:           k,
		dyn:         dyn,
		mapper:      restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(k.Clientset.Discovery())),
		kubeVersion: kv,
		kubectlBin:  kubectl,
		cacheDir:    t.TempDir(),
	}
}

// objRef names an applied object.
type objRef struct {
	gvk             schema.GroupVersionKind
	namespace, name string
	keep            bool // helm.sh/resource-policy: keep
}

func (r objRef) String() string {
	if r.namespace != "" {
		return r.gvk.Kind + " " + r.namespace + "/" + r.name
	}
	return r.gvk.Kind + " " + r.name
}

// release is what one installation has applied in its last revision.
type release struct {
	name, namespace, manager string
	objects                  []objRef
}

// resource maps an object onto its API resource; ok is false for kinds of
// the optional groups the API does not serve.
func (c *cluster) resource(t *testing.T, gvk schema.GroupVersionKind) (*meta.RESTMapping, bool) {
	t.Helper()
	mapping, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		c.mapper.Reset()
		mapping, err = c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	switch {
	case meta.IsNoMatchError(err) && slices.Contains(optionalGroups, gvk.Group):
		return nil, false
	case err != nil:
		t.Fatalf("%s: %v", gvk, err)
	}
	return mapping, true
}

func (c *cluster) client(t *testing.T, gvk schema.GroupVersionKind, namespace string) (dynamic.ResourceInterface, bool) {
	t.Helper()
	mapping, ok := c.resource(t, gvk)
	if !ok {
		return nil, false
	}
	if mapping.Scope.Name() == meta.RESTScopeNameRoot {
		return c.dyn.Resource(mapping.Resource), true
	}
	if namespace == "" {
		t.Fatalf("%s without a namespace", gvk)
	}
	return c.dyn.Resource(mapping.Resource).Namespace(namespace), true
}

// apply server-side applies objects in Helm's install order, CRDs first
// (waiting until they are established), without forcing conflicts. It
// returns what it applied and the kinds it skipped.
func (c *cluster) apply(t *testing.T, objs []*object, manager string, dryRun bool) ([]objRef, []string) {
	t.Helper()
	ctx := context.Background()
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b *object) int {
		return installRank(a.u.GetKind()) - installRank(b.u.GetKind())
	})
	var applied []objRef
	var skipped []string
	crdsPending := false
	for _, o := range ordered {
		if crdsPending && o.u.GetKind() != "CustomResourceDefinition" {
			c.mapper.Reset()
			crdsPending = false
		}
		cl, ok := c.client(t, o.u.GroupVersionKind(), o.u.GetNamespace())
		if !ok {
			skipped = append(skipped, o.u.GetKind())
			continue
		}
		opts := metav1.ApplyOptions{FieldManager: manager}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		live, err := cl.Apply(ctx, o.u.GetName(), o.u, opts)
		if err != nil {
			t.Fatalf("server-side apply %s (%s): %v", o, o.source, err)
		}
		if o.u.GetKind() == "CustomResourceDefinition" && !dryRun {
			c.waitEstablished(t, live.GetName())
			crdsPending = true
		}
		applied = append(applied, objRef{
			gvk: o.u.GroupVersionKind(), namespace: o.u.GetNamespace(), name: o.u.GetName(),
			keep: o.u.GetAnnotations()["helm.sh/resource-policy"] == "keep",
		})
	}
	slices.Sort(skipped)
	return applied, slices.Compact(skipped)
}

// installRank is a kind's position in Helm's install order.
func installRank(kind string) int {
	if i := slices.Index(releaseutil.InstallOrder, kind); i >= 0 {
		return i
	}
	return len(releaseutil.InstallOrder)
}

// upgrade applies a revision and deletes what the previous one applied
// and this one does not render (unless kept), like `helm upgrade`. It
// returns the removed objects.
func (c *cluster) upgrade(t *testing.T, rel *release, m *manifest) []string {
	t.Helper()
	applied, skipped := c.apply(t, m.objects, rel.manager, false)
	if len(skipped) > 0 {
		t.Fatalf("revision renders kinds the test stack cannot install: %v", skipped)
	}
	var removed []string
	for _, old := range rel.objects {
		if old.keep || slices.ContainsFunc(applied, func(r objRef) bool {
			return r.gvk.GroupKind() == old.gvk.GroupKind() && r.namespace == old.namespace && r.name == old.name
		}) {
			continue
		}
		c.delete(t, old)
		removed = append(removed, old.String())
	}
	rel.objects = applied
	for _, r := range applied {
		c.get(t, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": r.gvk.GroupVersion().String(), "kind": r.gvk.Kind,
			"metadata": map[string]any{"name": r.name, "namespace": r.namespace},
		}})
	}
	return removed
}

// uninstall deletes a release's objects in Helm's uninstall order, except
// the kept ones, which it returns.
func (c *cluster) uninstall(t *testing.T, rel *release) []objRef {
	t.Helper()
	objs := slices.Clone(rel.objects)
	rank := func(kind string) int {
		if i := slices.Index(releaseutil.UninstallOrder, kind); i >= 0 {
			return i
		}
		return len(releaseutil.UninstallOrder)
	}
	slices.SortStableFunc(objs, func(a, b objRef) int { return rank(a.gvk.Kind) - rank(b.gvk.Kind) })
	var kept []objRef
	for _, o := range objs {
		if o.keep {
			kept = append(kept, o)
			continue
		}
		c.delete(t, o)
	}
	rel.objects = kept
	return kept
}

func (c *cluster) delete(t *testing.T, r objRef) {
	t.Helper()
	cl, _ := c.client(t, r.gvk, r.namespace)
	ctx := context.Background()
	bg := metav1.DeletePropagationBackground
	if err := cl.Delete(ctx, r.name, metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete %s: %v", r, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cl.Get(ctx, r.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still exists 30s after its deletion: %v", r, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// get returns the live object, failing when it does not exist.
func (c *cluster) get(t *testing.T, u *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	cl, ok := c.client(t, u.GroupVersionKind(), u.GetNamespace())
	if !ok {
		t.Fatalf("%s %s: not served", u.GetKind(), u.GetName())
	}
	live, err := cl.Get(context.Background(), u.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return live
}

func (c *cluster) waitEstablished(t *testing.T, name string) {
	t.Helper()
	gvr := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	deadline := time.Now().Add(30 * time.Second)
	for {
		crd, err := c.dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get CRD %s: %v", name, err)
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, cond := range conds {
			m, _ := cond.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not established after 30s: %v", name, conds)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func fromUnstructured[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

func (c *cluster) deployment(t *testing.T) *appsv1.Deployment {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apps/v1")
	u.SetKind("Deployment")
	u.SetNamespace(releaseNamespace)
	u.SetName(releaseName)
	return fromUnstructured[appsv1.Deployment](t, c.get(t, u))
}

func (c *cluster) apiService(t *testing.T) *apiregistrationv1.APIService {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("apiregistration.k8s.io/v1")
	u.SetKind("APIService")
	u.SetName("v1alpha1.aggregation.coder.com")
	return fromUnstructured[apiregistrationv1.APIService](t, c.get(t, u))
}

// liveConfig loads the live ConfigMap's config file with the binary's
// loader.
func (c *cluster) liveConfig(t *testing.T, rel *release) *config.Configuration {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace(rel.namespace)
	u.SetName(rel.name)
	cm := fromUnstructured[corev1.ConfigMap](t, c.get(t, u))
	return loadConfig(t, cm.Data["config.yaml"])
}

// refs are the objects of a manifest the API serves.
func (c *cluster) refs(t *testing.T, m *manifest) []objRef {
	var out []objRef
	for _, o := range m.objects {
		if _, ok := c.resource(t, o.u.GroupVersionKind()); ok {
			out = append(out, objRef{gvk: o.u.GroupVersionKind(), namespace: o.u.GetNamespace(), name: o.u.GetName(),
				keep: o.u.GetAnnotations()["helm.sh/resource-policy"] == "keep"})
		}
	}
	return out
}

func (c *cluster) resourceVersions(t *testing.T, rel *release) map[string]string {
	out := map[string]string{}
	for _, r := range rel.objects {
		cl, _ := c.client(t, r.gvk, r.namespace)
		live, err := cl.Get(context.Background(), r.name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get %s: %v", r, err)
		}
		out[r.String()] = live.GetResourceVersion()
	}
	return out
}

// writeInstallable writes the manifest's objects the API serves to a file
// for kubectl.
func (c *cluster) writeInstallable(t *testing.T, m *manifest) string {
	var buf bytes.Buffer
	for _, o := range m.objects {
		if _, ok := c.resource(t, o.u.GroupVersionKind()); ok {
			buf.WriteString("---\n")
			buf.WriteString(strings.TrimPrefix(o.yaml, "---\n"))
			if !strings.HasSuffix(o.yaml, "\n") {
				buf.WriteString("\n")
			}
		}
	}
	f := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(f, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// kubectl runs bin/kubectl against the test stack and returns stdout.
func (c *cluster) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, stderr, err := c.runKubectl(args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr)
	}
	return out
}

func (c *cluster) runKubectl(args ...string) (string, string, error) {
	cmd := exec.Command(c.kubectlBin, append([]string{"--kubeconfig", c.k.KubeconfigPath, "--cache-dir", c.cacheDir}, args...)...)
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "KUBECTL_EXTERNAL_DIFF=") && !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// diff runs `kubectl diff --server-side` with the release's field
// manager on what the API serves of m and returns its output and exit
// code (0: no differences, 1: differences).
func (c *cluster) diff(t *testing.T, rel *release, m *manifest) (string, int) {
	t.Helper()
	file := c.writeInstallable(t, m)
	out, stderr, err := c.runKubectl("diff", "--server-side", "--field-manager", rel.manager, "-f", file)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kubectl diff: %v", err)
	}
	if code > 1 {
		t.Fatalf("kubectl diff --server-side failed with exit code %d:\n%s", code, stderr)
	}
	if stderr != "" {
		t.Logf("kubectl diff stderr: %s", stderr)
	}
	return out, code
}

// diffEmpty: the live objects are exactly what the chart renders.
func (c *cluster) diffEmpty(t *testing.T, rel *release, m *manifest) {
	t.Helper()
	if out, code := c.diff(t, rel, m); code != 0 || out != "" {
		t.Errorf("kubectl diff --server-side: exit code %d, want 0 and no output:\n%s", code, out)
	}
}
