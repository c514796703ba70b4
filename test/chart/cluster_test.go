// The test stack's kube-apiserver as Helm sees it, and the kubectl and helm
// CLIs run against it: helpers of install_test.go and upgrade_test.go.

package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
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
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
)

// optionalGroups are API groups of other projects' CRDs the chart renders
// objects of only when asked to (ServiceMonitor, cert-manager). The test
// stack has neither CRD, so those objects are rendered and parsed but not
// installed; any other kind the API does not know fails the test.
var optionalGroups = []string{"monitoring.coreos.com", "cert-manager.io"}

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

// helmCLI runs bin/helm against the test stack, with its own cache,
// config and data directories.
type helmCLI struct {
	bin, kubeconfig, home string
}

func (h *helmCLI) run(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	env := []string{
		"HELM_CACHE_HOME=" + filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME=" + filepath.Join(h.home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(h.home, "data"),
	}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "HELM_") && !strings.HasPrefix(e, "KUBECONFIG=") {
			env = append(env, e)
		}
	}
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	if s := stderr.String(); s != "" {
		t.Logf("helm %s (stderr): %s", args[0], s)
	}
	return stdout.String()
}

// wantRelease: `helm list` shows the release deployed at revision rev
// with chart c.
func (h *helmCLI) wantRelease(t *testing.T, rev int, c *chart.Chart) {
	t.Helper()
	var list []struct {
		Name       string `json:"name"`
		Revision   string `json:"revision"`
		Status     string `json:"status"`
		Chart      string `json:"chart"`
		AppVersion string `json:"app_version"`
	}
	out := h.run(t, "list", "-n", releaseNamespace, "-o", "json")
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("helm list -o json: %v\n%s", err, out)
	}
	if len(list) != 1 {
		t.Fatalf("helm list: %d releases, want 1:\n%s", len(list), out)
	}
	r := list[0]
	want := fmt.Sprintf("%s revision %d %s %s-%s app %s", releaseName, rev, "deployed", c.Name(), c.Metadata.Version, c.Metadata.AppVersion)
	if got := fmt.Sprintf("%s revision %s %s %s app %s", r.Name, r.Revision, r.Status, r.Chart, r.AppVersion); got != want {
		t.Errorf("helm list: %s, want %s", got, want)
	}
}

// releaseObjects finds every object in the cluster Helm marks as part of
// the release (its meta.helm.sh annotations), whatever its kind, by
// listing every resource the API serves.
func (h *helmCLI) releaseObjects(t *testing.T, c *cluster) map[string]bool {
	t.Helper()
	lists, err := c.k.Clientset.Discovery().ServerPreferredResources()
	if err != nil {
		// The release's APIService has no server behind it here: its group
		// cannot be discovered and holds nothing Helm installed.
		var failed *discovery.ErrGroupDiscoveryFailed
		if !errors.As(err, &failed) {
			t.Fatalf("discovery: %v", err)
		}
		for gv := range failed.Groups {
			if gv.Group != "aggregation.coder.com" {
				t.Fatalf("discovery of %s failed: %v", gv, failed.Groups[gv])
			}
		}
	}
	// Listing every resource includes deprecated ones; their warnings
	// are noise here.
	cfg := rest.CopyConfig(c.k.Config)
	cfg.WarningHandler = rest.NoWarnings{}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string]bool{}
	ctx := context.Background()
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range l.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			items, err := dyn.Resource(gv.WithResource(r.Name)).List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("list %s: %v", gv.WithResource(r.Name), err)
			}
			for i := range items.Items {
				u := &items.Items[i]
				a := u.GetAnnotations()
				if a["meta.helm.sh/release-name"] == releaseName && a["meta.helm.sh/release-namespace"] == releaseNamespace {
					u.SetAPIVersion(gv.String())
					u.SetKind(r.Kind)
					owned[objKey(u)] = true
				}
			}
		}
	}
	return owned
}

// objKey identifies an object across versions of its kind.
func objKey(u *unstructured.Unstructured) string {
	gk := u.GroupVersionKind().GroupKind()
	if u.GetNamespace() == "" {
		return gk.String() + " " + u.GetName()
	}
	return gk.String() + " " + u.GetNamespace() + "/" + u.GetName()
}
