package chart

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/coderapi"
	"github.com/coder/coder-k8s/internal/controller/operatoraccess"
)

// shippedUserRoles are the ClusterRoles the chart ships for the people who
// use Coder through Kubernetes (rbac.userRoles), by name suffix, with what
// each is for: every verb of its rules on the aggregated resources.
var shippedUserRoles = map[string][]rbacv1.PolicyRule{
	"workspace-user": {
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"codertemplates", "codertemplateversions", "coderusers", "codergroups", "coderorganizations"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}},
	},
	"template-author": {
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"codertemplates", "codertemplateversions"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces", "coderusers", "codergroups", "coderorganizations"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"codertemplateversions/log", "coderworkspaces/log"}, Verbs: []string{"get"}},
	},
	"user-admin": {
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderusers"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces", "codertemplates", "codertemplateversions"}, Verbs: []string{"get", "list", "watch"}},
	},
	"organization-admin": {
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"codergroups", "coderorganizations"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	},
}

// builtinRoles are what rbac.aggregateToDefaultRoles adds to the built-in
// roles: view reads every aggregated resource and its build logs (as it
// reads pods/log); edit and admin, which include view, also write.
var builtinRoles = map[string][]rbacv1.PolicyRule{
	"view": {
		{APIGroups: []string{"aggregation.coder.com"}, Resources: aggregatedResources, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}},
	},
	"edit":  builtinWriteRules,
	"admin": builtinWriteRules,
}

var builtinWriteRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"aggregation.coder.com"}, Resources: aggregatedResources, Verbs: aggregatedVerbs},
	{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces/log", "codertemplateversions/log"}, Verbs: []string{"get"}},
}

// aggregatedResources are the aggregated API's resources.
var aggregatedResources = []string{"codertemplates", "codertemplateversions", "coderusers", "coderworkspaces", "codergroups", "coderorganizations"}

// aggregatedVerbs are the verbs the aggregated API serves.
var aggregatedVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// TestUserRoles installs the chart on a real kube-apiserver and binds each
// ClusterRole it ships for Coder's users, with RoleBindings as the docs say,
// to a user of its own (a client certificate) in a control plane's
// namespace, the static backend's namespace and the release namespace. As
// that user, with SubjectAccessReviews and with real requests, it may do
// what the role is for on coderworkspaces and codertemplates, and it
// reaches no credential: it reads none of the Secrets coder-k8s writes or
// reads there, creates no pod, execs into none, mints no ServiceAccount
// token and impersonates no one. Then the release is upgraded to mode
// aggregated-apiserver, whose static backend token the chart keeps in a
// Secret of the release namespace, and the same holds.
func TestUserRoles(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	admin := c.k.Clientset

	allVals := ciValues(t, "mode-all")
	staticNamespace := lookupString(allVals, "staticBackend.namespace")
	if staticNamespace == "" || staticNamespace == releaseNamespace {
		t.Fatalf("ci/mode-all-values.yaml: want a static backend namespace of its own, got %q", staticNamespace)
	}
	ccp := controlPlane("coder", "coder")
	for _, ns := range []string{releaseNamespace, ccp.Namespace, staticNamespace} {
		if err := c.k.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	rel := &release{name: releaseName, namespace: releaseNamespace, manager: fieldManager}
	m := mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, allVals)
	c.upgrade(t, rel, m)
	cfg := loadConfig(t, configFile(t, m))

	// The Secrets coder-k8s writes or reads in a control plane's namespace
	// (internal/controller), with the names it gives them or the names
	// the README's examples give the ones users supply.
	const provisioner, proxy = "coder-provisioner", "coder-proxy"
	cpSecrets := map[string]string{
		coderapi.TokenSecretName(ccp.Name):    "the operator's owner token",
		operatoraccess.AdminSecretName(ccp):   "the first user's password",
		"coder-owner-token":                   "spec.operatorAccess.ownerTokenSecretRef, the owner token the README bootstraps with",
		"coder-owner-credentials":             "spec.operatorAccess.ownerCredentialsSecretRef",
		"coder-license":                       "spec.license.secretRef",
		"coder-tls":                           "spec.tls.secretNames",
		"coder-db":                            "coderd's PostgreSQL URL (spec.extraEnv / envFrom)",
		provisioner + "-provisioner-key":      "a CoderProvisioner's key (internal/controller/provisioner)",
		proxy + "-wsproxy-token":              "a CoderWorkspaceProxy's token (internal/controller/workspaceproxy)",
		"coder-proxy-token":                   "spec.proxyTokenSecretRef of a CoderWorkspaceProxy",
		coderapi.TokenSecretName("coder-dev"): "another control plane's operator token in the same namespace",
	}
	// In the release namespace: the serving certificate's key of tls.mode
	// auto, and the static backend's session token (the Secret the
	// values name).
	releaseSecrets := map[string]string{
		cfg.AggregatedAPIServer.AutoTLS.SecretName:            "the aggregated API's CA and serving key (tls.mode auto)",
		lookupString(allVals, "staticBackend.existingSecret"): "the static backend's owner session token (staticBackend.existingSecret)",
	}
	if !cfg.AggregatedAPIServer.AutoTLS.Enabled || len(releaseSecrets) != 2 {
		t.Fatalf("ci/mode-all-values.yaml: want tls.mode auto and staticBackend.existingSecret, got secrets %v", releaseSecrets)
	}
	createSecrets(t, admin, ccp.Namespace, cpSecrets)
	createSecrets(t, admin, releaseNamespace, releaseSecrets)

	// The ServiceAccounts whose pods or tokens are worth having: coderd's
	// (its workspace RBAC runs pods and execs into them) and coder-k8s's
	// own (CRUD on every Secret of the cluster).
	serviceAccounts := map[string]string{ccp.Namespace: ccp.Name, releaseNamespace: releaseName, staticNamespace: "default"}
	for ns, sa := range serviceAccounts {
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}

	users := map[string]*roleUser{}
	for suffix := range shippedUserRoles {
		role := releaseName + "-" + suffix
		if _, err := admin.RbacV1().ClusterRoles().Get(ctx, role, metav1.GetOptions{}); err != nil {
			t.Fatalf("the chart installed no ClusterRole %s: %v", role, err)
		}
		u := newRoleUser(t, c, suffix+"@example.com", suffix)
		for _, ns := range []string{ccp.Namespace, staticNamespace, releaseNamespace} {
			_, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: suffix + "-" + strings.ReplaceAll(u.name, "@", "-at-")},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u.name}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		}
		users[suffix] = u
	}

	checkAll := func(t *testing.T, secrets map[string]map[string]string) {
		for suffix, u := range users {
			t.Run(suffix, func(t *testing.T) {
				for _, ns := range []string{ccp.Namespace, staticNamespace, releaseNamespace} {
					// The positive checks first: they wait until
					// kube-apiserver's authorizer has seen the binding, so
					// a refusal below is the role's and not a binding not
					// yet in effect.
					u.wantForWhatItIs(t, ns)
					u.wantNoCredentials(t, ns, secrets[ns], serviceAccounts[ns])
				}
				u.wantNoImpersonation(t)
			})
		}
	}
	step(t, "mode all: a control plane's namespace, the static backend's and the release namespace", func(t *testing.T) {
		checkAll(t, map[string]map[string]string{ccp.Namespace: cpSecrets, releaseNamespace: releaseSecrets})
	})

	step(t, "the built-in view, edit and admin roles, as kube-controller-manager aggregates them", func(t *testing.T) {
		c.k.NewControllerManager(t, "clusterrole-aggregation")
		for _, role := range []string{"view", "edit", "admin"} {
			u := newRoleUser(t, c, "builtin-"+role+"@example.com", role)
			if _, err := admin.RbacV1().RoleBindings(ccp.Namespace).Create(ctx, &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "builtin-" + role},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u.name}},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			u.wantForWhatItIs(t, ccp.Namespace)
		}
	})

	step(t, "mode aggregated-apiserver: the chart's static backend token Secret", func(t *testing.T) {
		vals := ciValues(t, "mode-aggregated-apiserver")
		m := mustRender(t, renderOptions{kubeVersion: c.kubeVersion}, vals)
		c.upgrade(t, rel, m)
		tokens := typedAll[*corev1.Secret](t, m, "Secret")
		if len(tokens) != 1 {
			t.Fatalf("mode aggregated-apiserver renders %d Secrets, want the static backend's token", len(tokens))
		}
		// Installed by the chart: it exists before the user asks for it.
		if _, err := admin.CoreV1().Secrets(releaseNamespace).Get(ctx, tokens[0].Name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		secrets := maps.Clone(releaseSecrets)
		secrets[tokens[0].Name] = "the static backend's owner session token (staticBackend.sessionToken)"
		if name := loadConfig(t, configFile(t, m)).AggregatedAPIServer.AutoTLS.SecretName; secrets[name] == "" {
			t.Fatalf("mode aggregated-apiserver keeps its serving key in Secret %s, not %v", name, slices.Collect(maps.Keys(releaseSecrets)))
		}
		checkAll(t, map[string]map[string]string{ccp.Namespace: cpSecrets, releaseNamespace: secrets})
	})
}

// roleUser is a user bound to one shipped role, with their own client
// certificate.
type roleUser struct {
	name, role string
	cfg        *rest.Config
	cs         kubernetes.Interface
	admin      kubernetes.Interface
	// info is who kube-apiserver says the user is (SelfSubjectReview): the
	// subject of every SubjectAccessReview.
	info authenticationv1.UserInfo
}

func newRoleUser(t *testing.T, c *cluster, name, role string) *roleUser {
	t.Helper()
	cfg, err := c.k.UserConfig(name)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	who, err := cs.AuthenticationV1().SelfSubjectReviews().Create(t.Context(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if who.Status.UserInfo.Username != name {
		t.Fatalf("the client certificate of %s authenticates as %q", name, who.Status.UserInfo.Username)
	}
	return &roleUser{name: name, role: role, cfg: cfg, cs: cs, admin: c.k.Clientset, info: who.Status.UserInfo}
}

// attrs is one request a SubjectAccessReview asks about.
type attrs struct {
	verb, group, resource, subresource, name string
}

func (a attrs) String() string {
	s := a.verb + " " + a.resource
	if a.subresource != "" {
		s += "/" + a.subresource
	}
	if a.group != "" {
		s += "." + a.group
	}
	if a.name != "" {
		s += " " + a.name
	}
	return s
}

// allowed asks kube-apiserver (SubjectAccessReview) whether the user may
// do a in namespace ns ("" for the cluster).
func (u *roleUser) allowed(t *testing.T, ns string, a attrs) (bool, string) {
	t.Helper()
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.info.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := u.admin.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: u.info.Username, Groups: u.info.Groups, UID: u.info.UID, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: ns, Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Name: a.name,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return sar.Status.Allowed, sar.Status.Reason
}

// wantForWhatItIs: every verb of the role's rules (a shipped role's, or
// what the chart adds to a built-in one) is allowed in ns (waiting up to
// 30 s for the RoleBinding, or kube-controller-manager's aggregation, to
// take effect), and the writes it does not name are refused.
func (u *roleUser) wantForWhatItIs(t *testing.T, ns string) {
	t.Helper()
	rules, ok := shippedUserRoles[u.role]
	if !ok {
		rules = builtinRoles[u.role]
	}
	for _, rule := range rules {
		for _, res := range rule.Resources {
			for _, verb := range aggregatedVerbs {
				a := attrs{verb: verb, group: "aggregation.coder.com", resource: res}
				want := slices.Contains(rule.Verbs, verb)
				got, reason := u.allowed(t, ns, a)
				for deadline := time.Now().Add(30 * time.Second); want && !got && time.Now().Before(deadline); {
					time.Sleep(100 * time.Millisecond)
					got, reason = u.allowed(t, ns, a)
				}
				if got != want {
					t.Errorf("%s (%s) in namespace %s: %s allowed %v (%s), want %v", u.name, u.role, ns, a, got, reason, want)
				}
			}
		}
	}
}

// wantNoCredentials: in ns the user can read no Secret (secrets: name →
// what it holds), create no pod or workload, exec into or attach to none,
// mint no token for the ServiceAccount sa, bind no role and write no
// record of the aggregated API's metadata: by SubjectAccessReview, and by
// real requests, each refused with 403.
func (u *roleUser) wantNoCredentials(t *testing.T, ns string, secrets map[string]string, sa string) {
	t.Helper()
	denied := []attrs{
		{verb: "create", resource: "pods"},
		{verb: "update", resource: "pods"},
		{verb: "create", resource: "pods", subresource: "exec"},
		{verb: "get", resource: "pods", subresource: "exec"},
		{verb: "create", resource: "pods", subresource: "attach"},
		{verb: "create", resource: "pods", subresource: "portforward"},
		{verb: "create", resource: "pods", subresource: "ephemeralcontainers"},
		{verb: "patch", resource: "pods", subresource: "ephemeralcontainers"},
		{verb: "create", resource: "serviceaccounts", subresource: "token", name: sa},
		{verb: "impersonate", resource: "serviceaccounts", name: sa},
		{verb: "create", group: "apps", resource: "deployments"},
		{verb: "create", group: "apps", resource: "statefulsets"},
		{verb: "create", group: "apps", resource: "daemonsets"},
		{verb: "create", group: "batch", resource: "jobs"},
		{verb: "create", group: "batch", resource: "cronjobs"},
		{verb: "create", group: rbacv1.GroupName, resource: "rolebindings"},
		{verb: "create", group: rbacv1.GroupName, resource: "roles"},
		{verb: "create", group: coderv1alpha1.GroupVersion.Group, resource: "coderobjectrecords"},
		{verb: "update", group: coderv1alpha1.GroupVersion.Group, resource: "coderobjectrecords"},
		{verb: "delete", group: coderv1alpha1.GroupVersion.Group, resource: "coderobjectrecords"},
		{verb: "create", group: coderv1alpha1.GroupVersion.Group, resource: "codercontrolplanes"},
		{verb: "patch", group: coderv1alpha1.GroupVersion.Group, resource: "codercontrolplanes"},
	}
	for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"} {
		denied = append(denied, attrs{verb: verb, resource: "secrets"})
	}
	for name := range secrets {
		for _, verb := range []string{"get", "update", "patch"} {
			denied = append(denied, attrs{verb: verb, resource: "secrets", name: name})
		}
	}
	for _, a := range denied {
		if ok, reason := u.allowed(t, ns, a); ok {
			t.Errorf("%s (%s) may %s in namespace %s (%s)", u.name, u.role, a, ns, reason)
		}
	}

	ctx := t.Context()
	forbidden := func(what string, err error) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s (%s) in namespace %s: %s: %v, want 403 Forbidden", u.name, u.role, ns, what, err)
		}
	}
	for name, holds := range secrets {
		_, err := u.cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		forbidden(fmt.Sprintf("get Secret %s (%s)", name, holds), err)
	}
	_, err := u.cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	forbidden("list Secrets", err)
	w, err := u.cs.CoreV1().Secrets(ns).Watch(ctx, metav1.ListOptions{})
	if w != nil {
		w.Stop()
	}
	forbidden("watch Secrets", err)
	_, err = u.cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "steal"},
		Spec:       corev1.PodSpec{ServiceAccountName: sa, Containers: []corev1.Container{{Name: "sh", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	forbidden("create a pod as ServiceAccount "+sa, err)
	err = u.cs.CoreV1().RESTClient().Post().Namespace(ns).Resource("pods").Name(sa+"-0").SubResource("exec").
		Param("command", "sh").Param("stdout", "true").Do(ctx).Error()
	forbidden("exec into a pod", err)
	_, err = u.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	forbidden("a token for ServiceAccount "+sa, err)
	_, err = u.cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "grant-myself"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: u.name}},
	}, metav1.CreateOptions{})
	forbidden("bind edit to themselves", err)
}

// wantNoImpersonation: the user may impersonate no user, group,
// ServiceAccount or UID, and a request impersonating coder-k8s's
// ServiceAccount is refused.
func (u *roleUser) wantNoImpersonation(t *testing.T) {
	t.Helper()
	for _, a := range []attrs{
		{verb: "impersonate", resource: "users"},
		{verb: "impersonate", resource: "groups"},
		{verb: "impersonate", resource: "serviceaccounts"},
		{verb: "impersonate", group: "authentication.k8s.io", resource: "uids"},
		{verb: "impersonate", group: "authentication.k8s.io", resource: "userextras", subresource: "scopes"},
		{verb: "list", resource: "secrets"},
	} {
		if ok, reason := u.allowed(t, "", a); ok {
			t.Errorf("%s (%s) may %s cluster-wide (%s)", u.name, u.role, a, reason)
		}
	}
	cfg := rest.CopyConfig(u.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + releaseNamespace + ":" + releaseName}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = cs.CoreV1().Secrets(releaseNamespace).List(t.Context(), metav1.ListOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "impersonate") {
		t.Errorf("%s (%s) impersonating coder-k8s's ServiceAccount: %v, want 403 Forbidden for impersonation", u.name, u.role, err)
	}
}

// createSecrets creates, as an administrator, Secrets of the given names in
// ns, holding something worth stealing.
func createSecrets(t *testing.T, cs kubernetes.Interface, ns string, secrets map[string]string) {
	t.Helper()
	for name, holds := range secrets {
		_, err := cs.CoreV1().Secrets(ns).Create(context.Background(), &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"test.coder.com/holds": holds}},
			Data:       map[string][]byte{"token": []byte("secret-" + name)},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create Secret %s/%s: %v", ns, name, err)
		}
	}
}

// TestUserRolesSwitch: rbac.userRoles false renders neither role for
// Coder's users and leaves the view, edit and admin aggregations alone.
func TestUserRolesSwitch(t *testing.T) {
	m := mustRender(t, renderOptions{}, valuesFromYAML(t, "rbac: {userRoles: false}"))
	for suffix := range shippedUserRoles {
		if m.find("ClusterRole", releaseName+"-"+suffix) != nil {
			t.Errorf("rbac.userRoles false renders ClusterRole %s-%s", releaseName, suffix)
		}
	}
	for _, name := range []string{"aggregated-view", "aggregated-edit"} {
		if m.find("ClusterRole", releaseName+"-"+name) == nil {
			t.Errorf("rbac.userRoles false also drops ClusterRole %s-%s", releaseName, name)
		}
	}
}
