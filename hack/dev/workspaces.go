package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

// The demo workspaces: on the node (--run helm) they are pods of the
// Kubernetes template running a Coder agent; without a node, the
// provider-free template's.

// coderServiceAccount is the ServiceAccount the dev coderd's provisioner
// runs kubectl as, named as a deployed control plane names coderd's.
const coderServiceAccount = controlPlaneName

// agentReadyTimeout bounds the wait for a demo workspace's agent.
const agentReadyTimeout = 5 * time.Minute

// coderdWorkspaceAccess gives the dev coderd what a control plane's
// workspace RBAC gives a coderd it deploys: ServiceAccount
// coder-system/coder bound to the chart's workspace ClusterRole (which the
// chart installs later) in the control plane's namespace, and nothing
// else. It returns coderd's extra environment: KUBECONFIG, which coderd's
// provisioner passes to OpenTofu and so to the template's kubectl.
func coderdWorkspaceAccess(ctx context.Context, stateDir string, kube *testenv.KubeAPI) ([]string, error) {
	kc, err := kube.WorkspaceKubeconfig(ctx, serviceNamespace, coderServiceAccount, releaseName+"-workspace", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(stateDir, "coderd.kubeconfig")
	if err := os.WriteFile(path, kc, 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", path, err)
	}
	return []string{"KUBECONFIG=" + path}, nil
}

// demoTemplateFiles are the demo template's files: with a node, the
// Kubernetes template with the Coder image pushed to the node's registry;
// without, the provider-free template.
func demoTemplateFiles(ctx context.Context, node *nodeenv.Node) (map[string]string, error) {
	if node == nil {
		return testenv.ProviderFreeTemplate(), nil
	}
	img, err := nodeenv.CoderImage()
	if err != nil {
		return nil, err
	}
	ref, err := node.Registry.PushImage(ctx, "coder:workspace", img)
	if err != nil {
		return nil, err
	}
	return testenv.KubernetesTemplate(testenv.KubernetesTemplateOptions{Namespace: serviceNamespace, Image: ref}), nil
}

// memberDemo is the part of the summary that shows identity mapping: the
// member's kubeconfig sees and changes only what Coder lets the member.
func memberDemo(kubeconfig, owner string) string {
	if kubeconfig == "" {
		return ""
	}
	return fmt.Sprintf(`
Identity mapping (spec.identity.mode Mapped): Kubernetes user %[1]s@example.com acts in Coder as
member %[1]s; the admin kubeconfig and the MCP ServiceAccount are mapped to owner %[3]s.
%[1]s holds ClusterRole %[8]s in %[4]s (a RoleBinding), not edit: whoever may read the Secrets
of a control plane's namespace, or run pods there as its ServiceAccounts, is a Coder owner.
  export KUBECONFIG=%[2]s
  kubectl get cws -n %[4]s                        # only %[1]s's workspace
  kubectl patch cws coder.%[1]s.%[5]s -n %[4]s --type merge -p '{"spec":{"running":false}}'
  kubectl get cws coder.%[1]s.%[5]s -n %[4]s -o jsonpath='{.status.latestBuild.initiator}'   # %[1]s
  kubectl get cws coder.%[3]s.%[6]s -n %[4]s       # NotFound: Coder does not show it to %[1]s
  kubectl get ctpl coder.%[7]s -n %[4]s -o jsonpath='{.spec.files}'   # empty: only template admins see files
  kubectl auth can-i get secrets -n %[4]s          # no: %[8]s reaches no credential
`, demoMember, kubeconfig, owner, serviceNamespace, demoMemberWorkspace, demoWorkspace, demoTemplate, memberRole)
}

// createMember creates the demo member in Coder with a workspace, and the
// Kubernetes user of the member's email, bound to the chart's workspace-user
// ClusterRole in the control plane's namespace (not edit: that namespace
// holds the owner token, so edit would make the member a Coder owner); it
// writes that user's kubeconfig.
func createMember(ctx context.Context, kube *testenv.KubeAPI, coder *testenv.Coder, kubeconfig string) error {
	email := demoMember + "@example.com"
	if _, err := coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: email, Username: demoMember, Password: coder.Password + "-" + demoMember,
		OrganizationIDs: []uuid.UUID{coder.OrganizationID}, UserLoginType: codersdk.LoginTypePassword,
	}); err != nil {
		return fmt.Errorf("create Coder user %s: %w", demoMember, err)
	}
	tpl, err := coder.Client.TemplateByName(ctx, coder.OrganizationID, demoTemplate)
	if err != nil {
		return fmt.Errorf("template %s: %w", demoTemplate, err)
	}
	ws, err := coder.Client.CreateUserWorkspace(ctx, demoMember, codersdk.CreateWorkspaceRequest{TemplateID: tpl.ID, Name: demoMemberWorkspace})
	if err != nil {
		return fmt.Errorf("create workspace %s for %s: %w", demoMemberWorkspace, demoMember, err)
	}
	if _, err := coder.WaitBuild(ctx, ws.LatestBuild.ID); err != nil {
		return err
	}
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: memberRole + "-" + demoMember, Namespace: serviceNamespace},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: memberRole},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: email}}}
	if err := c.Create(ctx, binding); err != nil {
		return fmt.Errorf("bind ClusterRole %s to %s: %w", memberRole, email, err)
	}
	b, err := kube.UserKubeconfig(email)
	if err != nil {
		return err
	}
	return os.WriteFile(kubeconfig, b, 0o600)
}

// workspaceDemo is the part of the summary about the demo workspaces on
// the node (onNode), or "".
func workspaceDemo(onNode bool, coder *testenv.Coder, tokenFile string) string {
	if !onNode {
		return ""
	}
	return fmt.Sprintf(`
Workspaces on the node: %[1]s and %[2]s are pods in %[3]s (template %[4]s: Coder's provider,
kubectl through local-exec as ServiceAccount %[3]s/%[5]s), each with a connected agent:
  kubectl get pods -n %[3]s -l app.kubernetes.io/name=coder-workspace -L com.coder.workspace.name
  kubectl wait --for=condition=Ready cws/coder.%[6]s.%[1]s -n %[3]s --timeout=5m
  kubectl get --raw /apis/aggregation.coder.com/v1alpha1/namespaces/%[3]s/coderworkspaces/coder.%[6]s.%[1]s/log   # the build log
  CODER_URL=%[7]s CODER_SESSION_TOKEN=$(cat %[8]s) bin/coder ssh %[1]s -- echo hello from the pod
`, demoWorkspace, demoMemberWorkspace, serviceNamespace, demoTemplate, coderServiceAccount, coder.Username, coder.URL, tokenFile)
}
