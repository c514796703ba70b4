package chart

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// fieldManager is the server-side apply field manager of the install
// steps, standing in for Helm.
const fieldManager = "helm-test"

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
	c := newCluster(t)
	ctx := context.Background()
	if err := c.k.EnsureNamespace(ctx, releaseNamespace); err != nil {
		t.Fatal(err)
	}
	rel := &release{name: releaseName, namespace: releaseNamespace, manager: fieldManager}
	renderFor := func(t *testing.T, vals map[string]any) *manifest {
		return mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, vals)
	}

	var rev1 *manifest
	step(t, "install", func(t *testing.T) {
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

	step(t, "upgrade to tls.mode secret", func(t *testing.T) {
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
	step(t, "upgrade with changed values", func(t *testing.T) {
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

	step(t, "upgrade removing an optional object", func(t *testing.T) {
		vals := merged(ciValues(t, "default"), valuesFromYAML(t, "replicas: 2\nconfig: {logging: {level: debug}}"))
		rev4 := renderFor(t, vals)
		removed := c.upgrade(t, rel, rev4)
		if !slices.Equal(removed, []string{"PodDisruptionBudget " + releaseNamespace + "/" + releaseName}) {
			t.Errorf("removed %v, want only the PodDisruptionBudget", removed)
		}
		c.diffEmpty(t, rel, rev4)
	})

	step(t, "every ci values file passes a server-side dry run", func(t *testing.T) {
		for _, cc := range ciCases(t) {
			start := time.Now()
			m := renderFor(t, cc.vals)
			applied, skipped := c.apply(t, m.objects, fieldManager, true)
			t.Logf("%s: %d objects validated in %s; not installable here: %v", cc.name, len(applied), time.Since(start).Round(time.Millisecond), skipped)
		}
	})

	step(t, "uninstall keeps the CRDs", func(t *testing.T) {
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
		step(t, "GitOps "+ex.name, func(t *testing.T) {
			if err := c.k.EnsureNamespace(ctx, ex.namespace); err != nil {
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
