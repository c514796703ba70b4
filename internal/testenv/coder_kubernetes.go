package testenv

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/coder/coder/v2/codersdk"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// A template whose workspaces are pods on the test node running a real
// Coder agent, shaped like Coder's kubernetes example. The pod is created
// by OpenTofu's local-exec running the stack's kubectl (no Kubernetes
// provider builds within the stack's budget); kubectl finds its cluster
// and credentials through KUBECONFIG in coderd's environment, which
// coderd's provisioner passes on (less CODER_*), as a provisioner pod's
// in-cluster ServiceAccount would be found in a cluster.

// KubernetesTemplateOptions are the defaults of the template's variables.
type KubernetesTemplateOptions struct {
	// Namespace the workspace pods run in: one that coderd's workspace RBAC
	// covers (WorkspaceKubeconfig).
	Namespace string
	// Image runs `coder agent`: nodeenv.CoderImage in the node's registry.
	Image string
}

// KubernetesTemplate returns the files of a template like Coder's
// kubernetes example: the parameters and presets of WorkspaceParametersTF,
// an agent with a startup script printing the greeting and a metadata
// item, an app whose health check is the agent's own metrics endpoint, and
// for a running workspace a Secret holding the agent token and a pod
// running `coder agent` with it, labelled as Coder's example labels them;
// a stop deletes both. The token reaches kubectl only through local-exec's
// environment, never its command line, so the build log does not show it.
func KubernetesTemplate(opts KubernetesTemplateOptions) map[string]string {
	return map[string]string{"main.tf": CoderProviderTF + `
variable "namespace" {
  type        = string
  description = "The namespace of the workspace pods: one coderd's workspace RBAC covers."
  default     = ` + hclString(opts.Namespace) + `
}

variable "image" {
  type        = string
  description = "The image of the workspace pods; it runs the Coder agent (/opt/coder agent)."
  default     = ` + hclString(opts.Image) + `
}

` + WorkspaceParametersTF + kubernetesWorkspaceTF}
}

// hclString quotes s as an HCL string literal.
func hclString(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "${", "$${", "%{", "%%{", "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// kubernetesWorkspaceTF is the agent, app and pod of KubernetesTemplate.
const kubernetesWorkspaceTF = `
data "coder_workspace" "me" {}
data "coder_workspace_owner" "me" {}

resource "coder_agent" "main" {
  os   = "linux"
  arch = "amd64"
  # Printed to the agent's startup log; the lifecycle is ready once it ends.
  startup_script = <<-EOT
    echo "${data.coder_parameter.greeting.value} from ${data.coder_workspace.me.name}"
  EOT

  metadata {
    display_name = "Memory usage"
    key          = "mem"
    script       = "/opt/coder stat mem"
    interval     = 60
    timeout      = 5
  }
}

# The agent serves Prometheus metrics on 127.0.0.1:2112: a real health check
# that needs nothing in the image but the agent.
resource "coder_app" "metrics" {
  agent_id     = coder_agent.main.id
  slug         = "metrics"
  display_name = "Agent metrics"
  url          = "http://localhost:2112/metrics"
  share        = "owner"
  subdomain    = false

  healthcheck {
    url       = "http://localhost:2112/metrics"
    interval  = 2
    threshold = 10
  }
}

locals {
  pod_name    = "coder-${data.coder_workspace.me.id}"
  secret_name = "coder-${data.coder_workspace.me.id}-agent"
  labels = {
    "app.kubernetes.io/name"     = "coder-workspace"
    "app.kubernetes.io/instance" = "coder-workspace-${data.coder_workspace.me.id}"
    "app.kubernetes.io/part-of"  = "coder"
    "com.coder.resource"         = "true"
    "com.coder.workspace.id"     = data.coder_workspace.me.id
    "com.coder.workspace.name"   = data.coder_workspace.me.name
    "com.coder.user.id"          = data.coder_workspace_owner.me.id
    "com.coder.user.username"    = data.coder_workspace_owner.me.name
  }
  pod = jsonencode({
    apiVersion = "v1"
    kind       = "Pod"
    metadata = {
      name        = local.pod_name
      namespace   = var.namespace
      labels      = local.labels
      annotations = { "com.coder.user.email" = data.coder_workspace_owner.me.email }
    }
    spec = {
      automountServiceAccountToken  = false
      terminationGracePeriodSeconds = 10
      securityContext               = { runAsUser = 1000, runAsGroup = 1000, runAsNonRoot = true, fsGroup = 1000 }
      containers = [{
        name  = "dev"
        image = var.image
        args  = ["agent"]
        env = [
          { name = "CODER_AGENT_TOKEN", valueFrom = { secretKeyRef = { name = local.secret_name, key = "token" } } },
          # coderd's access URL, which pods reach.
          { name = "CODER_AGENT_URL", value = data.coder_workspace.me.access_url },
          { name = "CPU", value = data.coder_parameter.cpu.value },
          { name = "MEMORY", value = data.coder_parameter.memory.value },
          { name = "HOME_DISK_SIZE", value = data.coder_parameter.home_disk_size.value },
          { name = "GREETING", value = data.coder_parameter.greeting.value },
          { name = "DEBUG", value = data.coder_parameter.debug.value },
        ]
        resources = {
          requests = { cpu = "10m", memory = "64Mi" }
          limits   = { cpu = data.coder_parameter.cpu.value, memory = "${data.coder_parameter.memory.value}Gi" }
        }
        securityContext = { allowPrivilegeEscalation = false, capabilities = { drop = ["ALL"] } }
      }]
    }
  })
}

resource "terraform_data" "workspace" {
  count = data.coder_workspace.me.start_count
  input = { namespace = var.namespace, pod = local.pod_name, secret = local.secret_name }
  # A new token or pod spec replaces the pod (a pod's spec cannot change).
  triggers_replace = [local.pod, coder_agent.main.token]

  # Sensitive (the token is in its environment): OpenTofu hides this one's
  # output.
  provisioner "local-exec" {
    command = <<-EOT
      set -e
      kubectl delete secret "$SECRET" -n "$NAMESPACE" --ignore-not-found --wait=false
      printf '%s' "$SECRET_MANIFEST" | kubectl create -f -
    EOT
    environment = {
      NAMESPACE = var.namespace
      SECRET    = local.secret_name
      SECRET_MANIFEST = jsonencode({
        apiVersion = "v1"
        kind       = "Secret"
        metadata   = { name = local.secret_name, namespace = var.namespace, labels = local.labels }
        type       = "Opaque"
        stringData = { token = coder_agent.main.token }
      })
    }
  }

  provisioner "local-exec" {
    command = <<-EOT
      set -e
      kubectl delete pod "$POD" -n "$NAMESPACE" --ignore-not-found --wait=true --timeout=2m
      printf '%s' "$POD_MANIFEST" | kubectl create -f -
    EOT
    environment = { NAMESPACE = var.namespace, POD = local.pod_name, POD_MANIFEST = local.pod }
  }

  provisioner "local-exec" {
    when    = destroy
    command = <<-EOT
      set -e
      kubectl delete pod "$POD" -n "$NAMESPACE" --ignore-not-found --wait=true --timeout=2m
      kubectl delete secret "$SECRET" -n "$NAMESPACE" --ignore-not-found --wait=false
    EOT
    environment = { NAMESPACE = self.input.namespace, POD = self.input.pod, SECRET = self.input.secret }
  }
}
`

// WorkspaceKubeconfig gives coderd what a CoderControlPlane's workspace
// RBAC gives the ServiceAccount of a coderd it deploys: ServiceAccount
// namespace/serviceAccount bound (a RoleBinding in namespace) to
// clusterRole, the chart's <release>-workspace. It returns a kubeconfig
// holding only a token of that ServiceAccount (valid for ttl), for
// CoderOptions.Env's KUBECONFIG. The ClusterRole may be installed later.
func (k *KubeAPI) WorkspaceKubeconfig(ctx context.Context, namespace, serviceAccount, clusterRole string, ttl time.Duration) ([]byte, error) {
	if err := k.EnsureNamespace(ctx, namespace); err != nil {
		return nil, err
	}
	cs := k.Clientset
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: serviceAccount, Namespace: namespace}}
	if _, err := cs.CoreV1().ServiceAccounts(namespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("workspace kubeconfig: create ServiceAccount %s/%s: %w", namespace, serviceAccount, err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: serviceAccount + "-workspace-" + clusterRole, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: namespace}},
	}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("workspace kubeconfig: bind ClusterRole %s in %s: %w", clusterRole, namespace, err)
	}
	seconds := int64(ttl / time.Second)
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &seconds}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("workspace kubeconfig: token of ServiceAccount %s/%s: %w", namespace, serviceAccount, err)
	}
	cfg := &rest.Config{Host: k.Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: k.Config.CAData}, BearerToken: tr.Status.Token}
	b, err := TokenKubeconfig(cfg, "system:serviceaccount:"+namespace+":"+serviceAccount, namespace)
	if err != nil {
		return nil, fmt.Errorf("workspace kubeconfig: %w", err)
	}
	return b, nil
}

// TokenKubeconfig is a kubeconfig for cfg's server and CA (data or file)
// whose only credential is cfg's bearer token, for user, with namespace as
// its default ("" for none).
func TokenKubeconfig(cfg *rest.Config, user, namespace string) ([]byte, error) {
	ca := cfg.CAData
	if len(ca) == 0 && cfg.CAFile != "" {
		b, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read CA %s: %w", cfg.CAFile, err)
		}
		ca = b
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["kube"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: ca, TLSServerName: cfg.ServerName}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["token"] = &clientcmdapi.Context{Cluster: "kube", AuthInfo: user, Namespace: namespace}
	kc.CurrentContext = "token"
	b, err := clientcmd.Write(*kc)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig of %s: %w", user, err)
	}
	return b, nil
}

// WaitAgentsReady waits until the latest build of workspace owner/name
// succeeded and each of its agents is connected with its startup script
// done (lifecycle ready), and returns the workspace; on timeout or failure
// the error says what was missing last.
func (c *Coder) WaitAgentsReady(ctx context.Context, owner, name string, timeout time.Duration) (codersdk.Workspace, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ws, err := c.Client.WorkspaceByOwnerAndName(ctx, owner, name, codersdk.WorkspaceOptions{})
		last := ""
		switch {
		case err != nil:
			last = err.Error()
		case ws.LatestBuild.Job.Status == codersdk.ProvisionerJobFailed || ws.LatestBuild.Job.Status == codersdk.ProvisionerJobCanceled:
			_, err := c.WaitBuild(ctx, ws.LatestBuild.ID)
			return ws, fmt.Errorf("workspace %s/%s: %w", owner, name, err)
		default:
			if last = AgentsNotReady(ws); last == "" {
				return ws, nil
			}
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return ws, fmt.Errorf("workspace %s/%s: no ready agent after %s: %s", owner, name, timeout, last)
		}
	}
}

// AgentsNotReady says why workspace ws is not usable yet (its latest build
// has not succeeded, it has no agent, or an agent is not connected and
// ready), or "" when it is.
func AgentsNotReady(ws codersdk.Workspace) string {
	b := ws.LatestBuild
	if b.Job.Status != codersdk.ProvisionerJobSucceeded {
		return fmt.Sprintf("build %d (%s) is %s %s", b.BuildNumber, b.Transition, b.Job.Status, b.Job.Error)
	}
	n := 0
	for _, r := range b.Resources {
		for _, a := range r.Agents {
			if a.Status != codersdk.WorkspaceAgentConnected || a.LifecycleState != codersdk.WorkspaceAgentLifecycleReady {
				return fmt.Sprintf("agent %s is %s, lifecycle %s", a.Name, a.Status, a.LifecycleState)
			}
			n++
		}
	}
	if n == 0 {
		return fmt.Sprintf("build %d has no agent", b.BuildNumber)
	}
	return ""
}
