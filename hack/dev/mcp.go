package main

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// mcpAgent is the ServiceAccount whose token make dev prints for MCP
// clients; its ClusterRole allows every MCP tool.
const mcpAgent = "mcp-agent"

// mcpAgentToken creates the MCP agent's ServiceAccount and RBAC and returns
// a token for it from the TokenRequest API.
func mcpAgentToken(ctx context.Context, kube *testenv.KubeAPI) (string, error) {
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return "", err
	}
	role := "coder-k8s-" + mcpAgent
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: mcpAgent, Namespace: serviceNamespace}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"coder.com"}, Resources: []string{"codercontrolplanes"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"aggregation.coder.com"}, Resources: []string{"coderworkspaces", "codertemplates", "codertemplateversions"}, Verbs: []string{"get", "list", "patch", "delete"}},
			{APIGroups: []string{""}, Resources: []string{"pods", "pods/log", "events", "services"}, Verbs: []string{"get", "list"}},
			{APIGroups: []string{"apps"}, Resources: []string{"deployments"}, Verbs: []string{"get"}},
		}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: mcpAgent, Namespace: serviceNamespace}}},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			return "", fmt.Errorf("create %T %s: %w", o, o.GetName(), err)
		}
	}
	seconds := int64(24 * 3600)
	tr, err := kube.Clientset.CoreV1().ServiceAccounts(serviceNamespace).CreateToken(ctx, mcpAgent,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token for ServiceAccount %s: %w", mcpAgent, err)
	}
	return tr.Status.Token, nil
}
