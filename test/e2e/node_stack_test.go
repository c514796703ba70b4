package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

// The stack with a real node, where workspaces of the Kubernetes template
// (testenv.KubernetesTemplate) run as pods whose Coder agent connects to
// coderd. Starting a node costs about half a minute and a core's worth of
// processes, so tests that need one share a stack through subtests.

const (
	// nodeRelease is the chart release the node stack's operator runs as:
	// its workspace ClusterRole is the chart's default, coder-k8s-workspace.
	nodeRelease = "coder-k8s"
	// kubernetesTemplate is the Kubernetes template's name in Coder.
	kubernetesTemplate = "kubernetes"
	// coderServiceAccount is the ServiceAccount coderd's kubectl acts as,
	// named as a deployed control plane names coderd's (after the
	// control plane, coder).
	coderServiceAccount = "coder"
)

// stackNode is the node of a stack started withNode.
type stackNode struct {
	network *nodeenv.Network
	node    *nodeenv.Node
	// image is the Coder image (nodeenv.CoderImage) in the node's
	// registry: the workspace pods run `coder agent` from it.
	image string
}

// withNode starts the stack with a real node (see newNodeStack).
func withNode() stackOption { return func(c *stackConfig) { c.node = true } }

// kubeAPIOptions are the stack's kube-apiserver options: with a node, the
// node's network comes first and kube-apiserver serves on it.
func (s *aggStack) kubeAPIOptions(t testing.TB) testenv.KubeAPIOptions {
	if !s.cfg.node {
		return testenv.KubeAPIOptions{}
	}
	s.node = &stackNode{network: nodeenv.NewNetwork(t)}
	// The operator runs on this machine, behind the ExternalName Service
	// every e2e stack routes the APIService through: the aggregator
	// resolves that only when it does not route to endpoints itself.
	return testenv.KubeAPIOptions{Node: s.node.network.Serving(), Args: map[string]string{"enable-aggregator-routing": "false"}}
}

// startNode starts the node, pushes the Coder image to its registry and
// prepares coderd's options: it listens on the host's end of the node's
// network (which pods reach) and its provisioner's kubectl acts as
// ServiceAccount coder/coder, bound in the stack's namespace to the chart's
// workspace ClusterRole only, as a control plane's workspace RBAC binds
// coderd's ServiceAccount.
func (s *aggStack) startNode(t testing.TB) {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	s.node.node = nodeenv.NewNode(t, s.k, s.node.network)
	t.Logf("node Ready in %s", time.Since(start).Round(time.Millisecond))
	img, err := nodeenv.CoderImage()
	if err != nil {
		t.Fatal(err)
	}
	if s.node.image, err = s.node.node.Registry.PushImage(ctx, "coder:workspace", img); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := s.k.WorkspaceKubeconfig(ctx, s.ns, coderServiceAccount, nodeRelease+"-workspace", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "coderd.kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	s.cfg.coder.Host = s.node.network.HostIP.String()
	s.cfg.coder.Env = append(s.cfg.coder.Env, "KUBECONFIG="+path)
}

// newNodeStack is newStack with a real node: kube-apiserver serving the
// node's network, the node (kubelet, containerd, kube-proxy, CoreDNS,
// kube-scheduler, kube-controller-manager) with the Coder image in its
// registry, coderd on the node network's host address, the operator in
// Mapped mode as chart release coder-k8s, and the Kubernetes template
// pushed to Coder as kubernetesTemplate. Its workspaces are pods in the
// stack's namespace.
func newNodeStack(t testing.TB, opts ...stackOption) *aggStack {
	t.Helper()
	start := time.Now()
	s := newStack(t, append([]stackOption{withNode(), withOperator(OperatorOptions{Release: nodeRelease})}, opts...)...)
	tplStart := time.Now()
	if _, err := s.coder.PushTemplate(t.Context(), kubernetesTemplate, testenv.KubernetesTemplate(testenv.KubernetesTemplateOptions{
		Namespace: s.ns, Image: s.node.image,
	})); err != nil {
		t.Fatal(err)
	}
	t.Logf("node stack up in %s (template %s imported in %s)", time.Since(start).Round(time.Millisecond),
		kubernetesTemplate, time.Since(tplStart).Round(time.Millisecond))
	return s
}

// nodeMember creates Coder member name (name@example.com), bound in the
// stack's namespace to the chart's workspace-user ClusterRole as the
// Kubernetes user of that email (which Mapped mode maps to the member by
// email), and returns kubectl as that user.
func (s *aggStack) nodeMember(t testing.TB, name string) testenv.Kubectl {
	t.Helper()
	ctx := t.Context()
	email := name + "@example.com"
	if _, err := s.coder.Client.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: email, Username: name, Password: "SomeSecurePassword!1", OrganizationIDs: []uuid.UUID{s.coder.OrganizationID},
		UserLoginType: codersdk.LoginTypePassword,
	}); err != nil {
		t.Fatalf("create Coder user %s: %v", name, err)
	}
	role := nodeRelease + "-workspace-user"
	binding := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role + "-" + name, Namespace: s.ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: email}}}
	if err := s.c.Create(ctx, binding); err != nil {
		t.Fatal(err)
	}
	return s.kubectlAs(t, email, "", "")
}

// runningWorkspaceManifest writes the manifest of a running CoderWorkspace
// of template with parameters (name, value pairs) for kubectl -f.
func runningWorkspaceManifest(t testing.TB, name, ns, template string, params ...[2]string) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: aggregation.coder.com/v1alpha1\nkind: CoderWorkspace\nmetadata: {name: %s, namespace: %s}\nspec:\n  templateName: %s\n  running: true\n", name, ns, template)
	if len(params) > 0 {
		b.WriteString("  parameters:\n")
	}
	for _, p := range params {
		fmt.Fprintf(&b, "  - {name: %s, value: %q}\n", p[0], p[1])
	}
	return writeManifest(t, b.String())
}

// workspacePods lists the pods of Coder workspace id (label
// com.coder.workspace.id) in the stack's namespace.
func (s *aggStack) workspacePods(ctx context.Context, id uuid.UUID) ([]corev1.Pod, error) {
	l, err := s.k.Clientset.CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: "com.coder.workspace.id=" + id.String()})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// waitAgentReady waits until workspace owner/name's latest build
// succeeded and its every agent is connected with lifecycle ready
// (Coder.WaitAgentsReady), and returns the workspace.
func (s *aggStack) waitAgentReady(t testing.TB, owner, name string, timeout time.Duration) codersdk.Workspace {
	t.Helper()
	ws, err := s.coder.WaitAgentsReady(t.Context(), owner, name, timeout)
	if err != nil {
		t.Fatalf("%v\n%s", err, s.workspacePodsReport(ws))
	}
	return ws
}

// workspacePodsReport describes workspace ws's pods (status and events)
// and prints the tail of their logs (the agent's): why an agent did not
// connect.
func (s *aggStack) workspacePodsReport(ws codersdk.Workspace) string {
	sel := "-l=com.coder.workspace.id=" + ws.ID.String()
	describe, _ := s.run("describe", "pods", "-n", s.ns, sel)
	logs, _ := s.run("logs", "-n", s.ns, sel, "--all-containers", "--tail=60", "--prefix")
	return "workspace pods:\n" + describe + "\nworkspace pod logs:\n" + logs
}

// buildLog is the log of a workspace build as coderd returns it, one
// "stage: output" line each.
func (s *aggStack) buildLog(t testing.TB, buildID uuid.UUID) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	logs, closer, err := s.coder.Client.WorkspaceBuildLogsAfter(ctx, buildID, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	var b strings.Builder
	for l := range logs {
		fmt.Fprintf(&b, "%s: %s\n", l.Stage, l.Output)
	}
	return b.String()
}
