package argocd

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/argoproj/gitops-engine/pkg/cache"
	"github.com/argoproj/gitops-engine/pkg/sync/common"
	"github.com/go-logr/logr/testr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The application controller's ServiceAccount of a default Argo CD
// installation, bound to cluster-admin.
const (
	controllerNamespace = "argocd"
	controllerName      = "argocd-application-controller"
	controllerUser      = "system:serviceaccount:" + controllerNamespace + ":" + controllerName
)

var controlPlanes = schema.GroupVersionResource{Group: "coder.com", Version: "v1alpha1", Resource: "codercontrolplanes"}

// TestArgoCDWholeClusterCache runs Argo CD's cluster cache as a default
// Argo CD runs it: over the whole cluster, as the application controller's
// ServiceAccount bound to cluster-admin, with respectRBAC off, so that an
// error listing any resource type fails the sync of the whole cluster and
// with it every Application. That ServiceAccount has no Coder user in
// either of two control planes, both in identity mode Mapped (the
// default). The cache syncs, holds no Coder object, and an Application of
// one ConfigMap, unrelated to Coder, syncs Synced and Healthy; again once
// one of the two control planes' coderd is stopped.
func TestArgoCDWholeClusterCache(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	controller := applicationControllerConfig(ctx, t, admin, controllerNamespace, controllerName)

	// The second control plane adopts the stack's coderd through a proxy;
	// once the test stops the proxy, that coderd refuses connections to
	// coder-k8s as a stopped coderd does.
	const teamB = "team-b"
	coderdB := startCoderdProxy(t, env.CoderURL)
	adoptCoderd(ctx, t, admin, teamB, coderdB.url)
	for _, ns := range []string{env.Namespace, teamB} {
		ccp, err := dyn.Resource(controlPlanes).Namespace(ns).Get(ctx, "coder", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if mode, _, _ := unstructured.NestedString(ccp.Object, "spec", "identity", "mode"); mode != "Mapped" {
			t.Fatalf("control plane %s/coder runs in identity mode %q, want Mapped", ns, mode)
		}
	}

	unrelated := application{name: "unrelated", namespace: "apps", cfg: controller}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unrelated.namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	configMap := func(revision string) []*unstructured.Unstructured {
		return unrelated.targets(t, fmt.Sprintf(`apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: %s
data:
  revision: %s`, unrelated.namespace, revision))
	}

	cc := cache.NewClusterCache(controller,
		cache.SetRespectRBAC(cache.RespectRbacDisabled),
		cache.SetLogr(testr.NewWithOptions(t, testr.Options{Verbosity: 0})),
		cache.SetPopulateResourceInfoHandler(func(u *unstructured.Unstructured, _ bool) (any, bool) {
			a := trackedApp(u)
			return a, a != ""
		}))
	defer cc.Invalidate()

	// hardRefresh relists every resource type of the cluster, as Argo CD's
	// hard refresh and its periodic cluster resync do.
	hardRefresh := func(t *testing.T) {
		t.Helper()
		cc.Invalidate()
		start := time.Now()
		if err := cc.EnsureSynced(); err != nil {
			t.Fatalf("Argo CD's cluster cache over the whole cluster: %v\ncoder-k8s log:\n%s", err, env.OperatorLogTail(30))
		}
		t.Logf("the cluster cache synced %d resource types in %s", len(cc.GetAPIResources()), time.Since(start).Round(time.Millisecond))
		requireNoCoderObjects(t, cc)
	}

	t.Run("the cache syncs over the whole cluster and holds no Coder object", func(t *testing.T) {
		hardRefresh(t)
		listed := map[string]bool{}
		for _, r := range cc.GetAPIResources() {
			listed[r.GroupVersionResource.String()] = true
		}
		for _, gvr := range []schema.GroupVersionResource{templates, workspaces, controlPlanes} {
			if !listed[gvr.String()] {
				t.Errorf("the cluster cache does not list and watch %s", gvr)
			}
		}
		// The whole cluster: both control planes are in the cache.
		found := cc.FindResources("", func(r *cache.Resource) bool { return r.Ref.Kind == "CoderControlPlane" })
		if len(found) != 2 {
			t.Errorf("the cluster cache holds %d CoderControlPlanes, want 2", len(found))
		}
		// What the controller was answered: nothing, and why.
		for _, gvr := range []schema.GroupVersionResource{templates, workspaces} {
			items, warnings := listWithWarnings(ctx, t, controller, gvr)
			if len(items) != 0 {
				t.Errorf("%s lists %d %s across namespaces, want none", controllerUser, len(items), gvr.Resource)
			}
			for _, cp := range []string{env.Namespace + "/coder", teamB + "/coder"} {
				if !containsAll(warnings, `Kubernetes user "`+controllerUser+`"`, "control plane "+cp) {
					t.Errorf("the Warning headers of %s's LIST of %s do not name control plane %s: %q", controllerUser, gvr.Resource, cp, warnings)
				}
			}
		}
	})

	t.Run("an application unrelated to Coder is Synced and Healthy", func(t *testing.T) {
		if st := unrelated.refresh(t, cc, configMap("rev1")); st.synced() || st.live != 0 {
			t.Fatalf("before the first sync: want OutOfSync, nothing live:\n%s", st)
		}
		requireResults(t, unrelated.sync(ctx, t, cc, configMap("rev1"), "rev1"), common.ResultCodeSynced, 1)
		unrelated.waitStatus(t, cc, configMap("rev1"), "Synced and Healthy", func(s appStatus) bool { return s.synced() && s.healthy() && s.live == 1 })
	})

	t.Run("with one of two coderds stopped, the cache resyncs and the application syncs", func(t *testing.T) {
		coderdB.stop()
		// At once (coder-k8s finds the coderd down during the lists) and
		// once coder-k8s knows it is down.
		hardRefresh(t)
		time.Sleep(5 * time.Second)
		hardRefresh(t)
		_, warnings := listWithWarnings(ctx, t, controller, workspaces)
		if !containsAll(warnings, "control plane "+teamB+"/coder") {
			t.Errorf("the Warning headers of %s's LIST of coderworkspaces do not name control plane %s/coder: %q", controllerUser, teamB, warnings)
		}

		requireResults(t, unrelated.sync(ctx, t, cc, configMap("rev2"), "rev2"), common.ResultCodeSynced, 1)
		unrelated.waitStatus(t, cc, configMap("rev2"), "Synced and Healthy", func(s appStatus) bool { return s.synced() && s.healthy() && s.live == 1 })
		cm, err := admin.CoreV1().ConfigMaps(unrelated.namespace).Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := cm.Data["revision"]; got != "rev2" {
			t.Errorf("ConfigMap %s/settings has revision %q after the sync, want rev2", unrelated.namespace, got)
		}
	})
}

// applicationControllerConfig creates Argo CD's application controller
// ServiceAccount (name in namespace ns), bound to cluster-admin as a
// default installation binds it, and returns a client configuration with
// a token of it.
func applicationControllerConfig(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns, name string) *rest.Config {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expiry := int64(3600)
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(restCfg)
	cfg.BearerToken = tr.Status.Token
	// Argo CD's defaults (ARGOCD_K8S_CLIENT_QPS, ARGOCD_K8S_CLIENT_BURST),
	// not client-go's 5 requests per second.
	cfg.QPS, cfg.Burst = 50, 100
	// kube-apiserver's RBAC authorizer learns of the binding from a watch.
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, func() error {
		_, err := cs.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
	return cfg
}

// adoptCoderd creates namespace ns and CoderControlPlane ns/coder adopting
// the coderd at coderURL with the stack's owner token, in the default
// identity mode, and waits for its operator access.
func adoptCoderd(ctx context.Context, t *testing.T, admin kubernetes.Interface, ns, coderURL string) {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "owner"},
		Data:       map[string][]byte{"token": []byte(env.SessionToken)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ccp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coder.com/v1alpha1", "kind": "CoderControlPlane",
		"metadata": map[string]any{"name": "coder", "namespace": ns},
		"spec": map[string]any{"externalURL": coderURL,
			"operatorAccess": map[string]any{"ownerTokenSecretRef": map[string]any{"name": "owner", "key": "token"}}},
	}}
	if _, err := dyn.Resource(controlPlanes).Namespace(ns).Create(ctx, ccp, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Its coderd may be stopped by now: do not wait for the delete.
		err := dyn.Resource(controlPlanes).Namespace(ns).Delete(context.Background(), "coder", metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete control plane %s/coder: %v", ns, err)
		}
	})
	waitFor(t, 2*time.Minute, func() error {
		got, err := dyn.Resource(controlPlanes).Namespace(ns).Get(ctx, "coder", metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "OperatorAccessReady" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("control plane %s/coder: OperatorAccessReady is not True: %v", ns, conds)
	})
}

// coderdProxy forwards to a coderd until stopped, after which its address
// refuses connections.
type coderdProxy struct {
	url  string
	srv  *http.Server
	once sync.Once
}

func startCoderdProxy(t *testing.T, coderURL string) *coderdProxy {
	t.Helper()
	target, err := url.Parse(coderURL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &coderdProxy{url: "http://" + l.Addr().String(), srv: &http.Server{Handler: httputil.NewSingleHostReverseProxy(target)}}
	go func() { _ = p.srv.Serve(l) }()
	t.Cleanup(p.stop)
	return p
}

// stop closes the listener and every connection.
func (p *coderdProxy) stop() { p.once.Do(func() { _ = p.srv.Close() }) }

// listWithWarnings lists gvr across namespaces with cfg and returns the
// items and the Warning headers of the answer.
func listWithWarnings(ctx context.Context, t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource) ([]unstructured.Unstructured, []string) {
	t.Helper()
	rec := &warningRecorder{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = rec
	d, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := d.Resource(gvr).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list %s across namespaces: %v", gvr.Resource, err)
	}
	t.Logf("LIST of %s across namespaces as %s: %d items in %s", gvr.Resource, controllerUser, len(l.Items), time.Since(start).Round(time.Millisecond))
	return l.Items, rec.all()
}

// warningRecorder keeps the Warning headers a client receives.
type warningRecorder struct {
	mu       sync.Mutex
	messages []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.messages = append(w.messages, message)
}

func (w *warningRecorder) all() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.messages...)
}

// containsAll reports whether one of messages contains every one of parts.
func containsAll(messages []string, parts ...string) bool {
	for _, m := range messages {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(m, p)
		}
		if ok {
			return true
		}
	}
	return false
}

// requireNoCoderObjects fails t if the cluster cache holds a CoderWorkspace
// or CoderTemplate: the application controller has no Coder user.
func requireNoCoderObjects(t *testing.T, cc cache.ClusterCache) {
	t.Helper()
	for key := range cc.FindResources("", func(r *cache.Resource) bool { return r.Ref.APIVersion == "aggregation.coder.com/v1alpha1" }) {
		t.Errorf("the cluster cache of %s, which has no Coder user, holds %s", controllerUser, key)
	}
}

// waitFor calls check until it returns nil, failing t after timeout.
func waitFor(t *testing.T, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
