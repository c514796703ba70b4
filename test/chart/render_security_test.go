// TestCIValues's security checks: the restricted Pod Security Standard, the
// static backend's token, the APIService's TLS and the RBAC.

package chart

import (
	"os"
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/testenv"
)

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
	r.checkNoEscalation(t)
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

// checkNoEscalation: no rendered rule grants escalate, impersonate or a
// wildcard; bind only on the ClusterRoles of controller.workspaceRBAC,
// by name; the generated manager role neither creates Roles nor binds.
// With the controller, the config names the chart's workspace ClusterRoles
// and the admission policy is rendered unless turned off.
func (r *rendered) checkNoEscalation(t *testing.T) {
	var bindNames []string
	for _, o := range slices.Concat(r.m.all("Role"), r.m.all("ClusterRole")) {
		var rules []rbacv1.PolicyRule
		switch role := o.typed.(type) {
		case *rbacv1.Role:
			rules = role.Rules
		case *rbacv1.ClusterRole:
			rules = role.Rules
		}
		for _, rule := range rules {
			for _, v := range rule.Verbs {
				switch v {
				case "escalate", "impersonate", "*":
					t.Errorf("%s grants %s on %v", o, v, rule.Resources)
				case "bind":
					if len(rule.ResourceNames) == 0 || !slices.Equal(rule.Resources, []string{"clusterroles"}) || !slices.Equal(rule.APIGroups, []string{rbacv1.GroupName}) {
						t.Errorf("%s grants bind on %v %v without naming ClusterRoles", o, rule.APIGroups, rule.Resources)
					}
					bindNames = append(bindNames, rule.ResourceNames...)
				}
			}
			if slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
				t.Errorf("%s has a wildcard rule %+v", o, rule)
			}
			if slices.Contains(rule.Resources, "roles") && slices.ContainsFunc(rule.Verbs, func(v string) bool { return v == "create" || v == "patch" || v == "update" }) {
				t.Errorf("%s lets coder-k8s write Roles: %+v", o, rule)
			}
		}
	}
	policy := r.m.find("ValidatingAdmissionPolicy", releaseName+"-author-rights")
	binding := r.m.find("ValidatingAdmissionPolicyBinding", releaseName+"-author-rights")
	if !r.runsController() {
		if len(bindNames) > 0 || policy != nil || binding != nil {
			t.Errorf("mode %s runs no controller but binds %v / renders the admission policy", r.cfg.App, bindNames)
		}
		return
	}
	w := r.cfg.Controller.WorkspaceRBAC
	want := []string{w.ClusterRole, w.DeploymentsClusterRole}
	for _, n := range w.AllowedClusterRoles {
		if !slices.Contains(want, n) {
			want = append(want, n)
		}
	}
	if !slices.Equal(bindNames, want) {
		t.Errorf("bind granted on ClusterRoles %v, want exactly the config's %v", bindNames, want)
	}
	if lookupBool(r.vals, "workspaceRBAC.createClusterRoles") && lookupString(r.vals, "workspaceRBAC.clusterRole") == "" {
		if r.m.find("ClusterRole", w.ClusterRole) == nil || r.m.find("ClusterRole", w.DeploymentsClusterRole) == nil {
			t.Errorf("the workspace ClusterRoles %s and %s of the config are not rendered", w.ClusterRole, w.DeploymentsClusterRole)
		}
	}
	if lookupBool(r.vals, "admissionPolicy.enabled") {
		if policy == nil || binding == nil {
			t.Fatalf("no ValidatingAdmissionPolicy and binding %s-author-rights", releaseName)
		}
		if got, _, _ := unstructured.NestedString(binding.u.Object, "spec", "policyName"); got != policy.u.GetName() {
			t.Errorf("the binding names policy %q, want %q", got, policy.u.GetName())
		}
		if actions, _, _ := unstructured.NestedStringSlice(binding.u.Object, "spec", "validationActions"); !slices.Equal(actions, []string{"Deny"}) {
			t.Errorf("validationActions %v, want [Deny]", actions)
		}
	}
}
