// Package chartrbac grants a test's operator exactly the RBAC the Helm chart
// renders: it renders charts/coder-k8s with the Helm library, applies the
// ServiceAccount and RBAC objects and writes a kubeconfig for that identity.
// It is apart from testenv so that tests which start no operator do not
// link Helm.
package chartrbac

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	authenticationv1 "k8s.io/api/authentication/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/testenv"
)

// Options say which release of charts/coder-k8s the operator's
// identity stands for.
type Options struct {
	// Release and Namespace are those of `helm install Release -n
	// Namespace`: the ServiceAccount and the namespaced RBAC objects
	// without a namespace of their own go there.
	Release, Namespace string
	// Values are the chart values, as given with `helm --values`: at least
	// mode, and whatever else the operator's configuration shares with the
	// chart's RBAC (tls.mode, the leader-election Lease's name and
	// namespace in config.controller.leaderElection).
	Values map[string]any
	// KubeconfigPath is where the operator's kubeconfig is written.
	KubeconfigPath string
	// Edit, when set, changes the rendered RBAC objects before they are
	// applied: for tests that take a permission away.
	Edit func(objs []*unstructured.Unstructured) []*unstructured.Unstructured
}

// Identity is the ServiceAccount the chart renders, bound to exactly
// the RBAC the chart renders for its values, with a kubeconfig that
// authenticates as it and nothing else.
type Identity struct {
	ServiceAccount, Namespace string
	// Username is how kube-apiserver names it:
	// system:serviceaccount:<namespace>:<name>.
	Username string
	// KubeconfigPath holds a TokenRequest token of the ServiceAccount.
	KubeconfigPath string
	// Config is a client configuration with the same token.
	Config *rest.Config
	// Objects are the objects applied, each "Kind name" or "Kind
	// namespace/name", in the chart's order.
	Objects []string
}

// chartRBACKinds are the kinds Grant applies, with their
// resources: the identity and what grants it permissions.
var chartRBACKinds = map[schema.GroupVersionKind]schema.GroupVersionResource{
	{Version: "v1", Kind: "ServiceAccount"}:                              {Version: "v1", Resource: "serviceaccounts"},
	{Group: rbacv1.GroupName, Version: "v1", Kind: "ClusterRole"}:        rbacv1.SchemeGroupVersion.WithResource("clusterroles"),
	{Group: rbacv1.GroupName, Version: "v1", Kind: "ClusterRoleBinding"}: rbacv1.SchemeGroupVersion.WithResource("clusterrolebindings"),
	{Group: rbacv1.GroupName, Version: "v1", Kind: "Role"}:               rbacv1.SchemeGroupVersion.WithResource("roles"),
	{Group: rbacv1.GroupName, Version: "v1", Kind: "RoleBinding"}:        rbacv1.SchemeGroupVersion.WithResource("rolebindings"),
}

// operatorTokenTTL is how long the operator's token is valid: longer than
// any test or `make dev` session.
const operatorTokenTTL = 48 * time.Hour

// Render renders charts/coder-k8s as `helm template Release -n
// Namespace --kube-version kubeVersion` does, with the Helm library's
// install action in client-only dry-run mode (which checks values against
// values.schema.json first), and returns the manifest.
func Render(release, namespace string, kubeVersion *chartutil.KubeVersion, values map[string]any) (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	chrt, err := loader.Load(filepath.Join(root, "charts", "coder-k8s"))
	if err != nil {
		return "", fmt.Errorf("load chart: %w", err)
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.DryRunOption = "true"
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = release
	install.Namespace = namespace
	install.KubeVersion = kubeVersion
	// The install action writes into the values it is given.
	vals, err := copyValues(values)
	if err != nil {
		return "", err
	}
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return "", fmt.Errorf("render chart (release %s): %w", release, err)
	}
	return rel.Manifest, nil
}

func copyValues(v map[string]any) (map[string]any, error) {
	b, err := yaml.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	out := map[string]any{}
	if err := yaml.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("chart values: %w", err)
	}
	return out, nil
}

// Objects returns the ServiceAccount and RBAC objects of a
// rendered manifest, namespaced ones defaulted to namespace as Helm does.
func Objects(manifest, namespace string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read manifest: %w", err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		m := map[string]any{}
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parse manifest document: %w", err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if _, ok := chartRBACKinds[u.GroupVersionKind()]; !ok {
			continue
		}
		if (u.GetKind() == "ServiceAccount" || u.GetKind() == "Role" || u.GetKind() == "RoleBinding") && u.GetNamespace() == "" {
			u.SetNamespace(namespace)
		}
		objs = append(objs, u)
	}
	return objs, nil
}

// Grant renders the chart for opts, applies (as admin, with
// server-side apply) the ServiceAccount and the ClusterRoles,
// ClusterRoleBindings, Roles and RoleBindings it renders, waits until
// kube-apiserver's authorizer grants the ServiceAccount a permission of
// every binding, mints a token for the ServiceAccount (TokenRequest) and
// writes a kubeconfig that authenticates with that token alone. Applying
// the same release again updates its objects and keeps the ServiceAccount,
// so replicas of one release share it, as in a cluster.
func Grant(ctx context.Context, admin *rest.Config, opts Options) (*Identity, error) {
	if opts.Release == "" || opts.Namespace == "" || opts.KubeconfigPath == "" {
		return nil, errors.New("grant chart RBAC: release, namespace and kubeconfig path are required")
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}
	dyn, err := dynamic.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}
	// The cluster's own version, as `helm install` uses.
	sv, err := cs.Discovery().ServerVersion()
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: kube-apiserver version: %w", err)
	}
	kv, err := chartutil.ParseKubeVersion(sv.GitVersion)
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: kube-apiserver version %q: %w", sv.GitVersion, err)
	}
	manifest, err := Render(opts.Release, opts.Namespace, kv, opts.Values)
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}
	objs, err := Objects(manifest, opts.Namespace)
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}
	if opts.Edit != nil {
		objs = opts.Edit(objs)
	}

	id := &Identity{Namespace: opts.Namespace, KubeconfigPath: opts.KubeconfigPath}
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			if id.ServiceAccount != "" {
				return nil, fmt.Errorf("grant chart RBAC: the chart renders two ServiceAccounts, %s and %s", id.ServiceAccount, o.GetName())
			}
			id.ServiceAccount = o.GetName()
		}
	}
	if id.ServiceAccount == "" {
		return nil, fmt.Errorf("grant chart RBAC: release %s renders no ServiceAccount", opts.Release)
	}
	id.Username = "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount

	namespaces := map[string]bool{}
	for _, o := range objs {
		if ns := o.GetNamespace(); ns != "" && !namespaces[ns] {
			namespaces[ns] = true
			if err := testenv.EnsureNamespace(ctx, cs, ns); err != nil {
				return nil, fmt.Errorf("grant chart RBAC: %w", err)
			}
		}
	}
	for _, o := range objs {
		gvr := chartRBACKinds[o.GroupVersionKind()]
		_, err := dyn.Resource(gvr).Namespace(o.GetNamespace()).Apply(ctx, o.GetName(), o,
			metav1.ApplyOptions{FieldManager: "helm", Force: true})
		if err != nil {
			return nil, fmt.Errorf("grant chart RBAC: apply %s: %w", objectRef(o), err)
		}
		id.Objects = append(id.Objects, objectRef(o))
	}
	if err := waitForGrants(ctx, cs, objs, id); err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}

	ttl := int64(operatorTokenTTL / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(id.Namespace).CreateToken(ctx, id.ServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &ttl}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("grant chart RBAC: token for ServiceAccount %s/%s: %w", id.Namespace, id.ServiceAccount, err)
	}
	id.Config = &rest.Config{
		Host:            admin.Host,
		APIPath:         admin.APIPath,
		TLSClientConfig: rest.TLSClientConfig{CAData: admin.CAData, CAFile: admin.CAFile, ServerName: admin.ServerName},
		BearerToken:     tr.Status.Token,
	}
	if err := writeTokenKubeconfig(id.KubeconfigPath, id.Config, id.Username); err != nil {
		return nil, fmt.Errorf("grant chart RBAC: %w", err)
	}
	return id, nil
}

func objectRef(o *unstructured.Unstructured) string {
	if o.GetNamespace() != "" {
		return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}

// writeTokenKubeconfig writes a kubeconfig for cfg's server and CA with
// cfg's bearer token as the only credential.
func writeTokenKubeconfig(path string, cfg *rest.Config, user string) error {
	b, err := testenv.TokenKubeconfig(cfg, user, "")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// waitForGrants waits until kube-apiserver's RBAC authorizer, which learns
// of new roles and bindings from a watch, allows id the first rule of the
// role every binding of id refers to.
func waitForGrants(ctx context.Context, cs kubernetes.Interface, objs []*unstructured.Unstructured, id *Identity) error {
	rendered := map[string]*unstructured.Unstructured{}
	for _, o := range objs {
		rendered[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = o
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" && o.GetKind() != "RoleBinding" {
			continue
		}
		var rb rbacv1.RoleBinding // the same fields as a ClusterRoleBinding
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rb); err != nil {
			return fmt.Errorf("%s: %w", objectRef(o), err)
		}
		if !bindsServiceAccount(rb.Subjects, id) {
			continue
		}
		roleNS := ""
		if rb.RoleRef.Kind == "Role" {
			roleNS = o.GetNamespace()
		}
		rules, err := roleRules(ctx, cs, rendered, rb.RoleRef.Kind, roleNS, rb.RoleRef.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", objectRef(o), err)
		}
		if len(rules) == 0 {
			continue
		}
		if err := testenv.WaitAllowed(ctx, cs, id.Namespace, id.ServiceAccount, o.GetNamespace(), rules[0]); err != nil {
			return fmt.Errorf("%s: %w", objectRef(o), err)
		}
	}
	return nil
}

func bindsServiceAccount(subjects []rbacv1.Subject, id *Identity) bool {
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == id.ServiceAccount && s.Namespace == id.Namespace {
			return true
		}
	}
	return false
}

// roleRules returns the rules of a role the chart renders, or else of one
// in the cluster (the bootstrap roles the chart binds).
func roleRules(ctx context.Context, cs kubernetes.Interface, rendered map[string]*unstructured.Unstructured, kind, namespace, name string) ([]rbacv1.PolicyRule, error) {
	if o, ok := rendered[kind+"/"+namespace+"/"+name]; ok {
		var r rbacv1.ClusterRole // Role's fields are a subset
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
			return nil, fmt.Errorf("%s %s: %w", kind, name, err)
		}
		return r.Rules, nil
	}
	if kind == "Role" {
		r, err := cs.RbacV1().Roles(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("role %s/%s: %w", namespace, name, err)
		}
		return r.Rules, nil
	}
	r, err := cs.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("cluster role %s: %w", name, err)
	}
	return r.Rules, nil
}
