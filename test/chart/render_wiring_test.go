// TestCIValues's checks that the rendered objects are wired together: ports,
// Services, probes, the APIService, NetworkPolicy and ServiceMonitor, and
// the objects each mode renders.

package chart

import (
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"

	"github.com/coder/coder-k8s/internal/config"
)

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
