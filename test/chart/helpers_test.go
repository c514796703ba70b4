// Package chart tests the Helm chart charts/coder-k8s: it renders every
// ci values file with the Helm library (as `helm template` does), checks
// the objects against each other and against the binary's own config
// loader, and installs and upgrades the chart on a real kube-apiserver.
//
// The files:
//   - helpers_test.go: rendering and values helpers, and the small helpers
//     every test shares; helpers_manifest_test.go: the parsed manifest;
//     helpers_cluster_test.go: the kube-apiserver, kubectl and helm helpers
//     of install_test.go and upgrade_test.go.
//   - render_test.go: every ci values file rendered and checked (TestCIValues
//     and its config and CRD checks), the config checksum, the chart's
//     copies of generated files, and bin/helm against the library.
//   - render_wiring_test.go: TestCIValues's checks that ports, Services,
//     probes and the objects of each mode line up.
//   - render_security_test.go: TestCIValues's pod security, Secret, TLS and
//     RBAC checks.
//   - schema_test.go: values.schema.json against the binary's config keys,
//     and misspelt values refused.
//   - install_test.go: install, upgrade and uninstall on a real
//     kube-apiserver, and the GitOps examples applied twice.
//   - upgrade_test.go: the previous release (testdata/) installed with
//     bin/helm and upgraded to this chart.
//   - crdcompat_test.go: the previous release's CRDs against the current
//     ones, with the checker in crdbreaks_test.go.
package chart

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/testenv"
)

// The release every test renders, unless it says otherwise. With the chart
// named coder-k8s, the release name is also the objects' full name.
const (
	releaseName      = "coder-k8s"
	releaseNamespace = "coder-system"
)

// repoPath returns a path inside the repository.
func repoPath(t testing.TB, elem ...string) string {
	t.Helper()
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

func chartDir(t testing.TB) string { return repoPath(t, "charts", "coder-k8s") }

// defaultKubeVersion is the Kubernetes version this module's client-go
// targets (k8s.io/client-go v0.36.3 in go.mod → v1.36.3): what `helm
// template` assumes when Helm is built like its releases are, and what
// bin/helm is built to assume. (Test binaries carry no module list, so it
// is read from go.mod.)
var defaultKubeVersion = sync.OnceValues(func() (*chartutil.KubeVersion, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "require" {
			f = f[1:]
		}
		if len(f) >= 2 && f[0] == "k8s.io/client-go" {
			v, ok := strings.CutPrefix(f[1], "v0.")
			if !ok {
				return nil, fmt.Errorf("go.mod: k8s.io/client-go %s is not a v0.x version", f[1])
			}
			return chartutil.ParseKubeVersion("v1." + v)
		}
	}
	return nil, errors.New("go.mod does not require k8s.io/client-go")
})

// renderOptions say which release to render and for which cluster.
type renderOptions struct {
	release, namespace string
	// chart is a chart directory or package; the repository's by default.
	chart string
	// kubeVersion defaults to defaultKubeVersion.
	kubeVersion *chartutil.KubeVersion
}

// render renders the chart the way `helm template --namespace ns` does:
// the Helm library's install action in client-only dry-run mode, which
// validates vals against values.schema.json first. It returns the
// manifest exactly as `helm template` prints it.
func render(t testing.TB, opts renderOptions, vals map[string]any) (string, error) {
	t.Helper()
	if opts.release == "" {
		opts.release = releaseName
	}
	if opts.namespace == "" {
		opts.namespace = releaseNamespace
	}
	if opts.kubeVersion == nil {
		kv, err := defaultKubeVersion()
		if err != nil {
			t.Fatal(err)
		}
		opts.kubeVersion = kv
	}
	if opts.chart == "" {
		opts.chart = chartDir(t)
	}
	// A fresh load every time: rendering twice must not depend on state
	// kept in the loaded chart.
	chrt := loadChart(t, opts.chart)
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.DryRunOption = "true"
	install.ClientOnly = true
	install.Replace = true
	install.IncludeCRDs = true
	install.ReleaseName = opts.release
	install.Namespace = opts.namespace
	install.KubeVersion = opts.kubeVersion
	rel, err := install.Run(chrt, deepCopy(vals))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(rel.Manifest) + "\n", nil
}

// mustRender renders or fails the test.
func mustRender(t testing.TB, opts renderOptions, vals map[string]any) *manifest {
	t.Helper()
	text, err := render(t, opts, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return parseManifest(t, text)
}

// effectiveValues are the chart's defaults overlaid with vals, as the
// templates see them in .Values.
func effectiveValues(t testing.TB, vals map[string]any) map[string]any {
	t.Helper()
	v, err := chartutil.CoalesceValues(loadChart(t, chartDir(t)), deepCopy(vals))
	if err != nil {
		t.Fatalf("coalesce values: %v", err)
	}
	return v.AsMap()
}

// ciCase is one set of values the chart is tested with.
type ciCase struct {
	name string
	// file is the ci values file; empty for the chart's own defaults.
	file string
	vals map[string]any
}

// ciCases returns the chart's defaults and every ci/*-values.yaml.
func ciCases(t testing.TB) []ciCase {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no ci values files in %s (%v)", chartDir(t), err)
	}
	cases := []ciCase{{name: "chart-defaults", vals: map[string]any{}}}
	for _, f := range files {
		cases = append(cases, ciCase{
			name: strings.TrimSuffix(filepath.Base(f), "-values.yaml"),
			file: f,
			vals: readValues(t, f),
		})
	}
	return cases
}

// ciValuesFile is the path of charts/coder-k8s/ci/<name>-values.yaml.
func ciValuesFile(t testing.TB, name string) string {
	return filepath.Join(chartDir(t), "ci", name+"-values.yaml")
}

func ciValues(t testing.TB, name string) map[string]any {
	t.Helper()
	return readValues(t, ciValuesFile(t, name))
}

func readValues(t testing.TB, path string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(path)
	if err != nil {
		t.Fatalf("read values %s: %v", path, err)
	}
	return v.AsMap()
}

// deepCopy copies a values tree so that renders cannot share state.
func deepCopy(v map[string]any) map[string]any {
	if v == nil {
		return map[string]any{}
	}
	out := make(map[string]any, len(v))
	for k, x := range v {
		out[k] = deepCopyValue(x)
	}
	return out
}

func deepCopyValue(x any) any {
	switch x := x.(type) {
	case map[string]any:
		return deepCopy(x)
	case chartutil.Values:
		return deepCopy(x)
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = deepCopyValue(e)
		}
		return out
	default:
		return x
	}
}

// merged returns base overlaid with overlay (maps merged key by key, other
// values replaced), like passing two -f files to helm.
func merged(base, overlay map[string]any) map[string]any {
	out := deepCopy(base)
	for k, v := range overlay {
		if src, ok := v.(map[string]any); ok {
			if dst, ok := out[k].(map[string]any); ok {
				out[k] = merged(dst, src)
				continue
			}
		}
		out[k] = deepCopyValue(v)
	}
	return out
}

// valuesFromYAML parses a values overlay written inline in a test.
func valuesFromYAML(t testing.TB, s string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValues([]byte(s))
	if err != nil {
		t.Fatalf("parse values: %v\n%s", err, s)
	}
	return v.AsMap()
}

// lookup returns the value at a dotted path of a values tree, or nil.
func lookup(vals map[string]any, path string) any {
	var cur any = vals
	for _, p := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func lookupString(vals map[string]any, path string) string {
	s, _ := lookup(vals, path).(string)
	return s
}

func lookupBool(vals map[string]any, path string) bool {
	b, _ := lookup(vals, path).(bool)
	return b
}

// portOf returns the port of a listen address such as ":8081"; "0" (off)
// gives 0.
func portOf(t testing.TB, addr string) int32 {
	t.Helper()
	if addr == "0" {
		return 0
	}
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		t.Fatalf("listen address %q has no port", addr)
	}
	p, err := strconv.ParseInt(addr[i+1:], 10, 32)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return int32(p)
}

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

// asFloat returns a number of a values tree or a decoded object (int,
// int64, float64 or json.Number) as a float64.
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

// toFloat is asFloat with -1 for anything that is not a number.
func toFloat(v any) float64 {
	if f, ok := asFloat(v); ok {
		return f
	}
	return -1
}

// names maps items to their names.
func names[T any](items []T, name func(T) string) []string {
	out := make([]string, 0, len(items))
	for _, i := range items {
		out = append(out, name(i))
	}
	return out
}

// crdFiles returns the CRD files of a directory of the repository (such
// as config/crd/bases), failing when it holds none.
func crdFiles(t testing.TB, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoPath(t, dir), "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s (%v)", dir, err)
	}
	return files
}

// readCRD reads a CRD file strictly.
func readCRD(t testing.TB, path string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return parseCRD(t, path, b)
}

// parseCRD decodes a CRD strictly, failing on anything else.
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

// step runs a subtest and stops the test when it fails: the steps of a
// test build on each other.
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	if !t.Run(name, f) {
		t.FailNow()
	}
}

// lineDiff shows the first lines where two texts differ.
func lineDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := 0; i < len(al) || i < len(bl); i++ {
		var x, y string
		if i < len(al) {
			x = al[i]
		}
		if i < len(bl) {
			y = bl[i]
		}
		if x != y {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, x, y)
		}
	}
	return "(identical)"
}
