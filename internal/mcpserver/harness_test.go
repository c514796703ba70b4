package mcpserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/mcpclient"
)

// harness is an MCP server in-process on a real kube-apiserver, served
// over real HTTP.
type harness struct {
	k   *testenv.KubeAPI
	c   client.Client
	cs  kubernetes.Interface
	srv *Server
	url string
}

// defaultOptions are the server's options with the configuration file's
// defaults (mcp in config.Default), without clients.
func defaultOptions() Options {
	return Options{
		BindAddress:       ":8090",
		MaxRequestBytes:   1 << 20,
		ReadHeaderTimeout: 10 * time.Second,
		ToolTimeout:       2 * time.Minute,
	}
}

// newHarness starts kube-apiserver and an MCP server with the default
// options changed by mutate (when not nil) whose tools read it directly; coder-k8s is the
// admin.
func newHarness(t *testing.T, k *testenv.KubeAPI, mutate func(*Options)) *harness {
	t.Helper()
	return newHarnessAs(t, k, nil, mutate)
}

// newHarnessAs is newHarness with coder-k8s's own client configuration
// operator (the admin's when nil); h.c and h.cs stay the admin's, for
// setting tests up.
func newHarnessAs(t *testing.T, k *testenv.KubeAPI, operator *rest.Config, mutate func(*Options)) *harness {
	t.Helper()
	if k == nil {
		k = testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	}
	c, err := client.New(k.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	if operator == nil {
		operator = k.Config
	}
	oc, err := client.New(operator, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	ocs, err := kubernetes.NewForConfig(operator)
	if err != nil {
		t.Fatal(err)
	}
	o := defaultOptions()
	if mutate != nil {
		mutate(&o)
	}
	o.Kube = Kube{Cached: oc, Direct: oc, Clientset: ocs}
	o.REST = operator
	o.Ready = func(*http.Request) error { return nil }
	o.Log = testr.New(t)
	srv, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &harness{k: k, c: c, cs: k.Clientset, srv: srv, url: hs.URL + "/mcp"}
}

// serviceAccountToken creates ServiceAccount name in namespace and returns
// a token for it from the TokenRequest API, as an agent would get one:
// for audiences, or kube-apiserver's own when none are given.
func (h *harness) serviceAccountToken(t *testing.T, namespace, name string, audiences ...string) string {
	t.Helper()
	ctx := context.Background()
	if err := h.k.EnsureNamespace(ctx, namespace); err != nil {
		t.Fatal(err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	if err := h.c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := h.cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr(int64(3600)), Audiences: audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

// grant gives ServiceAccount namespace/name the rules in roleNamespace
// ("" for every namespace, with a ClusterRole).
func (h *harness) grant(t *testing.T, namespace, name, roleNamespace string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	if roleNamespace != "" {
		if err := h.k.EnsureNamespace(ctx, roleNamespace); err != nil {
			t.Fatal(err)
		}
	}
	role := name + "-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}
	var objs []client.Object
	if roleNamespace == "" {
		objs = []client.Object{
			&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules},
			&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role}, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role}},
		}
	} else {
		objs = []client.Object{
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: roleNamespace}, Rules: rules},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role, Namespace: roleNamespace}, Subjects: subject,
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role}},
		}
	}
	for _, o := range objs {
		if err := h.c.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// In effect once kube-apiserver's authorizer has seen the binding.
	for _, r := range rules {
		if err := testenv.WaitAllowed(ctx, h.cs, namespace, name, roleNamespace, r); err != nil {
			t.Fatal(err)
		}
	}
}

// connect opens an MCP client session over HTTP with token as the bearer
// token ("" for none).
func (h *harness) connect(t *testing.T, token string) *mcp.ClientSession {
	t.Helper()
	return mcpclient.MustConnect(t, h.url, mcpclient.Options{Token: token})
}

// connectMCP connects the go-sdk client to url.
func connectMCP(ctx context.Context, url, token string) (*mcp.ClientSession, error) {
	return mcpclient.Connect(ctx, url, mcpclient.Options{Token: token})
}

// callTool calls a tool and decodes its structured content into out
// (when not nil). It fails the test on protocol errors, not on isError
// results, which it returns.
func callTool(t *testing.T, s *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	return mcpclient.MustCall(t, s, name, args, out)
}

// resultText is the text content of a result.
func resultText(res *mcp.CallToolResult) string { return mcpclient.Text(res) }

func ptr[T any](v T) *T { return &v }
