package chart

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/Masterminds/semver/v3"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	h := newHelmCLI(t)
	start := time.Now()
	prevPath := testdataPath(t, previousChartFile)
	prev, cur := loadChart(t, prevPath), loadChart(t, chartDir(t))

	// The previous release installs its own CRDs.
	c := newCluster(t)
	h.kubeconfig = c.k.KubeconfigPath
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

	step(t, "install "+prev.Metadata.Version, func(t *testing.T) {
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
	step(t, "objects under the "+prev.Metadata.Version+" CRDs", func(t *testing.T) {
		if err := c.k.EnsureNamespace(ctx, objectsNamespace); err != nil {
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

	step(t, "upgrade to "+cur.Metadata.Version, func(t *testing.T) {
		start := time.Now()
		h.run(t, append([]string{"upgrade", releaseName, chartDir(t), "-n", releaseNamespace}, valueArgs...)...)
		t.Logf("helm upgrade took %s", time.Since(start).Round(time.Millisecond))
		h.wantRelease(t, 2, cur)
	})

	step(t, "every object is what the new chart renders", func(t *testing.T) {
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

	step(t, "the Deployment and config follow the new chart", func(t *testing.T) {
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
		liveFile := c.liveConfigFile(t, releaseNamespace, releaseName)
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

	step(t, "nothing of the old release is left behind", func(t *testing.T) {
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

	step(t, "objects created under "+prev.Metadata.Version+" are intact and valid", func(t *testing.T) {
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
