// Package chart tests the Helm chart charts/coder-k8s: it renders every
// ci values file with the Helm library (as `helm template` does), checks
// the objects against each other and against the binary's own config
// loader, and installs and upgrades the chart on a real kube-apiserver.
package chart

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
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

// checkPorts: container ports ↔ the config's listen addresses ↔ Service
// targetPorts ↔ probes ↔ the APIService's Service port, named ports
// resolved, NetworkPolicy and ServiceMonitor included.
func (r *rendered) checkPorts(t *testing.T) {
	// Container ports: exactly those of the components the mode runs,
	// each on the port the config file makes the binary listen on.
	want := map[string]int32{}
	if r.runsController() {
		want["health"] = portOf(t, r.cfg.Controller.HealthProbeBindAddress)
	}
	if r.servesMetrics() {
		want["metrics"] = portOf(t, r.cfg.Controller.MetricsBindAddress)
	}
	if r.runsAggregated() {
		want["aggregated-api"] = int32(r.cfg.AggregatedAPIServer.SecurePort)
	}
	if r.runsMCP() {
		want["mcp"] = portOf(t, r.cfg.MCP.BindAddress)
	}
	if !maps.Equal(r.ports, want) {
		t.Errorf("container ports %v, want %v (from the config file)", r.ports, want)
	}
	// The ports the values ask for are the ones the binary listens on.
	for name, key := range map[string]string{"health": "ports.health", "metrics": "ports.metrics", "aggregated-api": "ports.aggregatedAPI", "mcp": "ports.mcp"} {
		if p, ok := want[name]; ok && float64(p) != toFloat(lookup(r.vals, key)) {
			t.Errorf("%s listens on %d but %s is %v", name, p, key, lookup(r.vals, key))
		}
	}

	// Probes: the component's port and scheme for the mode.
	type probeWant struct {
		port   string
		scheme corev1.URIScheme
	}
	health, agg, mcp := probeWant{"health", corev1.URISchemeHTTP}, probeWant{"aggregated-api", corev1.URISchemeHTTPS}, probeWant{"mcp", corev1.URISchemeHTTP}
	probes := map[config.AppMode][2]probeWant{
		config.AppAll:                 {health, agg},
		config.AppController:          {health, health},
		config.AppAggregatedAPIServer: {agg, agg},
		config.AppMCPHTTP:             {mcp, mcp},
	}[r.cfg.App]
	for i, p := range []*corev1.Probe{r.container.LivenessProbe, r.container.ReadinessProbe} {
		kind, wantPath := [2]string{"liveness", "readiness"}[i], [2]string{"/healthz", "/readyz"}[i]
		if p == nil || p.HTTPGet == nil {
			t.Errorf("%s probe is not an HTTP GET", kind)
			continue
		}
		num, name := r.resolve(t, p.HTTPGet.Port)
		if name != probes[i].port || p.HTTPGet.Scheme != probes[i].scheme || p.HTTPGet.Path != wantPath {
			t.Errorf("%s probe: %s %s on port %s (%d); want %s %s on port %s", kind, p.HTTPGet.Scheme, p.HTTPGet.Path, name, num, probes[i].scheme, wantPath, probes[i].port)
		}
	}

	// Services: select the pods, and every targetPort resolves to a
	// container port.
	byTarget := map[string][]*corev1.Service{} // container port name → Services forwarding to it
	for _, svc := range typedAll[*corev1.Service](t, r.m, "Service") {
		if !selects(svc.Spec.Selector, r.podLabels()) {
			t.Errorf("Service %s selector %v does not select the pods (%v)", svc.Name, svc.Spec.Selector, r.podLabels())
		}
		for _, sp := range svc.Spec.Ports {
			_, name := r.resolve(t, sp.TargetPort)
			byTarget[name] = append(byTarget[name], svc)
		}
	}
	for name, svcs := range byTarget {
		if len(svcs) != 1 {
			t.Errorf("%d Services forward to container port %s", len(svcs), name)
		}
	}
	if svcs := byTarget["health"]; len(svcs) > 0 {
		t.Errorf("Service %s exposes the health port", svcs[0].Name)
	}

	// The APIService reaches the aggregated API server's secure port
	// through its Service's port.
	for _, as := range typedAll[*apiregistrationv1.APIService](t, r.m, "APIService") {
		ref := as.Spec.Service
		if ref == nil || ref.Port == nil {
			t.Fatalf("APIService %s has no service port", as.Name)
		}
		if ref.Namespace != releaseNamespace {
			t.Errorf("APIService %s points at namespace %s, want %s", as.Name, ref.Namespace, releaseNamespace)
		}
		svc := r.m.find("Service", ref.Name)
		if svc == nil || svc.u.GetNamespace() != ref.Namespace {
			t.Fatalf("APIService %s points at Service %s/%s, which the chart does not render", as.Name, ref.Namespace, ref.Name)
		}
		var found bool
		for _, sp := range svc.typed.(*corev1.Service).Spec.Ports {
			if sp.Port != *ref.Port {
				continue
			}
			found = true
			if num, _ := r.resolve(t, sp.TargetPort); num != int32(r.cfg.AggregatedAPIServer.SecurePort) {
				t.Errorf("APIService %s → Service %s:%d → container port %d, but the config's securePort is %d",
					as.Name, ref.Name, sp.Port, num, r.cfg.AggregatedAPIServer.SecurePort)
			}
			if float64(sp.Port) != toFloat(lookup(r.vals, "aggregatedAPI.service.port")) {
				t.Errorf("Service %s port %d, values aggregatedAPI.service.port %v", ref.Name, sp.Port, lookup(r.vals, "aggregatedAPI.service.port"))
			}
		}
		if !found {
			t.Errorf("APIService %s uses port %d, which Service %s does not have", as.Name, *ref.Port, ref.Name)
		}
		if byTarget["aggregated-api"] == nil || byTarget["aggregated-api"][0].Name != ref.Name {
			t.Errorf("the Service forwarding to the aggregated API port is not the APIService's Service %s", ref.Name)
		}
	}

	// NetworkPolicy: admits exactly the container ports, to the pods.
	for _, np := range typedAll[*networkingv1.NetworkPolicy](t, r.m, "NetworkPolicy") {
		if !selects(np.Spec.PodSelector.MatchLabels, r.podLabels()) {
			t.Errorf("NetworkPolicy %s does not select the pods", np.Name)
		}
		var got []int32
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				num, _ := r.resolve(t, *p.Port)
				got = append(got, num)
			}
		}
		slices.Sort(got)
		wantPorts := slices.Sorted(maps.Values(want))
		if !slices.Equal(got, wantPorts) {
			t.Errorf("NetworkPolicy %s admits ports %v, the container listens on %v", np.Name, got, wantPorts)
		}
	}

	// ServiceMonitor: scrapes a port of the metrics Service, which it
	// selects.
	for _, sm := range r.m.all("ServiceMonitor") {
		metrics := byTarget["metrics"]
		if len(metrics) != 1 {
			t.Fatalf("ServiceMonitor %s but %d metrics Services", sm.u.GetName(), len(metrics))
		}
		svc := metrics[0]
		sel, _, _ := unstructured.NestedStringMap(sm.u.Object, "spec", "selector", "matchLabels")
		if !selects(sel, svc.Labels) {
			t.Errorf("ServiceMonitor %s selector %v does not select Service %s (labels %v)", sm.u.GetName(), sel, svc.Name, svc.Labels)
		}
		nss, _, _ := unstructured.NestedStringSlice(sm.u.Object, "spec", "namespaceSelector", "matchNames")
		if !slices.Contains(nss, svc.Namespace) {
			t.Errorf("ServiceMonitor %s looks in namespaces %v, not %s", sm.u.GetName(), nss, svc.Namespace)
		}
		eps, _, _ := unstructured.NestedSlice(sm.u.Object, "spec", "endpoints")
		if len(eps) == 0 {
			t.Errorf("ServiceMonitor %s has no endpoints", sm.u.GetName())
		}
		for _, ep := range eps {
			port, _ := ep.(map[string]any)["port"].(string)
			var ok bool
			for _, sp := range svc.Spec.Ports {
				if sp.Name == port {
					_, target := r.resolve(t, sp.TargetPort)
					ok = target == "metrics"
				}
			}
			if !ok {
				t.Errorf("ServiceMonitor %s scrapes port %q, which is not Service %s's metrics port", sm.u.GetName(), port, svc.Name)
			}
		}
	}
}

// resolve turns a Service targetPort or probe port into a container port
// number and name, failing when it names or numbers no container port.
func (r *rendered) resolve(t *testing.T, p intstr.IntOrString) (int32, string) {
	t.Helper()
	for name, num := range r.ports {
		if (p.Type == intstr.String && p.StrVal == name) || (p.Type == intstr.Int && p.IntVal == num) {
			return num, name
		}
	}
	t.Errorf("port %s is not a container port (%v)", p.String(), r.ports)
	return 0, ""
}

// checkModeObjects: the chart renders what the mode and values need and
// nothing else.
func (r *rendered) checkModeObjects(t *testing.T) {
	svcFor := func(port string) bool {
		for _, svc := range typedAll[*corev1.Service](t, r.m, "Service") {
			for _, sp := range svc.Spec.Ports {
				if sp.TargetPort.StrVal == port || (sp.TargetPort.Type == intstr.Int && sp.TargetPort.IntVal == r.ports[port]) {
					return true
				}
			}
		}
		return false
	}
	bindsTo := func(kind, roleRef string) bool {
		for _, o := range r.m.all(kind) {
			if ref, _, _ := unstructured.NestedString(o.u.Object, "roleRef", "name"); ref == roleRef {
				return true
			}
		}
		return false
	}
	certManager := r.runsAggregated() && lookupString(r.vals, "tls.mode") == "certManager"
	tokenSecret := lookupString(r.vals, "staticBackend.url") != "" && lookupString(r.vals, "staticBackend.existingSecret") == ""
	for what, c := range map[string]struct{ got, want bool }{
		"APIService":             {len(r.m.all("APIService")) > 0, r.runsAggregated()},
		"aggregated API Service": {svcFor("aggregated-api"), r.runsAggregated()},
		"MCP Service":            {svcFor("mcp"), r.runsMCP() && lookupBool(r.vals, "mcp.service.enabled")},
		"metrics Service":        {svcFor("metrics"), r.servesMetrics() && lookupBool(r.vals, "metrics.service.enabled")},
		"ServiceMonitor":         {len(r.m.all("ServiceMonitor")) > 0, r.servesMetrics() && lookupBool(r.vals, "metrics.serviceMonitor.enabled")},
		"manager ClusterRole":    {r.m.find("ClusterRole", releaseName+"-manager") != nil, r.runsController()},
		"leader-election Role":   {r.m.find("Role", releaseName+"-leader-election") != nil, r.runsController()},
		"auth-delegator binding": {bindsTo("ClusterRoleBinding", "system:auth-delegator"), r.runsAggregated()},
		"authentication-reader":  {bindsTo("RoleBinding", "extension-apiserver-authentication-reader"), r.runsAggregated()},
		"cert-manager objects":   {len(r.m.all("Certificate"))+len(r.m.all("Issuer")) > 0, certManager},
		"PodDisruptionBudget":    {len(r.m.all("PodDisruptionBudget")) > 0, lookupBool(r.vals, "podDisruptionBudget.enabled")},
		"NetworkPolicy":          {len(r.m.all("NetworkPolicy")) > 0, lookupBool(r.vals, "networkPolicy.enabled")},
		"token Secret":           {len(r.m.all("Secret")) > 0, tokenSecret},
		"ServiceAccount":         {len(r.m.all("ServiceAccount")) > 0, lookupBool(r.vals, "serviceAccount.create")},
		"CRDs":                   {len(r.m.all("CustomResourceDefinition")) > 0, lookupBool(r.vals, "crds.enabled")},
	} {
		if c.got != c.want {
			t.Errorf("mode %s: %s rendered: %v, want %v", r.cfg.App, what, c.got, c.want)
		}
	}
	for _, pdb := range typedAll[*policyv1.PodDisruptionBudget](t, r.m, "PodDisruptionBudget") {
		if !selects(pdb.Spec.Selector.MatchLabels, r.podLabels()) {
			t.Errorf("PodDisruptionBudget %s does not select the pods", pdb.Name)
		}
	}
	if want := int32(toFloat(lookup(r.vals, "replicas"))); r.deployment.Spec.Replicas == nil || *r.deployment.Spec.Replicas != want {
		t.Errorf("Deployment replicas %v, values %d", r.deployment.Spec.Replicas, want)
	}
	if !selects(r.deployment.Spec.Selector.MatchLabels, r.podLabels()) {
		t.Errorf("Deployment selector %v does not select its own pods (%v)", r.deployment.Spec.Selector.MatchLabels, r.podLabels())
	}
}

// checkPodSecurity: the restricted Pod Security Standard.
func (r *rendered) checkPodSecurity(t *testing.T) {
	pod := r.deployment.Spec.Template.Spec
	psc := pod.SecurityContext
	if psc == nil {
		t.Fatal("no pod securityContext")
	}
	if psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		t.Error("pod runAsNonRoot is not true")
	}
	if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile %+v, want RuntimeDefault", psc.SeccompProfile)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the pod shares a host namespace")
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("container %s has no securityContext", c.Name)
			continue
		}
		if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
			t.Errorf("container %s runAsNonRoot false", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("container %s readOnlyRootFilesystem is not true", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container %s allowPrivilegeEscalation is not false", c.Name)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("container %s is privileged", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("container %s capabilities %+v, want drop [ALL] and nothing added", c.Name, sc.Capabilities)
		}
		if sc.SeccompProfile != nil && sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("container %s seccompProfile %s", c.Name, sc.SeccompProfile.Type)
		}
	}
}

// checkSecrets: the static backend's token reaches the pod as a file from
// a Secret and appears nowhere else, least of all in the ConfigMap.
func (r *rendered) checkSecrets(t *testing.T) {
	for _, s := range typedAll[*corev1.Secret](t, r.m, "Secret") {
		for k, v := range s.Data {
			if len(v) > 0 && strings.Contains(r.m.text, string(v)) {
				t.Errorf("the value of Secret %s key %s appears in clear text in the manifest", s.Name, k)
			}
		}
	}
	token := lookupString(r.vals, "staticBackend.sessionToken")
	if token != "" && strings.Contains(r.m.text, token) {
		t.Errorf("staticBackend.sessionToken appears in clear text in the manifest")
	}
	sb := r.cfg.AggregatedAPIServer.Coder.StaticBackend
	if lookupString(r.vals, "staticBackend.url") == "" {
		if sb.Enabled() || sb.SessionTokenFile != "" {
			t.Errorf("no staticBackend in the values but the config has %+v", sb)
		}
		return
	}
	if sb.URL != lookupString(r.vals, "staticBackend.url") {
		t.Errorf("config staticBackend.url %q, values %q", sb.URL, lookupString(r.vals, "staticBackend.url"))
	}
	if ns := lookupString(r.vals, "staticBackend.namespace"); sb.Namespace != ns && (ns != "" || sb.Namespace != releaseNamespace) {
		t.Errorf("config staticBackend.namespace %q, values %q (release namespace %s)", sb.Namespace, ns, releaseNamespace)
	}
	if sb.SessionTokenFile == "" {
		t.Fatal("static backend without sessionTokenFile")
	}
	vol := r.mountedSecret(t, path.Dir(sb.SessionTokenFile))
	secretName := lookupString(r.vals, "staticBackend.existingSecret")
	if secretName == "" {
		secretName = releaseName + "-coder-token"
		s := r.m.find("Secret", secretName)
		if s == nil {
			t.Fatalf("no Secret %s for the session token", secretName)
		}
		if got := s.typed.(*corev1.Secret).Data[lookupString(r.vals, "staticBackend.secretKey")]; string(got) != token {
			t.Errorf("Secret %s does not hold the session token under %s", secretName, lookupString(r.vals, "staticBackend.secretKey"))
		}
	}
	if vol.SecretName != secretName {
		t.Errorf("the token directory is Secret %s, want %s", vol.SecretName, secretName)
	}
	wantItem := corev1.KeyToPath{Key: lookupString(r.vals, "staticBackend.secretKey"), Path: path.Base(sb.SessionTokenFile)}
	if !slices.Contains(vol.Items, wantItem) {
		t.Errorf("Secret volume items %+v do not map key %s to %s", vol.Items, wantItem.Key, wantItem.Path)
	}
}

// checkTLS: the config file, the mounted Secret and the APIService agree
// on how kube-apiserver trusts the aggregated API server.
func (r *rendered) checkTLS(t *testing.T) {
	agg := r.cfg.AggregatedAPIServer
	if !r.runsAggregated() {
		if agg.AutoTLS.Enabled || agg.CertDir != "" {
			t.Errorf("mode %s runs no aggregated API server but the config sets autoTLS %v, certDir %q", r.cfg.App, agg.AutoTLS.Enabled, agg.CertDir)
		}
		return
	}
	as := one[*apiregistrationv1.APIService](t, r.m, "APIService")
	if as.Spec.Group != "aggregation.coder.com" || as.Spec.Version != "v1alpha1" || as.Name != "v1alpha1.aggregation.coder.com" {
		t.Errorf("APIService %s serves %s/%s", as.Name, as.Spec.Group, as.Spec.Version)
	}
	svc := as.Spec.Service.Name
	switch mode := lookupString(r.vals, "tls.mode"); mode {
	case "auto":
		a := agg.AutoTLS
		if !a.Enabled || agg.CertDir != "" {
			t.Errorf("tls.mode auto: config autoTLS.enabled %v, certDir %q", a.Enabled, agg.CertDir)
		}
		if a.ServiceName != svc || a.APIServiceName != as.Name || a.Namespace != releaseNamespace || a.SecretName != releaseName+"-aggregated-tls" {
			t.Errorf("config autoTLS %+v does not name Service %s, APIService %s, namespace %s", a, svc, as.Name, releaseNamespace)
		}
		if want, _ := time.ParseDuration(lookupString(r.vals, "tls.auto.certValidity")); a.CertValidity.Duration != want {
			t.Errorf("config autoTLS.certValidity %s, values %s", a.CertValidity, want)
		}
		// coder-k8s writes the caBundle; a manifest holding one would
		// fight it (and make GitOps tools report drift).
		if len(as.Spec.CABundle) > 0 || as.Spec.InsecureSkipTLSVerify {
			t.Errorf("tls.mode auto: APIService has caBundle %d bytes, insecureSkipTLSVerify %v", len(as.Spec.CABundle), as.Spec.InsecureSkipTLSVerify)
		}
	case "certManager":
		if agg.AutoTLS.Enabled || agg.CertDir == "" {
			t.Fatalf("tls.mode certManager: config autoTLS.enabled %v, certDir %q", agg.AutoTLS.Enabled, agg.CertDir)
		}
		vol := r.mountedSecret(t, agg.CertDir)
		var cert *unstructured.Unstructured
		for _, o := range r.m.all("Certificate") {
			if name, _, _ := unstructured.NestedString(o.u.Object, "spec", "secretName"); name == vol.SecretName {
				cert = o.u
			}
		}
		if cert == nil {
			t.Fatalf("no Certificate writes Secret %s, the certDir volume", vol.SecretName)
		}
		dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		if want := testenv.ServiceDNSName(svc, releaseNamespace); !slices.Contains(dns, want) {
			t.Errorf("Certificate %s dnsNames %v lack %s, the name kube-apiserver checks", cert.GetName(), dns, want)
		}
		if got, want := as.Annotations["cert-manager.io/inject-ca-from"], releaseNamespace+"/"+cert.GetName(); got != want {
			t.Errorf("APIService inject-ca-from %q, want %q", got, want)
		}
		if len(as.Spec.CABundle) > 0 || as.Spec.InsecureSkipTLSVerify {
			t.Error("tls.mode certManager: the APIService carries a caBundle or insecureSkipTLSVerify")
		}
		issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
		kind, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind")
		if want := lookupString(r.vals, "tls.certManager.issuerRef.name"); want != "" {
			if issuer != want || kind != lookupString(r.vals, "tls.certManager.issuerRef.kind") {
				t.Errorf("Certificate issuerRef %s %s, values %s %s", kind, issuer, lookupString(r.vals, "tls.certManager.issuerRef.kind"), want)
			}
		} else if r.m.find(kind, issuer) == nil {
			t.Errorf("Certificate issuerRef %s %s is not rendered", kind, issuer)
		}
	case "secret":
		if agg.AutoTLS.Enabled || agg.CertDir == "" {
			t.Fatalf("tls.mode secret: config autoTLS.enabled %v, certDir %q", agg.AutoTLS.Enabled, agg.CertDir)
		}
		if vol := r.mountedSecret(t, agg.CertDir); vol.SecretName != lookupString(r.vals, "tls.secret.name") {
			t.Errorf("certDir is Secret %s, values tls.secret.name %s", vol.SecretName, lookupString(r.vals, "tls.secret.name"))
		}
		if string(as.Spec.CABundle) != lookupString(r.vals, "tls.caBundle") || as.Spec.InsecureSkipTLSVerify {
			t.Errorf("APIService caBundle is not tls.caBundle (or insecureSkipTLSVerify is set)")
		}
	case "insecure":
		if agg.AutoTLS.Enabled || agg.CertDir != "" {
			t.Errorf("tls.mode insecure: config autoTLS.enabled %v, certDir %q", agg.AutoTLS.Enabled, agg.CertDir)
		}
		if !as.Spec.InsecureSkipTLSVerify || len(as.Spec.CABundle) > 0 {
			t.Error("tls.mode insecure: APIService without insecureSkipTLSVerify, or with a caBundle")
		}
	default:
		t.Fatalf("unknown tls.mode %q", mode)
	}
}

// checkRBAC: bindings name the pods' ServiceAccount; the manager role has
// exactly the generated rules; tls.mode auto may touch only its Secret and
// its APIService by name.
func (r *rendered) checkRBAC(t *testing.T) {
	sa := r.serviceAccount()
	if lookupBool(r.vals, "serviceAccount.create") && r.m.find("ServiceAccount", sa) == nil {
		t.Errorf("the pods run as ServiceAccount %s, which the chart does not render", sa)
	}
	subjects := func(o *object) []rbacv1.Subject {
		switch b := o.typed.(type) {
		case *rbacv1.RoleBinding:
			return b.Subjects
		case *rbacv1.ClusterRoleBinding:
			return b.Subjects
		}
		return nil
	}
	for _, o := range slices.Concat(r.m.all("RoleBinding"), r.m.all("ClusterRoleBinding")) {
		for _, s := range subjects(o) {
			if s.Kind != "ServiceAccount" || s.Name != sa || s.Namespace != releaseNamespace {
				t.Errorf("%s binds %s %s/%s, not the pods' ServiceAccount %s/%s", o, s.Kind, s.Namespace, s.Name, releaseNamespace, sa)
			}
		}
	}
	if r.runsController() {
		var generated rbacv1.ClusterRole
		b, err := os.ReadFile(repoPath(t, "config", "rbac", "role.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(b, &generated); err != nil {
			t.Fatal(err)
		}
		role := r.m.find("ClusterRole", releaseName+"-manager")
		if role == nil || !reflect.DeepEqual(role.typed.(*rbacv1.ClusterRole).Rules, generated.Rules) {
			t.Errorf("ClusterRole %s-manager does not have the rules of config/rbac/role.yaml", releaseName)
		}
	}
	if r.runsAggregated() && lookupString(r.vals, "tls.mode") == "auto" {
		grants := func(kind, resource, name string) bool {
			for _, o := range r.m.all(kind) {
				var rules []rbacv1.PolicyRule
				switch role := o.typed.(type) {
				case *rbacv1.Role:
					rules = role.Rules
				case *rbacv1.ClusterRole:
					rules = role.Rules
				}
				for _, rule := range rules {
					if slices.Contains(rule.Resources, resource) && slices.Equal(rule.ResourceNames, []string{name}) && slices.Contains(rule.Verbs, "update") {
						return true
					}
				}
			}
			return false
		}
		a := r.cfg.AggregatedAPIServer.AutoTLS
		if !grants("Role", "secrets", a.SecretName) {
			t.Errorf("no Role grants update on Secret %s (autoTLS) by name", a.SecretName)
		}
		if !grants("ClusterRole", "apiservices", a.APIServiceName) {
			t.Errorf("no ClusterRole grants update on APIService %s (autoTLS) by name", a.APIServiceName)
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
	files, _ := filepath.Glob(repoPath(t, "config", "crd", "bases", "*.yaml"))
	if len(crds) != len(files) {
		t.Fatalf("%d CRDs rendered, %d in config/crd/bases", len(crds), len(files))
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var want apiextensionsv1.CustomResourceDefinition
		if err := yaml.UnmarshalStrict(b, &want); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
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

// TestChartFilesInSync: the chart's copies of the CRDs and the manager
// role are byte-identical to the generated files (`make generate`).
func TestChartFilesInSync(t *testing.T) {
	bases, err := filepath.Glob(repoPath(t, "config", "crd", "bases", "*.yaml"))
	if err != nil || len(bases) == 0 {
		t.Fatalf("no CRDs in config/crd/bases (%v)", err)
	}
	copies, _ := filepath.Glob(filepath.Join(chartDir(t), "files", "crds", "*.yaml"))
	names := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	if !slices.Equal(names(bases), names(copies)) {
		t.Errorf("charts/coder-k8s/files/crds holds %v, config/crd/bases %v: run `make generate`", names(copies), names(bases))
	}
	pairs := [][2]string{{repoPath(t, "config", "rbac", "role.yaml"), filepath.Join(chartDir(t), "files", "rbac", "manager-role.yaml")}}
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

// The config keys the chart renders from its own values; the schema
// refuses them under `config`.
var chartOwnedConfigKeys = []string{
	"app",
	"controller.healthProbeBindAddress",
	"controller.metricsBindAddress",
	"aggregatedAPIServer.securePort",
	"aggregatedAPIServer.certDir",
	"aggregatedAPIServer.autoTLS",
	"aggregatedAPIServer.coder.staticBackend",
	"mcp.bindAddress",
}

func chartOwned(key string) bool {
	for _, k := range chartOwnedConfigKeys {
		if key == k || strings.HasPrefix(key, k+".") {
			return true
		}
	}
	return false
}

// TestSchemaKnowsEveryConfigKey: values.schema.json's `config` has every
// key of the fully defaulted configuration file (except the ones the chart
// owns) with a matching type, and no key the binary does not know.
func TestSchemaKnowsEveryConfigKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir(t), "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	cfgSchema, _ := lookup(schema, "properties.config").(map[string]any)
	if cfgSchema == nil {
		t.Fatal("values.schema.json has no properties.config")
	}
	fields := map[string]config.Field{}
	for _, f := range config.Fields() {
		fields[f.Key] = f
	}
	js, err := json.Marshal(config.Default())
	if err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := json.Unmarshal(js, &defaults); err != nil {
		t.Fatal(err)
	}

	var checked int
	var walk func(obj map[string]any, node map[string]any, prefix string)
	walk = func(obj map[string]any, node map[string]any, prefix string) {
		if node["type"] != "object" || node["additionalProperties"] != false {
			t.Errorf("schema config%s: type %v, additionalProperties %v; want a closed object", dotted(prefix), node["type"], node["additionalProperties"])
		}
		props, _ := node["properties"].(map[string]any)
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			full := prefix + key
			sub, inSchema := props[key].(map[string]any)
			if chartOwned(full) {
				if inSchema {
					t.Errorf("schema config.%s: the chart renders this key, so the schema must refuse it", full)
				}
				continue
			}
			if !inSchema {
				t.Errorf("schema config has no %s (default %v): users cannot set it", full, obj[key])
				continue
			}
			checked++
			if v, ok := obj[key].(map[string]any); ok {
				walk(v, sub, full+".")
				continue
			}
			if want := schemaType(fields[full]); !hasType(sub["type"], want) {
				t.Errorf("schema config.%s has type %v, the binary reads %s (%s)", full, sub["type"], want, fields[full].Type)
			}
		}
		// And nothing the binary would refuse as an unknown field.
		for key := range props {
			if _, ok := fields[prefix+key]; !ok {
				t.Errorf("schema config.%s%s is not a key of the configuration file", prefix, key)
			}
		}
	}
	walk(defaults, cfgSchema, "")
	if checked < 30 {
		t.Errorf("only %d keys checked: the walk went wrong", checked)
	}
	// The walk covers every key config.Fields() lists.
	for key := range fields {
		if lookup(defaults, key) == nil && !strings.Contains(key, "allowTools") && !strings.Contains(key, "denyTools") {
			t.Errorf("config.Default() JSON has no %s", key)
		}
	}
}

func dotted(prefix string) string {
	if prefix == "" {
		return ""
	}
	return "." + strings.TrimSuffix(prefix, ".")
}

// hasType reports whether a schema's type (a string or a list of them)
// includes want.
func hasType(typ any, want string) bool {
	switch typ := typ.(type) {
	case string:
		return typ == want
	case []any:
		return slices.Contains(typ, any(want))
	}
	return false
}

// schemaType is the JSON schema type of a configuration field.
func schemaType(f config.Field) string {
	switch {
	case f.Type == reflect.TypeOf(config.Duration{}):
		return "string"
	case f.IsObject():
		return "object"
	}
	switch f.Type.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice:
		return "array"
	default:
		return "string"
	}
}

// TestSchemaRejectsMisspelledValues: the Helm library's values validation
// (what `helm install` and `helm template` run) refuses a misspelt key and
// names it with its path.
func TestSchemaRejectsMisspelledValues(t *testing.T) {
	cases := []struct {
		name, values string
		want         []string
	}{
		{"top-level value", "replicasCount: 2", []string{"at ''", "additional properties 'replicasCount' not allowed"}},
		{"nested value", "tls: {mdoe: auto}", []string{"at '/tls'", "'mdoe' not allowed"}},
		{"config key", "config: {logging: {levle: debug}}", []string{"at '/config/logging'", "additional properties 'levle' not allowed"}},
		{"config section", "config: {controler: {}}", []string{"at '/config'", "'controler' not allowed"}},
		{"config value of the wrong type", "config: {kubernetes: {burst: many}}", []string{"/config/kubernetes/burst"}},
		{"config duration", "config: {mcp: {toolTimeout: 2 minutes}}", []string{"/config/mcp/toolTimeout"}},
		{"mode", "mode: controllers", []string{"/mode"}},
	}
	for _, key := range chartOwnedConfigKeys {
		parent, leaf := "", key
		if i := strings.LastIndex(key, "."); i >= 0 {
			parent, leaf = key[:i], key[i+1:]
		}
		// {config: {a: {b: {leaf: x}}}}
		v := "x"
		y := fmt.Sprintf("{%s: %s}", leaf, v)
		for _, p := range slices.Backward(strings.Split(parent, ".")) {
			if p != "" {
				y = fmt.Sprintf("{%s: %s}", p, y)
			}
		}
		at := "/config"
		if parent != "" {
			at += "/" + strings.ReplaceAll(parent, ".", "/")
		}
		cases = append(cases, struct {
			name, values string
			want         []string
		}{"chart-owned config." + key, "config: " + y, []string{"at '" + at + "'", "'" + leaf + "' not allowed"}})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := render(t, renderOptions{}, valuesFromYAML(t, c.values))
			if err == nil {
				t.Fatalf("values %q rendered without an error", c.values)
			}
			if !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Errorf("values %q: not a schema error: %v", c.values, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("values %q: error does not contain %q:\n%v", c.values, w, err)
				}
			}
		})
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
	helm, err := testenv.Binary("helm")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, string, error) {
		cmd := exec.Command(helm, args...)
		cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		return stdout.String(), stderr.String(), err
	}

	t.Run("same output as the library", func(t *testing.T) {
		for _, name := range []string{"default", "mode-all", "tls-secret"} {
			f := filepath.Join(chartDir(t), "ci", name+"-values.yaml")
			out, stderr, err := run("template", releaseName, chartDir(t), "--namespace", releaseNamespace, "-f", f)
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
		out, stderr, err := run("template", releaseName, chartDir(t), "-f", f)
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

// selects reports whether every key of selector has its value in labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func toFloat(v any) float64 {
	switch v := v.(type) {
	case int:
		return float64(v)
	case int64:
		return float64(v)
	case float64:
		return v
	case json.Number:
		f, _ := v.Float64()
		return f
	}
	return -1
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
