package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/testenv"
)

// The previous release of the chart, packaged from git (see
// testdata/README.md), and the coder.com objects a user of it would have.
const (
	previousChartFile   = "coder-k8s-0.1.0.tgz"
	previousObjectsFile = "coder-k8s-0.1.0-objects.yaml"
	// objectsNamespace holds those objects.
	objectsNamespace = "team-a"
)

// previousValues are the values files of the previous release's own ci/
// directory the upgrade is run with: a user's values written for it.
var previousValues = []string{"ci/ha-values.yaml", "ci/networkpolicy-values.yaml"}

func testdataPath(t testing.TB, name string) string {
	return repoPath(t, "test", "chart", "testdata", name)
}

func loadChart(t testing.TB, path string) *chart.Chart {
	t.Helper()
	c, err := loader.Load(path)
	if err != nil {
		t.Fatalf("load chart %s: %v", path, err)
	}
	return c
}

// chartFile returns a file packaged with a chart (ci/, files/).
func chartFile(t testing.TB, c *chart.Chart, name string) []byte {
	t.Helper()
	for _, f := range c.Files {
		if f.Name == name {
			return f.Data
		}
	}
	t.Fatalf("chart %s %s has no file %s", c.Name(), c.Metadata.Version, name)
	return nil
}

// TestChartVersionBumped: the chart in the repository is newer than the
// previous release, so `helm upgrade` and chart repositories see a new
// version (a changed chart with the old version would be ambiguous).
func TestChartVersionBumped(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	cur := loadChart(t, chartDir(t))
	pv, err := semver.StrictNewVersion(prev.Metadata.Version)
	if err != nil {
		t.Fatalf("previous chart version: %v", err)
	}
	cv, err := semver.StrictNewVersion(cur.Metadata.Version)
	if err != nil {
		t.Fatalf("chart version: %v", err)
	}
	if !cv.GreaterThan(pv) {
		t.Errorf("chart version %s is not newer than the previous release %s", cv, pv)
	}
}

// TestPreviousValuesStillWork: every values file written for the previous
// release (its ci/ files) passes the current chart's schema, and the
// config file it renders loads with the current binary's strict loader.
func TestPreviousValuesStillWork(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	var names []string
	for _, f := range prev.Files {
		if strings.HasPrefix(f.Name, "ci/") && strings.HasSuffix(f.Name, "-values.yaml") {
			names = append(names, f.Name)
		}
	}
	if len(names) == 0 {
		t.Fatalf("the previous chart holds no ci values files")
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			text, err := render(t, renderOptions{}, valuesFromYAML(t, string(chartFile(t, prev, name))))
			if err != nil {
				t.Fatalf("values written for chart %s no longer render: %v", prev.Metadata.Version, err)
			}
			loadConfig(t, configFile(t, parseManifest(t, text)))
		})
	}
}

// TestUpgrade installs the previous release with bin/helm on a real
// kube-apiserver, creates coder.com objects under its CRDs, upgrades to
// the chart in the repository with the same values files, and checks what
// a user would: the release is deployed at the new version, every object
// is what the new chart renders, nothing of the old release is left
// behind, and the existing objects lost no field and still validate.
func TestUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("needs kube-apiserver, etcd, kubectl and helm from bin/")
	}
	helmBin, err := testenv.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	prevPath := testdataPath(t, previousChartFile)
	prev, cur := loadChart(t, prevPath), loadChart(t, chartDir(t))

	// No CRDs from the test stack: the previous release installs its own.
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{CRDDirs: []string{t.TempDir()}})
	t.Logf("kube-apiserver up in %s", time.Since(start).Round(time.Millisecond))
	c := newCluster(t, k)
	h := &helmCLI{bin: helmBin, kubeconfig: k.KubeconfigPath, home: t.TempDir()}
	ctx := context.Background()

	// The user's values: files of the previous release, passed to both
	// install and upgrade as `helm upgrade -f` users do.
	var valueArgs []string
	vals := map[string]any{}
	for _, name := range previousValues {
		data := chartFile(t, prev, name)
		f := filepath.Join(t.TempDir(), filepath.Base(name))
		if err := os.WriteFile(f, data, 0o600); err != nil {
			t.Fatal(err)
		}
		valueArgs = append(valueArgs, "-f", f)
		vals = merged(vals, valuesFromYAML(t, string(data)))
	}
	oldM := mustRender(t, renderOptions{chart: prevPath, kubeVersion: c.kubeVersion}, vals)
	newM := mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, vals)

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	step("install "+prev.Metadata.Version, func(t *testing.T) {
		h.run(t, append([]string{"install", releaseName, prevPath, "-n", releaseNamespace, "--create-namespace"}, valueArgs...)...)
		h.wantRelease(t, 1, prev)
		// The previous release's objects are all there before the upgrade,
		// so that the checks after it compare against a real starting point.
		for _, o := range oldM.objects {
			if missing := missingFields("", o.u.Object, c.get(t, o.u).Object); len(missing) > 0 {
				t.Errorf("%s after install differs from chart %s: %v", o, prev.Metadata.Version, missing)
			}
		}
	})

	// What the user created and the previous operator wrote, read back.
	before := map[string]*unstructured.Unstructured{}
	step("objects under the "+prev.Metadata.Version+" CRDs", func(t *testing.T) {
		if err := k.EnsureNamespace(ctx, objectsNamespace); err != nil {
			t.Fatal(err)
		}
		for _, o := range previousObjects(t) {
			cl, _ := c.client(t, o.GroupVersionKind(), o.GetNamespace())
			if _, err := cl.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "user"}); err != nil {
				t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			// The status as the previous operator wrote it.
			live, err := cl.ApplyStatus(ctx, o.GetName(), statusOnly(o), metav1.ApplyOptions{FieldManager: "coder-k8s", Force: true})
			if err != nil {
				t.Fatalf("apply status of %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			// Every field of the file was kept: the fixture is valid for
			// the previous CRDs, or the comparison later would be weaker.
			if missing := missingFields("", o.Object, live.Object); len(missing) > 0 {
				t.Fatalf("%s %s: the %s CRD dropped or changed %v", o.GetKind(), o.GetName(), prev.Metadata.Version, missing)
			}
			before[o.GetKind()+" "+o.GetName()] = live
		}
	})

	step("upgrade to "+cur.Metadata.Version, func(t *testing.T) {
		start := time.Now()
		h.run(t, append([]string{"upgrade", releaseName, chartDir(t), "-n", releaseNamespace}, valueArgs...)...)
		t.Logf("helm upgrade took %s", time.Since(start).Round(time.Millisecond))
		h.wantRelease(t, 2, cur)
	})

	step("every object is what the new chart renders", func(t *testing.T) {
		for _, o := range newM.objects {
			if missing := missingFields("", o.u.Object, c.get(t, o.u).Object); len(missing) > 0 {
				t.Errorf("%s differs from chart %s: %v", o, cur.Metadata.Version, missing)
			}
		}
		// The CRDs are the new ones (helm upgrade does not update CRDs kept
		// in a chart's crds/ directory; this chart renders them as
		// templates so that it does).
		for _, o := range newM.all("CustomResourceDefinition") {
			live := c.get(t, o.u)
			if lv, rv := live.GetLabels()["helm.sh/chart"], o.u.GetLabels()["helm.sh/chart"]; lv != rv {
				t.Errorf("CRD %s: label helm.sh/chart %q, want %q", o.u.GetName(), lv, rv)
			}
		}
	})

	step("the Deployment and config follow the new chart", func(t *testing.T) {
		wantD, wantC := deployment(t, newM)
		oldD, oldC := deployment(t, oldM)
		d := c.deployment(t)
		if len(d.Spec.Template.Spec.Containers) != 1 {
			t.Fatalf("live Deployment has %d containers", len(d.Spec.Template.Spec.Containers))
		}
		live := d.Spec.Template.Spec.Containers[0]
		// The binary follows the chart: the image tag defaults to appVersion.
		wantImage := ":" + cur.Metadata.AppVersion
		if !strings.HasSuffix(live.Image, wantImage) || live.Image != wantC.Image {
			t.Errorf("live image %s, want %s (appVersion %s)", live.Image, wantC.Image, cur.Metadata.AppVersion)
		}
		if cur.Metadata.AppVersion != prev.Metadata.AppVersion && live.Image == oldC.Image {
			t.Errorf("the image is still %s of app version %s", live.Image, prev.Metadata.AppVersion)
		}
		// Lists the chart owns entirely are exactly the new ones: an
		// argument, variable, mount or volume the new chart dropped is gone.
		// (Their contents were compared above; the API adds defaults.)
		for _, l := range []struct {
			name      string
			got, want any
		}{
			{"args", live.Args, wantC.Args},
			{"env", names(live.Env, envName), names(wantC.Env, envName)},
			{"volumeMounts", names(live.VolumeMounts, mountName), names(wantC.VolumeMounts, mountName)},
			{"ports", names(live.Ports, portName), names(wantC.Ports, portName)},
			{"volumes", names(d.Spec.Template.Spec.Volumes, volumeName), names(wantD.Spec.Template.Spec.Volumes, volumeName)},
			{"pod labels", d.Spec.Template.Labels, wantD.Spec.Template.Labels},
			{"pod annotations", d.Spec.Template.Annotations, wantD.Spec.Template.Annotations},
			{"labels", d.Labels, wantD.Labels},
		} {
			if !reflect.DeepEqual(l.got, l.want) && !(isEmpty(l.got) && isEmpty(l.want)) {
				t.Errorf("live Deployment %s %v, want %v", l.name, l.got, l.want)
			}
		}
		if want := "coder-k8s-" + cur.Metadata.Version; d.Labels["helm.sh/chart"] != want {
			t.Errorf("live Deployment label helm.sh/chart %q, want %q", d.Labels["helm.sh/chart"], want)
		}
		// The config file is the new chart's, it loads with this binary's
		// strict loader, and the pods roll exactly when it changed.
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
		u.SetNamespace(releaseNamespace)
		u.SetName(releaseName)
		liveFile, _, _ := unstructured.NestedString(c.get(t, u).Object, "data", "config.yaml")
		if liveFile != configFile(t, newM) {
			t.Errorf("live config.yaml is not the new chart's:\n%s", lineDiff(configFile(t, newM), liveFile))
		}
		loadConfig(t, liveFile)
		configChanged := configFile(t, oldM) != configFile(t, newM)
		rolled := d.Spec.Template.Annotations["checksum/config"] != oldD.Spec.Template.Annotations["checksum/config"]
		if configChanged != rolled {
			t.Errorf("config file changed %v, but checksum/config changed %v", configChanged, rolled)
		}
		t.Logf("image %s → %s; config file changed: %v", oldC.Image, live.Image, configChanged)
	})

	step("nothing of the old release is left behind", func(t *testing.T) {
		owned := h.releaseObjects(t, c)
		manifestKeys := map[string]bool{}
		for _, o := range parseManifest(t, h.run(t, "get", "manifest", releaseName, "-n", releaseNamespace)).objects {
			manifestKeys[objKey(o.u)] = true
		}
		rendered := map[string]bool{}
		for _, o := range newM.objects {
			rendered[objKey(o.u)] = true
		}
		if !maps.Equal(manifestKeys, rendered) {
			t.Errorf("helm's manifest of the release %v is not the chart's render %v", slices.Sorted(maps.Keys(manifestKeys)), slices.Sorted(maps.Keys(rendered)))
		}
		for key := range owned {
			if !rendered[key] {
				t.Errorf("%s is annotated as part of release %s but chart %s does not render it: orphaned by the upgrade", key, releaseName, cur.Metadata.Version)
			}
		}
		for key := range rendered {
			if !owned[key] {
				t.Errorf("%s is rendered but not live with release %s's annotations", key, releaseName)
			}
		}
		// What only the old chart rendered is gone, unless Helm keeps it.
		var gone []string
		for _, o := range oldM.objects {
			if rendered[objKey(o.u)] || o.u.GetAnnotations()["helm.sh/resource-policy"] == "keep" {
				continue
			}
			gone = append(gone, objKey(o.u))
			cl, _ := c.client(t, o.u.GroupVersionKind(), o.u.GetNamespace())
			if _, err := cl.Get(ctx, o.u.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("%s of chart %s, which %s does not render, still exists (%v)", objKey(o.u), prev.Metadata.Version, cur.Metadata.Version, err)
			}
		}
		t.Logf("%d objects in the release; %d of chart %s not rendered by %s: %v", len(owned), len(gone), prev.Metadata.Version, cur.Metadata.Version, gone)
	})

	step("objects created under "+prev.Metadata.Version+" are intact and valid", func(t *testing.T) {
		for _, o := range previousObjects(t) {
			cl, _ := c.client(t, o.GroupVersionKind(), o.GetNamespace())
			live, err := cl.Get(ctx, o.GetName(), metav1.GetOptions{})
			if err != nil {
				t.Fatalf("get %s %s after the upgrade: %v", o.GetKind(), o.GetName(), err)
			}
			// Every field is still there with its value (a field the new
			// schema dropped would be pruned when read from etcd); new
			// defaults may add fields.
			old := before[o.GetKind()+" "+o.GetName()]
			for _, part := range []string{"spec", "status"} {
				if missing := missingFields(part, old.Object[part], live.Object[part]); len(missing) > 0 {
					t.Errorf("%s %s lost or changed after the upgrade: %v", o.GetKind(), o.GetName(), missing)
				}
			}
			// Still valid as a new object (full validation, no ratcheting
			// of unchanged fields): a dry-run create of a copy.
			cp := live.DeepCopy()
			cp.SetName(o.GetName() + "-copy")
			cp.SetResourceVersion("")
			cp.SetUID("")
			cp.SetManagedFields(nil)
			cp.SetCreationTimestamp(metav1.Time{})
			cp.SetGeneration(0)
			delete(cp.Object, "status")
			if _, err := cl.Create(ctx, cp, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Errorf("%s %s no longer validates: %v", o.GetKind(), o.GetName(), err)
			}
			// And the operator can still write it: a finalizer and a status.
			upd := live.DeepCopy()
			upd.SetFinalizers(append(upd.GetFinalizers(), "example.com/upgrade-test"))
			if _, err := cl.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
				t.Errorf("update %s %s: %v", o.GetKind(), o.GetName(), err)
			}
			if _, err := cl.ApplyStatus(ctx, o.GetName(), statusOnly(o), metav1.ApplyOptions{FieldManager: "coder-k8s", Force: true}); err != nil {
				t.Errorf("apply status of %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
		// kubectl finds them by the names users type.
		out := c.kubectl(t, "get", "ccp,cprov,cwp", "-n", objectsNamespace, "-o", "name")
		for _, o := range previousObjects(t) {
			want := strings.ToLower(o.GetKind()) + ".coder.com/" + o.GetName()
			if !strings.Contains(out, want+"\n") {
				t.Errorf("kubectl get ccp,cprov,cwp does not list %s:\n%s", want, out)
			}
		}
		// The objects' stored versions are all still served.
		for _, o := range newM.all("CustomResourceDefinition") {
			crd := fromUnstructured[apiextensionsv1.CustomResourceDefinition](t, c.get(t, o.u))
			for _, v := range crd.Status.StoredVersions {
				if !slices.ContainsFunc(crd.Spec.Versions, func(sv apiextensionsv1.CustomResourceDefinitionVersion) bool { return sv.Name == v && sv.Served }) {
					t.Errorf("CRD %s: stored version %s is not served", crd.Name, v)
				}
			}
		}
	})
	t.Logf("total %s", time.Since(start).Round(time.Millisecond))
}

// statusOnly is the status of an object as its controller applies it.
func statusOnly(o *unstructured.Unstructured) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"status": o.Object["status"]}}
	u.SetGroupVersionKind(o.GroupVersionKind())
	u.SetNamespace(o.GetNamespace())
	u.SetName(o.GetName())
	return u
}

func names[T any](items []T, name func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, i := range items {
		out = append(out, name(i))
	}
	return out
}

func envName(e corev1.EnvVar) string         { return e.Name }
func mountName(m corev1.VolumeMount) string  { return m.Name + " at " + m.MountPath }
func portName(p corev1.ContainerPort) string { return fmt.Sprintf("%s %d", p.Name, p.ContainerPort) }
func volumeName(v corev1.Volume) string      { return v.Name }

// previousObjects reads testdata's coder.com objects.
func previousObjects(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	b, err := os.ReadFile(testdataPath(t, previousObjectsFile))
	if err != nil {
		t.Fatal(err)
	}
	m := parseManifest(t, string(b))
	var out []*unstructured.Unstructured
	for _, o := range m.objects {
		out = append(out, o.u)
	}
	return out
}

// objKey identifies an object across versions of its kind.
func objKey(u *unstructured.Unstructured) string {
	gk := u.GroupVersionKind().GroupKind()
	if u.GetNamespace() == "" {
		return gk.String() + " " + u.GetName()
	}
	return gk.String() + " " + u.GetNamespace() + "/" + u.GetName()
}

// isEmpty: nil, an empty map or slice, or a zero scalar (what Go types
// with omitempty leave out when the API server decodes and encodes).
func isEmpty(v any) bool {
	if v == nil {
		return true
	}
	return reflect.ValueOf(v).IsZero() || (reflect.ValueOf(v).Kind() == reflect.Map || reflect.ValueOf(v).Kind() == reflect.Slice) && reflect.ValueOf(v).Len() == 0
}

// missingFields lists where got does not hold want: a field of want that
// is absent from got or has another value. Fields only in got (server
// defaults, metadata the API adds) are fine; lists must have want's length
// and hold want's elements in order; an empty or zero value in want
// matches an absent field (the API drops them).
func missingFields(path string, want, got any) []string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			if len(w) == 0 && got == nil {
				return nil
			}
			return []string{fmt.Sprintf("%s: %v, want an object", orRoot(path), got)}
		}
		var out []string
		for _, k := range slices.Sorted(maps.Keys(w)) {
			gv, present := g[k]
			if !present {
				if isEmpty(w[k]) {
					continue
				}
				out = append(out, join(path, k)+" missing")
				continue
			}
			out = append(out, missingFields(join(path, k), w[k], gv)...)
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			if len(w) == 0 && got == nil {
				return nil
			}
			return []string{fmt.Sprintf("%s: %d elements %v, want %d", orRoot(path), len(g), got, len(w))}
		}
		var out []string
		for i := range w {
			out = append(out, missingFields(fmt.Sprintf("%s[%d]", path, i), w[i], g[i])...)
		}
		return out
	default:
		if !sameScalar(want, got) {
			return []string{fmt.Sprintf("%s: %v, want %v", orRoot(path), got, want)}
		}
		return nil
	}
}

// sameScalar compares JSON scalars, numbers by value (int64 and float64
// both come out of decoders).
func sameScalar(a, b any) bool {
	if fa, ok := asFloat(a); ok {
		fb, ok := asFloat(b)
		return ok && fa == fb
	}
	return reflect.DeepEqual(a, b)
}

func asFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "(root)"
	}
	return path
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

// TestCRDCompatibility compares every CRD of the previous release with
// the one users get now, from the chart and from config/crd/bases: objects
// stored under the old CRD must stay readable and valid, so no version
// may stop being served, no field may go, change type or lose enum
// values, and no field may become required where old objects exist.
func TestCRDCompatibility(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	old := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, f := range prev.Files {
		if strings.HasPrefix(f.Name, "files/crds/") && strings.HasSuffix(f.Name, ".yaml") {
			crd := parseCRD(t, f.Name, f.Data)
			old[crd.Name] = crd
		}
	}
	if len(old) == 0 {
		t.Fatal("the previous chart holds no CRDs in files/crds")
	}
	for _, dir := range []string{"charts/coder-k8s/files/crds", "config/crd/bases"} {
		t.Run(dir, func(t *testing.T) {
			files, err := filepath.Glob(filepath.Join(repoPath(t, dir), "*.yaml"))
			if err != nil || len(files) == 0 {
				t.Fatalf("no CRDs in %s (%v)", dir, err)
			}
			cur := map[string]*apiextensionsv1.CustomResourceDefinition{}
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				crd := parseCRD(t, f, b)
				cur[crd.Name] = crd
			}
			for _, name := range slices.Sorted(maps.Keys(old)) {
				for _, b := range crdBreaks(old[name], cur[name]) {
					t.Errorf("%s: %s", name, b)
				}
			}
		})
	}
}

// TestCRDCompatibilityCheckFindsBreaks: the check above reports each kind
// of break with the field's path, and accepts compatible changes.
func TestCRDCompatibilityCheckFindsBreaks(t *testing.T) {
	prev := loadChart(t, testdataPath(t, previousChartFile))
	old := parseCRD(t, "codercontrolplanes", chartFile(t, prev, "files/crds/coder.com_codercontrolplanes.yaml"))
	// edit changes a copy of the CRD's first version as unstructured
	// data; at is the path of a field of spec in the schema.
	edit := func(f func(version map[string]any)) *apiextensionsv1.CustomResourceDefinition {
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(old.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		versions, _, _ := unstructured.NestedSlice(m, "spec", "versions")
		v0 := versions[0].(map[string]any)
		f(v0)
		versions[0] = v0
		if err := unstructured.SetNestedSlice(m, versions, "spec", "versions"); err != nil {
			t.Fatal(err)
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, crd); err != nil {
			t.Fatal(err)
		}
		return crd
	}
	at := func(fields ...string) []string {
		p := []string{"schema", "openAPIV3Schema", "properties", "spec"}
		for _, f := range fields {
			p = append(p, "properties", f)
		}
		return p
	}
	set := func(v map[string]any, value any, path ...string) {
		if err := unstructured.SetNestedField(v, value, path...); err != nil {
			t.Fatalf("set %v: %v", path, err)
		}
	}
	get := func(v map[string]any, path ...string) any {
		x, ok, err := unstructured.NestedFieldNoCopy(v, path...)
		if !ok || err != nil {
			t.Fatalf("no field %v in the CRD (%v)", path, err)
		}
		return x
	}

	if b := crdBreaks(old, old.DeepCopy()); len(b) > 0 {
		t.Errorf("an unchanged CRD breaks: %v", b)
	}
	v := old.Spec.Versions[0].Name
	for _, tc := range []struct {
		name string
		crd  *apiextensionsv1.CustomResourceDefinition
		want []string // nil: compatible
	}{{
		name: "field removed",
		crd: edit(func(v map[string]any) {
			get(v, at("operatorAccess", "tokenLifetime")...)
			unstructured.RemoveNestedField(v, at("operatorAccess", "tokenLifetime")...)
		}),
		want: []string{v + ": field spec.operatorAccess.tokenLifetime removed"},
	}, {
		name: "field removed inside a list",
		crd: edit(func(v map[string]any) {
			p := append(at("env"), "items", "properties", "valueFrom")
			get(v, p...)
			unstructured.RemoveNestedField(v, p...)
		}),
		want: []string{v + ": field spec.env[].valueFrom removed"},
	}, {
		name: "new required field",
		crd: edit(func(v map[string]any) {
			req, _, _ := unstructured.NestedSlice(v, append(at(), "required")...)
			set(v, append(slices.Clone(req), "accessURL"), append(at(), "required")...)
		}),
		want: []string{v + ": spec now requires accessURL"},
	}, {
		name: "type changed",
		crd: edit(func(v map[string]any) {
			set(v, "string", append(at("replicas"), "type")...)
			unstructured.RemoveNestedField(v, append(at("replicas"), "format")...)
		}),
		want: []string{v + ": field spec.replicas changed type from integer to string"},
	}, {
		name: "enum value removed",
		crd: edit(func(v map[string]any) {
			enum := get(v, append(at("service", "type"), "enum")...).([]any)
			set(v, slices.DeleteFunc(slices.Clone(enum), func(e any) bool { return e == "LoadBalancer" }), append(at("service", "type"), "enum")...)
		}),
		want: []string{v + `: field spec.service.type no longer accepts "LoadBalancer"`},
	}, {
		name: "version no longer served",
		crd:  edit(func(v map[string]any) { set(v, false, "served") }),
		want: []string{"version " + v + " is no longer served"},
	}, {
		name: "short name removed",
		crd: func() *apiextensionsv1.CustomResourceDefinition {
			crd := old.DeepCopy()
			crd.Spec.Names.ShortNames = nil
			return crd
		}(),
		want: []string{"short name ccp removed"},
	}, {
		name: "new optional field with required fields of its own",
		crd: edit(func(v map[string]any) {
			set(v, map[string]any{
				"type":       "object",
				"required":   []any{"name"},
				"properties": map[string]any{"name": map[string]any{"type": "string"}},
			}, at("newThing")...)
		}),
	}, {
		name: "enum value added",
		crd: edit(func(v map[string]any) {
			enum := get(v, append(at("service", "type"), "enum")...).([]any)
			set(v, append(slices.Clone(enum), "ExternalName"), append(at("service", "type"), "enum")...)
		}),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := crdBreaks(old, tc.crd)
			if !slices.Equal(got, tc.want) {
				t.Errorf("breaks %q, want %q", got, tc.want)
			}
			// The original is untouched, so the cases are independent.
			if b := crdBreaks(old, old.DeepCopy()); len(b) > 0 {
				t.Fatalf("the case changed the original CRD: %v", b)
			}
		})
	}
}

func parseCRD(t testing.TB, name string, b []byte) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(b, crd); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if crd.Kind != "CustomResourceDefinition" || crd.Name == "" {
		t.Fatalf("%s is not a CRD (kind %q, name %q)", name, crd.Kind, crd.Name)
	}
	return crd
}

// crdBreaks lists what cur breaks for objects created under old.
func crdBreaks(old, cur *apiextensionsv1.CustomResourceDefinition) []string {
	if cur == nil {
		return []string{"CRD removed"}
	}
	var out []string
	o, c := old.Spec, cur.Spec
	for _, f := range []struct{ what, old, cur string }{
		{"group", o.Group, c.Group},
		{"kind", o.Names.Kind, c.Names.Kind},
		{"plural", o.Names.Plural, c.Names.Plural},
		{"scope", string(o.Scope), string(c.Scope)},
	} {
		if f.old != f.cur {
			out = append(out, fmt.Sprintf("%s changed from %s to %s", f.what, f.old, f.cur))
		}
	}
	// Names users type: kubectl get ccp, kubectl get coder.
	for _, n := range o.Names.ShortNames {
		if !slices.Contains(c.Names.ShortNames, n) {
			out = append(out, "short name "+n+" removed")
		}
	}
	for _, n := range o.Names.Categories {
		if !slices.Contains(c.Names.Categories, n) {
			out = append(out, "category "+n+" removed")
		}
	}
	for _, ov := range o.Versions {
		i := slices.IndexFunc(c.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == ov.Name })
		if i < 0 {
			out = append(out, "version "+ov.Name+" removed")
			continue
		}
		cv := c.Versions[i]
		if (ov.Served || ov.Storage) && !cv.Served {
			out = append(out, "version "+ov.Name+" is no longer served")
		}
		if ov.Schema == nil || ov.Schema.OpenAPIV3Schema == nil {
			continue
		}
		if cv.Schema == nil || cv.Schema.OpenAPIV3Schema == nil {
			out = append(out, ov.Name+": schema removed")
			continue
		}
		for _, b := range schemaBreaks("", ov.Schema.OpenAPIV3Schema, cv.Schema.OpenAPIV3Schema) {
			out = append(out, ov.Name+": "+b)
		}
	}
	return out
}

// schemaBreaks walks an old schema and the new one at the same path.
func schemaBreaks(path string, old, cur *apiextensionsv1.JSONSchemaProps) []string {
	var out []string
	field := func(msg string, args ...any) {
		out = append(out, fmt.Sprintf("field %s "+msg, append([]any{orRoot(path)}, args...)...))
	}
	if old.Type != "" && cur.Type != old.Type {
		field("changed type from %s to %s", old.Type, cur.Type)
		return out
	}
	if len(old.Enum) > 0 || len(cur.Enum) > 0 {
		if len(old.Enum) == 0 {
			field("is now restricted to %d values", len(cur.Enum))
		}
		for _, e := range old.Enum {
			if len(cur.Enum) > 0 && !slices.ContainsFunc(cur.Enum, func(x apiextensionsv1.JSON) bool { return bytes.Equal(x.Raw, e.Raw) }) {
				field("no longer accepts %s", e.Raw)
			}
		}
	}
	if isTrue(old.XPreserveUnknownFields) && !isTrue(cur.XPreserveUnknownFields) {
		field("no longer preserves unknown fields")
	}
	for _, r := range cur.Required {
		if !slices.Contains(old.Required, r) {
			out = append(out, fmt.Sprintf("%s now requires %s", orRoot(path), r))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(old.Properties)) {
		op := old.Properties[name]
		cp, ok := cur.Properties[name]
		if !ok {
			if !isTrue(cur.XPreserveUnknownFields) {
				out = append(out, fmt.Sprintf("field %s removed", join(path, name)))
			}
			continue
		}
		out = append(out, schemaBreaks(join(path, name), &op, &cp)...)
	}
	if old.Items != nil && old.Items.Schema != nil {
		if cur.Items == nil || cur.Items.Schema == nil {
			field("no longer describes its items")
		} else {
			out = append(out, schemaBreaks(path+"[]", old.Items.Schema, cur.Items.Schema)...)
		}
	}
	if old.AdditionalProperties != nil && old.AdditionalProperties.Schema != nil {
		if cur.AdditionalProperties == nil || cur.AdditionalProperties.Schema == nil {
			if cur.AdditionalProperties == nil || !cur.AdditionalProperties.Allows {
				field("no longer allows its map's keys")
			}
		} else {
			out = append(out, schemaBreaks(path+".*", old.AdditionalProperties.Schema, cur.AdditionalProperties.Schema)...)
		}
	}
	return out
}

func isTrue(b *bool) bool { return b != nil && *b }
