// TestCIValues's security checks: the restricted Pod Security Standard, the
// static backend's token, the APIService's TLS and the RBAC.

package chart

import (
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/config"
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

// checkRBAC: bindings name the pods' ServiceAccount; each component the
// mode runs has exactly its generated rules and no other component's;
// tls.mode auto may touch only its Secret and its APIService by name.
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
	r.checkComponentRoles(t)
	r.checkNoEscalation(t)
	r.checkUserRoles(t)
	if r.runsAggregated() && lookupString(r.vals, "tls.mode") == "auto" {
		grants := func(kind, resource, name string) bool {
			for _, o := range r.m.all(kind) {
				for _, rule := range roleRules(o.typed) {
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

// roleRules are the rules of a Role or ClusterRole, none of anything
// else.
func roleRules(typed runtime.Object) []rbacv1.PolicyRule {
	switch role := typed.(type) {
	case *rbacv1.Role:
		return role.Rules
	case *rbacv1.ClusterRole:
		return role.Rules
	}
	return nil
}

// checkNoEscalation: no rendered rule grants escalate, impersonate or a
// wildcard; bind only on the ClusterRoles of controller.workspaceRBAC,
// by name; the generated manager role neither creates Roles nor binds.
// With the controller, the config names the chart's workspace ClusterRoles
// and the admission policy is rendered unless turned off.
func (r *rendered) checkNoEscalation(t *testing.T) {
	var bindNames []string
	for _, o := range slices.Concat(r.m.all("Role"), r.m.all("ClusterRole")) {
		for _, rule := range roleRules(o.typed) {
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

// checkUserRoles: the ClusterRoles for Coder's users (rbac.userRoles) are
// rendered, with exactly the rules of shippedUserRoles, when the mode serves
// the aggregated API; every ClusterRole the chart renders for people (those
// and the view/edit/admin aggregations) names only the aggregated resources,
// so binding it reaches no Secret, pod or token; and no binding of the
// chart's refers to one: whom to grant them is the administrator's call.
func (r *rendered) checkUserRoles(t *testing.T) {
	want := r.runsAggregated() && lookupBool(r.vals, "rbac.create") && lookupBool(r.vals, "rbac.userRoles")
	forPeople := map[string]bool{}
	for suffix, rules := range shippedUserRoles {
		name := releaseName + "-" + suffix
		o := r.m.find("ClusterRole", name)
		switch {
		case o == nil && want:
			t.Errorf("mode %s, rbac.userRoles %v: no ClusterRole %s", r.cfg.App, lookupBool(r.vals, "rbac.userRoles"), name)
		case o != nil && !want:
			t.Errorf("mode %s, rbac.create %v, rbac.userRoles %v renders ClusterRole %s", r.cfg.App, lookupBool(r.vals, "rbac.create"), lookupBool(r.vals, "rbac.userRoles"), name)
		case o != nil && !reflect.DeepEqual(o.typed.(*rbacv1.ClusterRole).Rules, rules):
			t.Errorf("ClusterRole %s has rules\n%swant\n%s", name, mustYAML(t, o.typed.(*rbacv1.ClusterRole).Rules), mustYAML(t, rules))
		}
		forPeople[name] = true
	}
	for _, o := range r.m.all("ClusterRole") {
		role := o.typed.(*rbacv1.ClusterRole)
		if !forPeople[role.Name] && !slices.ContainsFunc(slices.Collect(maps.Keys(role.Labels)), func(l string) bool {
			return strings.HasPrefix(l, "rbac.authorization.k8s.io/aggregate-to-")
		}) {
			continue
		}
		forPeople[role.Name] = true
		for _, rule := range role.Rules {
			if !slices.Equal(rule.APIGroups, []string{"aggregation.coder.com"}) || slices.ContainsFunc(rule.Resources, func(res string) bool {
				return !slices.Contains([]string{"coderworkspaces", "codertemplates", "codertemplateversions", "coderusers", "codergroups", "coderorganizations"}, res)
			}) || len(rule.ResourceNames) > 0 || len(rule.NonResourceURLs) > 0 {
				t.Errorf("ClusterRole %s, meant for people, has rule %+v beyond the aggregated resources", role.Name, rule)
			}
		}
	}
	for _, o := range slices.Concat(r.m.all("RoleBinding"), r.m.all("ClusterRoleBinding")) {
		var ref rbacv1.RoleRef
		switch b := o.typed.(type) {
		case *rbacv1.RoleBinding:
			ref = b.RoleRef
		case *rbacv1.ClusterRoleBinding:
			ref = b.RoleRef
		}
		if ref.Kind == "ClusterRole" && forPeople[ref.Name] {
			t.Errorf("%s binds ClusterRole %s, which the chart ships for people to bind", o, ref.Name)
		}
	}
}

// rbacComponent is a component with RBAC markers: the ClusterRole the
// chart names <release>-<suffix>, with the rules of
// config/rbac/<dir>/role.yaml, generated from the markers in packages.
type rbacComponent struct {
	suffix, dir string
	packages    []string
}

var rbacComponents = []rbacComponent{
	{suffix: "manager", dir: "controller", packages: []string{"internal/controller"}},
	{suffix: "aggregated", dir: "aggregated", packages: []string{"internal/aggregated/backend", "internal/aggregated/records", "internal/aggregated/storage"}},
	{suffix: "admission", dir: "admission", packages: []string{"internal/aggregated/admission"}},
	{suffix: "autotls", dir: "autotls", packages: []string{"internal/aggregated/autotls"}},
	{suffix: "mcp", dir: "mcp", packages: []string{"internal/mcpserver"}},
}

// generatedRole reads config/rbac/<dir>/role.yaml.
func generatedRole(t testing.TB, dir string) *rbacv1.ClusterRole {
	t.Helper()
	b, err := os.ReadFile(repoPath(t, "config", "rbac", dir, "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(b, &role); err != nil {
		t.Fatal(err)
	}
	if len(role.Rules) == 0 {
		t.Fatalf("config/rbac/%s/role.yaml has no rules", dir)
	}
	return &role
}

// boundRules are the rules of every Role and ClusterRole the chart binds
// to the pods' ServiceAccount (the workspace ClusterRoles are bound to
// coderd's, by the operator, not to it).
func (r *rendered) boundRules(t *testing.T) map[string][]rbacv1.PolicyRule {
	t.Helper()
	bound := map[string][]rbacv1.PolicyRule{}
	rulesOf := func(kind, namespace, name string) {
		for _, o := range r.m.all(kind) {
			switch role := o.typed.(type) {
			case *rbacv1.ClusterRole:
				if role.Name == name {
					bound[kind+" "+name] = role.Rules
				}
			case *rbacv1.Role:
				if role.Name == name && role.Namespace == namespace {
					bound[kind+" "+namespace+"/"+name] = role.Rules
				}
			}
		}
	}
	for _, o := range r.m.all("ClusterRoleBinding") {
		b := o.typed.(*rbacv1.ClusterRoleBinding)
		rulesOf(b.RoleRef.Kind, "", b.RoleRef.Name)
	}
	for _, o := range r.m.all("RoleBinding") {
		b := o.typed.(*rbacv1.RoleBinding)
		rulesOf(b.RoleRef.Kind, b.Namespace, b.RoleRef.Name)
	}
	return bound
}

// checkComponentRoles: the mode gets the ClusterRole of each component it
// runs with exactly that component's generated rules (autoTLS's restricted
// to its Secret and APIService, in a Role and a ClusterRole of their own),
// and no permission only another component needs.
func (r *rendered) checkComponentRoles(t *testing.T) {
	tls := lookupString(r.vals, "tls.mode")
	runs := map[string]bool{
		"manager":    r.runsController(),
		"aggregated": r.cfg.App == config.AppAll,
		"admission":  r.runsAdmission(),
		"mcp":        r.runsMCP(),
	}
	for _, c := range rbacComponents {
		if c.suffix == "autotls" {
			continue
		}
		role := r.m.find("ClusterRole", releaseName+"-"+c.suffix)
		binding := r.m.find("ClusterRoleBinding", releaseName+"-"+c.suffix)
		switch {
		case runs[c.suffix]:
			if role == nil || binding == nil {
				t.Errorf("mode %s runs %s but the chart renders no ClusterRole and ClusterRoleBinding %s-%s", r.cfg.App, c.dir, releaseName, c.suffix)
				continue
			}
			if got, want := role.typed.(*rbacv1.ClusterRole).Rules, generatedRole(t, c.dir).Rules; !reflect.DeepEqual(got, want) {
				t.Errorf("ClusterRole %s-%s does not have the rules of config/rbac/%s/role.yaml:\n%s", releaseName, c.suffix, c.dir,
					lineDiff(mustYAML(t, want), mustYAML(t, got)))
			}
		case c.suffix == "aggregated" && r.cfg.App == config.AppAggregatedAPIServer:
			// The static backend: its one namespace, nothing of the
			// control-plane backend's Secrets and CoderControlPlanes.
			want := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: []string{"get", "list", "watch"}}}
			if role == nil || !reflect.DeepEqual(role.typed.(*rbacv1.ClusterRole).Rules, want) {
				t.Errorf("mode aggregated-apiserver: ClusterRole %s-aggregated is not %+v", releaseName, want)
			}
			// Its records, the Secrets of its templates' variables and
			// its workspaces' pods and events, only in the backend's
			// namespace.
			ns := r.cfg.AggregatedAPIServer.Coder.StaticBackend.Namespace
			records := []rbacv1.PolicyRule{{APIGroups: []string{"coder.com"}, Resources: []string{"coderobjectrecords"},
				Verbs: []string{"get", "list", "watch", "create", "update", "delete"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
				{APIGroups: []string{""}, Resources: []string{"pods", "events"}, Verbs: []string{"get", "list"}}}
			if got := r.boundRules(t)["Role "+ns+"/"+releaseName+"-aggregated-records"]; !reflect.DeepEqual(got, records) {
				t.Errorf("mode aggregated-apiserver: Role %s/%s-aggregated-records bound with %+v, want %+v", ns, releaseName, got, records)
			}
		default:
			if role != nil || binding != nil {
				t.Errorf("mode %s does not run %s but the chart renders its ClusterRole or ClusterRoleBinding %s-%s", r.cfg.App, c.dir, releaseName, c.suffix)
			}
		}
	}

	// What only another component needs is granted by no role the chart
	// binds (system:auth-delegator, the aggregated API server's delegated
	// TokenReviews and SubjectAccessReviews, is Kubernetes's, not rendered).
	type grant struct {
		group, resource string
		verbs           []string // any verb when empty
	}
	// The MCP tools act with their callers' own tokens, so no mode holds
	// what only they needed.
	forbidden := []grant{{group: "authorization.k8s.io", resource: "subjectaccessreviews"},
		{group: "aggregation.coder.com", resource: "coderworkspaces"}, {group: "aggregation.coder.com", resource: "codertemplates"},
		{group: "aggregation.coder.com", resource: "codertemplateversions"}, {group: "aggregation.coder.com", resource: "coderusers"},
		{group: "aggregation.coder.com", resource: "codergroups"}, {group: "aggregation.coder.com", resource: "coderorganizations"},
		{resource: "pods/log"}, {resource: "events", verbs: []string{"watch"}}}
	if !r.runsMCP() {
		forbidden = append(forbidden, grant{group: "authentication.k8s.io", resource: "tokenreviews"})
	}
	if !r.runsAggregated() {
		// The aggregated API server reads workspaces' pods and events
		// (for a caller who may read them) and nothing else does.
		forbidden = append(forbidden, grant{resource: "namespaces"}, grant{resource: "events", verbs: []string{"get", "list"}})
	}
	if !r.runsAdmission() {
		for _, res := range []string{"mutatingwebhookconfigurations", "validatingwebhookconfigurations", "validatingadmissionpolicies",
			"validatingadmissionpolicybindings", "mutatingadmissionpolicies", "mutatingadmissionpolicybindings"} {
			forbidden = append(forbidden, grant{group: "admissionregistration.k8s.io", resource: res})
		}
	}
	if !r.runsAggregated() || tls != "auto" {
		forbidden = append(forbidden, grant{group: "apiregistration.k8s.io", resource: "apiservices"})
	}
	for name, rules := range r.boundRules(t) {
		for _, rule := range rules {
			for _, f := range forbidden {
				verbs := slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return len(f.verbs) > 0 && !slices.Contains(f.verbs, v) })
				if slices.Contains(rule.APIGroups, f.group) && slices.Contains(rule.Resources, f.resource) && len(verbs) > 0 {
					t.Errorf("mode %s (tls.mode %s): %s grants %v on %s %q, which only a component the mode does not run needs", r.cfg.App, tls, name, verbs, f.resource, f.group)
				}
			}
		}
	}

	// tls.mode auto: the generated autoTLS verbs, no more, no fewer, on the
	// Secret (create unnamed, as resourceNames cannot restrict it) and the
	// APIService by name.
	autoRole, autoCluster := r.m.find("Role", releaseName+"-autotls"), r.m.find("ClusterRole", releaseName+"-autotls")
	if !r.runsAggregated() || tls != "auto" {
		if autoRole != nil || autoCluster != nil {
			t.Errorf("mode %s tls.mode %s renders the autoTLS Role or ClusterRole", r.cfg.App, tls)
		}
		return
	}
	if autoRole == nil || autoCluster == nil {
		t.Fatalf("tls.mode auto renders no Role and ClusterRole %s-autotls", releaseName)
	}
	a := r.cfg.AggregatedAPIServer.AutoTLS
	var wantRole, wantCluster []rbacv1.PolicyRule
	for _, rule := range generatedRole(t, "autotls").Rules {
		switch {
		case slices.Equal(rule.APIGroups, []string{""}) && slices.Equal(rule.Resources, []string{"secrets"}):
			if slices.Contains(rule.Verbs, "create") {
				wantRole = append(wantRole, rbacv1.PolicyRule{APIGroups: rule.APIGroups, Resources: rule.Resources, Verbs: []string{"create"}})
			}
			named := slices.DeleteFunc(slices.Clone(rule.Verbs), func(v string) bool { return v == "create" })
			wantRole = append(wantRole, rbacv1.PolicyRule{APIGroups: rule.APIGroups, Resources: rule.Resources, ResourceNames: []string{a.SecretName}, Verbs: named})
		case slices.Equal(rule.Resources, []string{"apiservices"}):
			wantCluster = append(wantCluster, rbacv1.PolicyRule{APIGroups: rule.APIGroups, Resources: rule.Resources, ResourceNames: []string{a.APIServiceName}, Verbs: rule.Verbs})
		default:
			t.Fatalf("config/rbac/autotls/role.yaml has rule %+v: teach the chart and this test about it", rule)
		}
	}
	normalize := func(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
		out := make([]rbacv1.PolicyRule, 0, len(rules))
		for _, rule := range rules {
			rule.Verbs = slices.Sorted(slices.Values(rule.Verbs))
			out = append(out, rule)
		}
		return out
	}
	if got := normalize(autoRole.typed.(*rbacv1.Role).Rules); !reflect.DeepEqual(got, normalize(wantRole)) {
		t.Errorf("Role %s-autotls has %+v, want the generated autoTLS rules restricted to Secret %s: %+v", releaseName, got, a.SecretName, wantRole)
	}
	if got := normalize(autoCluster.typed.(*rbacv1.ClusterRole).Rules); !reflect.DeepEqual(got, normalize(wantCluster)) {
		t.Errorf("ClusterRole %s-autotls has %+v, want %+v", releaseName, got, wantCluster)
	}
}

func mustYAML(t testing.TB, v any) string {
	t.Helper()
	b, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rbacMarker is one +kubebuilder:rbac marker.
var rbacMarker = regexp.MustCompile(`(?m)^// \+kubebuilder:rbac:groups=([^,]*),resources=([^,]+)(?:,resourceNames=([^,]+))?,verbs=(\S+)$`)

// TestRBACMarkersGenerated: every RBAC marker in a component's packages is
// granted by that component's generated role (controller-gen silently
// drops a marker in the wrong kind of comment), and every generated rule
// comes from a marker of the component.
func TestRBACMarkersGenerated(t *testing.T) {
	for _, c := range rbacComponents {
		t.Run(c.dir, func(t *testing.T) {
			role := generatedRole(t, c.dir)
			used := make([]bool, len(role.Rules))
			markers := 0
			for _, pkg := range c.packages {
				err := filepath.WalkDir(repoPath(t, pkg), func(path string, d fs.DirEntry, err error) error {
					if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
						return err
					}
					src, err := os.ReadFile(path)
					if err != nil {
						return err
					}
					for _, m := range rbacMarker.FindAllStringSubmatch(string(src), -1) {
						markers++
						group := strings.Trim(m[1], `"`)
						var names []string
						if m[3] != "" {
							names = strings.Split(m[3], ";")
						}
						for _, res := range strings.Split(m[2], ";") {
							for _, verb := range strings.Split(m[4], ";") {
								i := slices.IndexFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
									return slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, res) &&
										slices.Contains(r.Verbs, verb) && slices.Equal(r.ResourceNames, names)
								})
								if i < 0 {
									t.Errorf("%s: marker %q: config/rbac/%s/role.yaml does not grant %s %s %q %v", path, m[0], c.dir, verb, res, group, names)
									continue
								}
								used[i] = true
							}
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if markers == 0 {
				t.Fatalf("no RBAC markers in %v", c.packages)
			}
			for i, u := range used {
				if !u {
					t.Errorf("config/rbac/%s/role.yaml rule %+v comes from no marker in %v: run `make generate`", c.dir, role.Rules[i], c.packages)
				}
			}
		})
	}
}
