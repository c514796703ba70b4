// The test stack's kube-apiserver as Helm sees it, and the kubectl and helm
// CLIs run against it: helpers of install_test.go and upgrade_test.go
// (TestHelmTemplateCLI runs helm without a cluster).

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

	v1 "github.com/google/go-containerregistry/pkg/v1"
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
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
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
}

// newCluster starts the test stack's kube-apiserver with none of its own
// CRDs (the chart under test installs them) and connects to it.
func newCluster(t *testing.T) *cluster {
	return newClusterWith(t, testenv.KubeAPIOptions{})
}

// onNode is a cluster with the test stack's real node, whose registry
// holds the image `make image` built.
type onNode struct {
	*cluster
	node *nodeenv.Node
	// idx is the image index pushed; image its name in the registry.
	idx   v1.ImageIndex
	image string
}

// newOnNode starts a cluster with a node and pushes the image `make image`
// built to the node's registry as coder-k8s:imageTag.
func newOnNode(t *testing.T, imageTag string) *onNode {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the test stack's node, kube-apiserver, etcd and helm from bin/, and bin/image from make image")
	}
	idx, err := nodeenv.ShippedImage()
	if err != nil {
		t.Fatal(err)
	}
	network := nodeenv.NewNetwork(t)
	c := newClusterWith(t, testenv.KubeAPIOptions{Node: network.Serving()})
	node := nodeenv.NewNode(t, c.k, network)
	image, err := node.Registry.PushIndex(t.Context(), "coder-k8s:"+imageTag, idx)
	if err != nil {
		t.Fatal(err)
	}
	return &onNode{cluster: c, node: node, idx: idx, image: image}
}

// newClusterWith is newCluster with options, for example a real node.
func newClusterWith(t *testing.T, opts testenv.KubeAPIOptions) *cluster {
	start := time.Now()
	opts.CRDDirs = []string{t.TempDir()}
	k := testenv.NewKubeAPI(t, opts)
	t.Logf("kube-apiserver up in %s", time.Since(start).Round(time.Millisecond))
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
	}
}

// objRef names an applied object.
type objRef struct {
	gvk             schema.GroupVersionKind
	namespace, name string
	keep            bool // helm.sh/resource-policy: keep
}

func refOf(u *unstructured.Unstructured) objRef {
	return objRef{gvk: u.GroupVersionKind(), namespace: u.GetNamespace(), name: u.GetName(),
		keep: u.GetAnnotations()["helm.sh/resource-policy"] == "keep"}
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
		return kindRank(releaseutil.InstallOrder, a.u.GetKind()) - kindRank(releaseutil.InstallOrder, b.u.GetKind())
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
		applied = append(applied, refOf(o.u))
	}
	slices.Sort(skipped)
	return applied, slices.Compact(skipped)
}

// kindRank is a kind's position in one of Helm's orders
// (releaseutil.InstallOrder, releaseutil.UninstallOrder).
func kindRank(order releaseutil.KindSortOrder, kind string) int {
	if i := slices.Index(order, kind); i >= 0 {
		return i
	}
	return len(order)
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
		c.get(t, stub(r.gvk.GroupVersion().String(), r.gvk.Kind, r.namespace, r.name))
	}
	return removed
}

// uninstall deletes a release's objects in Helm's uninstall order, except
// the kept ones, which it returns.
func (c *cluster) uninstall(t *testing.T, rel *release) []objRef {
	t.Helper()
	objs := slices.Clone(rel.objects)
	slices.SortStableFunc(objs, func(a, b objRef) int {
		return kindRank(releaseutil.UninstallOrder, a.gvk.Kind) - kindRank(releaseutil.UninstallOrder, b.gvk.Kind)
	})
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
	var err error
	if !within30s(func() bool {
		_, err = cl.Get(ctx, r.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}) {
		t.Fatalf("%s still exists 30s after its deletion: %v", r, err)
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
	var conds []any
	if !within30s(func() bool {
		crd, err := c.dyn.Resource(gvr).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("get CRD %s: %v", name, err)
		}
		conds, _, _ = unstructured.NestedSlice(crd.Object, "status", "conditions")
		return slices.ContainsFunc(conds, func(cond any) bool {
			m, _ := cond.(map[string]any)
			return m["type"] == "Established" && m["status"] == "True"
		})
	}) {
		t.Fatalf("CRD %s not established after 30s: %v", name, conds)
	}
}

// within30s calls done every 100ms until it returns true, for at most 30
// seconds, and reports whether it did.
func within30s(done func() bool) bool {
	deadline := time.Now().Add(30 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

func fromUnstructured[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return out
}

// stub is an object with only its kind and name, to look it up by.
func stub(apiVersion, kind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

func (c *cluster) deployment(t *testing.T) *appsv1.Deployment {
	return fromUnstructured[appsv1.Deployment](t, c.get(t, stub("apps/v1", "Deployment", releaseNamespace, releaseName)))
}

func (c *cluster) apiService(t *testing.T) *apiregistrationv1.APIService {
	u := stub("apiregistration.k8s.io/v1", "APIService", "", "v1alpha1.aggregation.coder.com")
	return fromUnstructured[apiregistrationv1.APIService](t, c.get(t, u))
}

// liveConfigFile returns config.yaml of a release's live ConfigMap.
func (c *cluster) liveConfigFile(t *testing.T, namespace, name string) string {
	cm := fromUnstructured[corev1.ConfigMap](t, c.get(t, stub("v1", "ConfigMap", namespace, name)))
	return cm.Data["config.yaml"]
}

// liveConfig loads the live ConfigMap's config file with the binary's
// loader.
func (c *cluster) liveConfig(t *testing.T, rel *release) *config.Configuration {
	return loadConfig(t, c.liveConfigFile(t, rel.namespace, rel.name))
}

// refs are the objects of a manifest the API serves.
func (c *cluster) refs(t *testing.T, m *manifest) []objRef {
	var out []objRef
	for _, o := range m.objects {
		if _, ok := c.resource(t, o.u.GroupVersionKind()); ok {
			out = append(out, refOf(o.u))
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
	out, _, err := c.runKubectl(args...)
	if err != nil {
		t.Fatal(err) // names the command and carries its output
	}
	return out
}

// runKubectl runs bin/kubectl against the test stack and returns its
// stdout and stderr.
func (c *cluster) runKubectl(args ...string) (string, string, error) {
	r, err := c.kubectlCLI().Run(context.Background(), "", args...)
	return r.Stdout, r.Stderr, err
}

// kubectlCLI is bin/kubectl as the test stack's admin, without the test's
// own KUBECONFIG or external diff program.
func (c *cluster) kubectlCLI() testenv.Kubectl {
	k := c.k.Kubectl(c.kubectlBin)
	k.DropEnv = []string{"KUBECTL_EXTERNAL_DIFF=", "KUBECONFIG="}
	return k
}

// runTool runs a binary with the test's environment less the variables
// starting with one of drop, plus extra, and returns its stdout and
// stderr.
func runTool(ctx context.Context, bin string, args, drop []string, extra ...string) (string, string, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	env := slices.Clone(extra)
	for _, e := range os.Environ() {
		if !slices.ContainsFunc(drop, func(prefix string) bool { return strings.HasPrefix(e, prefix) }) {
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
	r, err := c.kubectlCLI().Run(context.Background(), "", "diff", "--server-side", "--field-manager", rel.manager, "-f", file)
	if err != nil && r.ExitCode < 0 {
		t.Fatalf("kubectl diff: %v", err)
	}
	if r.ExitCode > 1 {
		t.Fatalf("kubectl diff --server-side failed with exit code %d:\n%s", r.ExitCode, r.Stderr)
	}
	if r.Stderr != "" {
		t.Logf("kubectl diff stderr: %s", r.Stderr)
	}
	return r.Stdout, r.ExitCode
}

// diffEmpty: the live objects are exactly what the chart renders.
func (c *cluster) diffEmpty(t *testing.T, rel *release, m *manifest) {
	t.Helper()
	if out, code := c.diff(t, rel, m); code != 0 || out != "" {
		t.Errorf("kubectl diff --server-side: exit code %d, want 0 and no output:\n%s", code, out)
	}
}

// helmCLI runs bin/helm with its own cache, config and data directories,
// against the test stack once kubeconfig is set.
type helmCLI struct {
	bin, kubeconfig, home string
}

func newHelmCLI(t *testing.T) *helmCLI {
	t.Helper()
	bin, err := testenv.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	return &helmCLI{bin: bin, home: t.TempDir()}
}

// output runs helm and returns its stdout, stderr and error.
func (h *helmCLI) output(args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if h.kubeconfig != "" {
		args = append(slices.Clone(args), "--kubeconfig", h.kubeconfig)
	}
	return runTool(ctx, h.bin, args, []string{"HELM_", "KUBECONFIG=", "KUBECACHEDIR="},
		// helm's discovery cache is keyed by host and port, as kubectl's.
		"KUBECACHEDIR="+filepath.Join(h.home, "kube-cache"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"))
}

// run runs helm, failing the test when it fails, and returns its stdout.
func (h *helmCLI) run(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := h.output(args...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	if stderr != "" {
		t.Logf("helm %s (stderr): %s", args[0], stderr)
	}
	return stdout
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
