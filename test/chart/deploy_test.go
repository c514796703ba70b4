package chart

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

// TestDeployedCoderd runs a coderd that coder-k8s deploys, for real, on
// the test stack's node. The chart installs coder-k8s; a CoderControlPlane
// in deploy mode runs coderd's image (built from the coder binary the
// stack runs, laid out like Coder's release image) against PostgreSQL on
// this machine. The operator creates coderd's first user through the pod,
// then reaches coderd through its Service by name (cluster DNS) and holds
// its own token; coderd serves through that Service; and a template and a
// workspace created with kubectl build in that coderd. The control plane
// runs in identity mode Mapped, the default: the cluster admin signs in
// with the first user's credentials, creates their own owner account, and
// maps their Kubernetes user to it, which then builds the workspace.
func TestDeployedCoderd(t *testing.T) {
	on := newOnNode(t, "deploy")
	c, node, ctx := on.cluster, on.node, t.Context()

	pg, err := testenv.StartPostgres(ctx, testenv.PostgresOptions{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Stop)
	if _, err := pg.CreateDatabase(ctx, "coder"); err != nil {
		t.Fatal(err)
	}
	coderImage, err := nodeenv.CoderImage()
	if err != nil {
		t.Fatal(err)
	}
	coderRef, err := node.Registry.PushImage(ctx, "coder:v2.30.0", coderImage)
	if err != nil {
		t.Fatal(err)
	}

	h := newHelmCLI(t)
	h.kubeconfig = c.k.KubeconfigPath
	if out, stderr, err := h.output("install", releaseName, chartDir(t), "-n", "coder-system", "--create-namespace",
		"--set", "image.registry="+node.Registry.Host, "--set", "image.repository=coder-k8s", "--set", "image.tag=deploy",
		"--wait", "--timeout", "3m"); err != nil {
		t.Fatalf("helm install: %v\n%s%s\n%s", err, out, stderr, podsReport(c, "coder-system"))
	}

	// ns holds the control plane; coderOwner is the Coder owner the
	// cluster admin's Kubernetes user maps to.
	const ns, coderOwner = "coder", "ops"
	if _, err := c.k.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.k.Clientset.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "coder-db"},
		StringData: map[string]string{"url": pg.NodeURL("coder")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	apply := func(manifest string) {
		t.Helper()
		f := filepath.Join(t.TempDir(), "manifest.yaml")
		if err := os.WriteFile(f, []byte(manifest), 0o600); err != nil {
			t.Fatal(err)
		}
		c.kubectl(t, "create", "-n", ns, "-f", f)
	}
	// As config/samples/coder_v1alpha1_codercontrolplane.yaml, with the
	// image from the node's registry.
	apply(fmt.Sprintf(`apiVersion: coder.com/v1alpha1
kind: CoderControlPlane
metadata:
  name: coder
spec:
  image: %s
  replicas: 1
  # kubectl acts as the Kubernetes user admin: the Coder owner %[2]s, whom
  # the test creates below.
  identity:
    mappings: [{kubernetesUser: admin, coderUser: %[2]s}]
  env:
    - name: CODER_PG_CONNECTION_URL
      valueFrom:
        secretKeyRef: {name: coder-db, key: url}
    # Nothing may leave the machine.
    - {name: CODER_TELEMETRY_ENABLE, value: "false"}
    - {name: CODER_UPDATE_CHECK, value: "false"}
    - {name: CODER_DERP_SERVER_STUN_ADDRESSES, value: disable}
  service:
    type: ClusterIP
    port: 80
`, coderRef, coderOwner))

	start := time.Now()
	for _, cond := range []string{"Initialized", "OperatorAccessReady", "Available"} {
		if out, stderr, err := c.runKubectl("wait", "-n", ns, "codercontrolplane/coder", "--for=condition="+cond, "--timeout=5m"); err != nil {
			yaml, _, _ := c.runKubectl("get", "-n", ns, "codercontrolplane/coder", "-o", "yaml")
			t.Fatalf("CoderControlPlane condition %s: %v\n%s%s\n%s\n%s", cond, err, out, stderr, yaml, podsReport(c, ns))
		}
	}
	t.Logf("the deployed coderd is set up and the operator holds its token %s after the CoderControlPlane's creation", time.Since(start).Round(time.Second))

	// coderd serves through its Service, the address every client in the
	// cluster uses (this machine routes Service addresses to the node).
	svc, err := c.k.Clientset.CoreV1().Services(ns).Get(ctx, "coder", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Version string `json:"version"`
	}
	coderURL := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))
	// kube-proxy programs a new Service's endpoints asynchronously.
	testenv.WaitFor(t, 30*time.Second, func() error {
		return getJSON(ctx, coderURL+"/api/v2/buildinfo", &info)
	})
	if !strings.HasPrefix(info.Version, "v2.30.0") {
		t.Errorf("coderd reports version %q, want v2.30.0", info.Version)
	}
	createOwner(t, c, coderURL, ns, coderOwner)

	// A template and a workspace, with kubectl, built by the deployed
	// coderd's Terraform provisioner (OpenTofu in its image).
	files, err := json.Marshal(testenv.ProviderFreeTemplate())
	if err != nil {
		t.Fatal(err)
	}
	apply(fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderTemplate
metadata:
  name: coder.demo
spec:
  files: %s
`, files))
	if out, stderr, err := c.runKubectl("wait", "-n", ns, "codertemplate/coder.demo", "--for=condition=Ready", "--timeout=3m"); err != nil {
		yaml, _, _ := c.runKubectl("get", "-n", ns, "codertemplate/coder.demo", "-o", "yaml")
		t.Fatalf("the template did not build: %v\n%s%s\n%s\ncoder-k8s log:\n%s", err, out, stderr, yaml, operatorLogTail(c))
	}
	workspace := "coder." + coderOwner + ".demo"
	apply(fmt.Sprintf(`apiVersion: aggregation.coder.com/v1alpha1
kind: CoderWorkspace
metadata:
  name: %s
spec:
  templateName: demo
  running: true
`, workspace))
	if out, stderr, err := c.runKubectl("wait", "-n", ns, "coderworkspace/"+workspace, "--for=jsonpath={.status.phase}=running", "--timeout=3m"); err != nil {
		yaml, _, _ := c.runKubectl("get", "-n", ns, "coderworkspace/"+workspace, "-o", "yaml")
		t.Fatalf("the workspace did not start: %v\n%s%s\n%s\ncoder-k8s log:\n%s", err, out, stderr, yaml, operatorLogTail(c))
	}
	out := c.kubectl(t, "get", "-n", ns, "coderworkspaces")
	if !strings.Contains(out, workspace) || !strings.Contains(out, "running") {
		t.Errorf("kubectl get coderworkspaces:\n%s\nwant %s running", out, workspace)
	}
	// Built as the admin's own Coder user, not as coder-k8s.
	if initiator := c.kubectl(t, "get", "-n", ns, "coderworkspace/"+workspace, "-o", "jsonpath={.status.latestBuild.initiator}"); initiator != coderOwner {
		t.Errorf("the workspace's build was started by %q, want %s", initiator, coderOwner)
	}
}

// getJSON GETs url and decodes its JSON answer into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %.300s", resp.Status, body)
	}
	return json.Unmarshal(body, v)
}

// operatorLogTail is what of the coder-k8s pod's log a failure message
// shows: its errors (a failed poll, say), which its startup lines would
// push out of a plain tail, then its last lines.
func operatorLogTail(c *cluster) string {
	out, errOut, _ := c.runKubectl("logs", "-n", "coder-system", "-l", "app.kubernetes.io/name=coder-k8s", "--tail=-1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var errs []string
	for _, l := range lines {
		if strings.Contains(l, `"level":"error"`) && len(errs) < 20 {
			errs = append(errs, l)
		}
	}
	lines = lines[max(0, len(lines)-40):]
	return "errors:\n" + strings.Join(errs, "\n") + "\nlast lines:\n" + strings.Join(lines, "\n") + "\n" + errOut
}

// createOwner signs in to the coderd at coderURL as the first user
// coder-k8s created for control plane ns/coder (Secret coder-admin), as
// the cluster's administrator can, creates Coder user name with the owner
// role, and signs out.
func createOwner(t *testing.T, c *cluster, coderURL, ns, name string) {
	t.Helper()
	ctx := t.Context()
	secret, err := c.k.Clientset.CoreV1().Secrets(ns).Get(ctx, "coder-admin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(coderURL)
	if err != nil {
		t.Fatal(err)
	}
	first := codersdk.New(u)
	login, err := first.LoginWithPassword(ctx, codersdk.LoginWithPasswordRequest{Email: string(secret.Data["email"]), Password: string(secret.Data["password"])})
	if err != nil {
		t.Fatalf("sign in as the first user: %v", err)
	}
	first.SetSessionToken(login.SessionToken)
	defer func() {
		if err := first.Logout(ctx); err != nil {
			t.Errorf("sign out the first user: %v", err)
		}
	}()
	org, err := first.OrganizationByName(ctx, "coder")
	if err != nil {
		t.Fatal(err)
	}
	user, err := first.CreateUserWithOrgs(ctx, codersdk.CreateUserRequestWithOrgs{
		Email: name + "@example.com", Username: name, Password: "Deployed-" + name + "-Owner!1",
		OrganizationIDs: []uuid.UUID{org.ID}, UserLoginType: codersdk.LoginTypePassword,
	})
	if err != nil {
		t.Fatalf("create Coder user %s: %v", name, err)
	}
	if _, err := first.UpdateUserRoles(ctx, user.ID.String(), codersdk.UpdateRoles{Roles: []string{codersdk.RoleOwner}}); err != nil {
		t.Fatalf("make %s an owner: %v", name, err)
	}
}
