package chart

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/config"
)

// TestCIValues renders the chart's defaults and every ci values file and
// checks what a user would otherwise find out only in a cluster: the
// config file the binary would refuse, ports that do not line up, objects
// the mode does not need, weaker pod security, a token in the ConfigMap.
func TestCIValues(t *testing.T) {
	for _, c := range ciCases(t) {
		t.Run(c.name, func(t *testing.T) {
			first, err := render(t, renderOptions{}, c.vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			second, err := render(t, renderOptions{}, c.vals)
			if err != nil {
				t.Fatalf("render again: %v", err)
			}
			if first != second {
				t.Fatalf("rendering is not deterministic: two renders differ\n%s", lineDiff(first, second))
			}
			m := parseManifest(t, first)
			vals := effectiveValues(t, c.vals)
			cfg := loadConfig(t, configFile(t, m))
			r := &rendered{m: m, vals: vals, cfg: cfg}
			r.deployment, r.container = deployment(t, m)
			r.ports = map[string]int32{}
			for _, p := range r.container.Ports {
				r.ports[p.Name] = p.ContainerPort
			}
			t.Logf("mode %s, tls.mode %s: %s", cfg.App, lookupString(vals, "tls.mode"), strings.Join(m.kinds(), ", "))

			t.Run("config file", r.checkConfig)
			t.Run("ports agree", r.checkPorts)
			t.Run("objects follow the mode", r.checkModeObjects)
			t.Run("pod security", r.checkPodSecurity)
			t.Run("no secret outside Secrets", r.checkSecrets)
			t.Run("TLS", r.checkTLS)
			t.Run("RBAC", r.checkRBAC)
			t.Run("CRDs", r.checkCRDs)
		})
	}
}

// rendered is one rendered ci case.
type rendered struct {
	m          *manifest
	vals       map[string]any // the chart's defaults overlaid with the case's values
	cfg        *config.Configuration
	deployment *appsv1.Deployment
	container  *corev1.Container
	ports      map[string]int32 // container port name → number
}

func (r *rendered) runsController() bool {
	return r.cfg.App == config.AppAll || r.cfg.App == config.AppController
}

func (r *rendered) runsAggregated() bool {
	return r.cfg.App == config.AppAll || r.cfg.App == config.AppAggregatedAPIServer
}

// runsAdmission: the aggregated API server runs the admission chain.
func (r *rendered) runsAdmission() bool {
	return r.runsAggregated() && r.cfg.AggregatedAPIServer.Admission.Enabled
}

func (r *rendered) runsMCP() bool {
	return r.cfg.App == config.AppAll || r.cfg.App == config.AppMCPHTTP
}

func (r *rendered) servesMetrics() bool {
	return r.cfg.Controller.MetricsBindAddress != "0"
}

func (r *rendered) podLabels() map[string]string { return r.deployment.Spec.Template.Labels }

func (r *rendered) serviceAccount() string { return r.deployment.Spec.Template.Spec.ServiceAccountName }

// mountedSecret returns the Secret volume mounted at dir (and its items).
func (r *rendered) mountedSecret(t *testing.T, dir string) *corev1.SecretVolumeSource {
	t.Helper()
	for _, vm := range r.container.VolumeMounts {
		if path.Clean(vm.MountPath) != path.Clean(dir) {
			continue
		}
		if vm.SubPath != "" {
			t.Errorf("volume %s is mounted at %s with subPath: renewed files would not reach the pod", vm.Name, dir)
		}
		for _, v := range r.deployment.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name {
				if v.Secret == nil {
					t.Fatalf("volume %s mounted at %s is not a Secret volume", v.Name, dir)
				}
				return v.Secret
			}
		}
		t.Fatalf("volume mount %s names no volume", vm.Name)
	}
	t.Fatalf("nothing is mounted at %s (mounts: %+v)", dir, r.container.VolumeMounts)
	return nil
}

// checkConfig: the ConfigMap's file loaded with the binary's strict loader
// (done by loadConfig), carries the envelope, follows the values, and is
// the file the container reads.
func (r *rendered) checkConfig(t *testing.T) {
	var raw map[string]any
	if err := yaml.Unmarshal([]byte(configFile(t, r.m)), &raw); err != nil {
		t.Fatal(err)
	}
	if raw["apiVersion"] != config.APIVersion || raw["kind"] != config.Kind {
		t.Errorf("config file envelope: apiVersion %v, kind %v; want %s %s", raw["apiVersion"], raw["kind"], config.APIVersion, config.Kind)
	}
	if mode := lookupString(r.vals, "mode"); string(r.cfg.App) != mode {
		t.Errorf("config app %q, values mode %q", r.cfg.App, mode)
	}
	for key, want := range map[string]any{
		"logging.level":  r.cfg.Logging.Level,
		"logging.format": r.cfg.Logging.Format,
		"mcp.readOnly":   r.cfg.MCP.ReadOnly,
	} {
		if v := lookup(r.vals, "config."+key); v != nil && v != want {
			t.Errorf("config.%s is %v in the values but %v in the loaded file", key, v, want)
		}
	}

	// The container reads this file: --config names it, in the directory
	// the ConfigMap is mounted at, without subPath (so updates arrive).
	args := r.container.Args
	i := slices.Index(args, "--config")
	if i < 0 || i+1 >= len(args) {
		t.Fatalf("container args %q have no --config", args)
	}
	file := args[i+1]
	cm := one[*corev1.ConfigMap](t, r.m, "ConfigMap")
	var mounted bool
	for _, vm := range r.container.VolumeMounts {
		if vm.MountPath != path.Dir(file) {
			continue
		}
		for _, v := range r.deployment.Spec.Template.Spec.Volumes {
			if v.Name == vm.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && vm.SubPath == "" && path.Base(file) == "config.yaml" {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Errorf("--config %s is not config.yaml of ConfigMap %s mounted as a directory", file, cm.Name)
	}

	// Leader election: the Lease the config names is the one the Role
	// grants, in the namespace the config uses.
	if r.runsController() {
		le := r.cfg.Controller.LeaderElection
		if !le.Enabled {
			t.Fatalf("leader election is off")
		}
		ns := le.Namespace
		if ns == "" {
			ns = releaseNamespace
		}
		var granted bool
		for _, role := range typedAll[*rbacv1.Role](t, r.m, "Role") {
			for _, rule := range role.Rules {
				if role.Namespace == ns && slices.Contains(rule.Resources, "leases") && slices.Contains(rule.ResourceNames, le.LeaseName) &&
					slices.Contains(rule.Verbs, "update") {
					granted = true
				}
			}
		}
		if !granted {
			t.Errorf("no Role in %s grants update on Lease %q", ns, le.LeaseName)
		}
	}
}

// checkCRDs: the rendered CRDs are config/crd/bases with the chart's
// labels and the keep annotation.
func (r *rendered) checkCRDs(t *testing.T) {
	crds := typedAll[*apiextensionsv1.CustomResourceDefinition](t, r.m, "CustomResourceDefinition")
	if !lookupBool(r.vals, "crds.enabled") {
		return
	}
	files := crdFiles(t, "config/crd/bases")
	if len(crds) != len(files) {
		t.Fatalf("%d CRDs rendered, %d in config/crd/bases", len(crds), len(files))
	}
	for _, f := range files {
		want := readCRD(t, f)
		i := slices.IndexFunc(crds, func(c *apiextensionsv1.CustomResourceDefinition) bool { return c.Name == want.Name })
		if i < 0 {
			t.Errorf("CRD %s (%s) is not rendered", want.Name, filepath.Base(f))
			continue
		}
		got := crds[i]
		if !reflect.DeepEqual(got.Spec, want.Spec) {
			t.Errorf("CRD %s spec differs from %s", want.Name, filepath.Base(f))
		}
		for k, v := range want.Annotations {
			if got.Annotations[k] != v {
				t.Errorf("CRD %s lost annotation %s=%s", want.Name, k, v)
			}
		}
		if keep := got.Annotations["helm.sh/resource-policy"] == "keep"; keep != lookupBool(r.vals, "crds.keep") {
			t.Errorf("CRD %s keep annotation %v, values crds.keep %v", want.Name, keep, lookupBool(r.vals, "crds.keep"))
		}
		if got.Labels["app.kubernetes.io/instance"] != releaseName {
			t.Errorf("CRD %s labels %v lack the release", want.Name, got.Labels)
		}
	}
}

// TestChecksumFollowsConfig: pods roll exactly when the config file
// changes.
func TestChecksumFollowsConfig(t *testing.T) {
	checksum := func(overlay string) (string, string) {
		m := mustRender(t, renderOptions{}, valuesFromYAML(t, overlay))
		d, _ := deployment(t, m)
		sum := d.Spec.Template.Annotations["checksum/config"]
		if sum == "" {
			t.Fatalf("no checksum/config annotation with values %q", overlay)
		}
		return sum, configFile(t, m)
	}
	base, baseFile := checksum("{}")
	if h := sha256.Sum256([]byte(strings.TrimSuffix(baseFile, "\n"))); hex.EncodeToString(h[:]) != base {
		t.Errorf("checksum/config %s is not the SHA-256 of the mounted config file", base)
	}
	for _, c := range []struct {
		name, overlay string
		changes       bool
	}{
		{"a config value", "config: {logging: {level: debug}}", true},
		{"a nested config value", "config: {aggregatedAPIServer: {templateBuildWait: {timeout: 10m}}}", true},
		{"a port (rendered into the config)", "ports: {mcp: 9999}", true},
		{"the TLS mode (rendered into the config)", "tls: {mode: insecure}", true},
		{"metrics off (rendered into the config)", "metrics: {enabled: false}", true},
		{"replicas", "replicas: 3", false},
		{"a pod annotation", "podAnnotations: {example.com/team: platform}", false},
		{"resources", "resources: {requests: {cpu: 1}}", false},
	} {
		sum, file := checksum(c.overlay)
		if changed := sum != base; changed != c.changes {
			t.Errorf("changing %s (%s): checksum changed %v, want %v", c.name, c.overlay, changed, c.changes)
		}
		if fileChanged := file != baseFile; fileChanged != c.changes {
			t.Errorf("changing %s: config file changed %v, want %v", c.name, fileChanged, c.changes)
		}
	}
}

// TestChartFilesInSync: the chart's copies of the CRDs and the
// components' roles are byte-identical to the generated files (`make generate`).
func TestChartFilesInSync(t *testing.T) {
	bases := crdFiles(t, "config/crd/bases")
	copies, _ := filepath.Glob(filepath.Join(chartDir(t), "files", "crds", "*.yaml"))
	if !slices.Equal(names(bases, filepath.Base), names(copies, filepath.Base)) {
		t.Errorf("charts/coder-k8s/files/crds holds %v, config/crd/bases %v: run `make generate`", names(copies, filepath.Base), names(bases, filepath.Base))
	}
	var pairs [][2]string
	for _, c := range rbacComponents {
		pairs = append(pairs, [2]string{repoPath(t, "config", "rbac", c.dir, "role.yaml"), filepath.Join(chartDir(t), "files", "rbac", c.dir+"-role.yaml")})
	}
	for _, b := range bases {
		pairs = append(pairs, [2]string{b, filepath.Join(chartDir(t), "files", "crds", filepath.Base(b))})
	}
	for _, p := range pairs {
		want, err := os.ReadFile(p[0])
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p[1])
		if err != nil {
			t.Errorf("%v: run `make generate`", err)
			continue
		}
		if !bytes.Equal(got, want) {
			rel := func(s string) string { r, _ := filepath.Rel(repoPath(t), s); return r }
			t.Errorf("%s differs from %s: run `make generate`\n%s", rel(p[1]), rel(p[0]), lineDiff(string(want), string(got)))
		}
	}
}

// TestHelmTemplateCLI runs bin/helm, the pinned Helm CLI: it renders
// exactly what the library renders without being told a Kubernetes
// version, and refuses a values file with an unknown key with the schema
// error.
func TestHelmTemplateCLI(t *testing.T) {
	if testing.Short() {
		t.Skip("needs bin/helm")
	}
	h := newHelmCLI(t)

	t.Run("same output as the library", func(t *testing.T) {
		for _, name := range []string{"default", "mode-all", "tls-secret"} {
			f := ciValuesFile(t, name)
			out, stderr, err := h.output("template", releaseName, chartDir(t), "--namespace", releaseNamespace, "-f", f)
			if err != nil {
				t.Fatalf("helm template -f %s: %v\n%s", name, err, stderr)
			}
			lib, err := render(t, renderOptions{}, readValues(t, f))
			if err != nil {
				t.Fatal(err)
			}
			if out != lib {
				t.Errorf("helm template -f %s differs from the library's render:\n%s", name, lineDiff(lib, out))
			}
		}
	})

	t.Run("unknown key", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "values.yaml")
		if err := os.WriteFile(f, []byte("mode: all\nreplicaCount: 2\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		out, stderr, err := h.output("template", releaseName, chartDir(t), "-f", f)
		if err == nil {
			t.Fatalf("helm template with replicaCount succeeded:\n%.500s", out)
		}
		for _, want := range []string{"values don't meet the specifications of the schema", "additional properties 'replicaCount' not allowed"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("helm template stderr does not contain %q:\n%s", want, stderr)
			}
		}
	})
}
