// Command dev runs the local stack behind `make dev`: kube-apiserver + etcd,
// kube-controller-manager, PostgreSQL + coderd with a demo template and
// workspaces (on the node, pods of the Kubernetes template with connected
// agents), and coder-k8s in all mode against them. It prints how to use the
// stack and stops everything on Ctrl-C or SIGTERM.
//
// coder-k8s runs the way users run it (--run helm, the default): on the
// test stack's real node, from the image `make image` built and the chart,
// both pushed to the node's OCI registry, installed with `helm install
// oci://...`. --run binary runs the binary out of the cluster instead, as
// the chart's ServiceAccount, for fast iteration.
//
// The GitOps engine suites (test/gitops, separate Go modules that cannot
// import internal/testenv) run it with --run binary --demo=false
// --ready-file: the file appears once the aggregated API serves the control
// plane's namespace and tells them where everything is.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/chartrbac"
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

const (
	demoTemplate  = "demo"
	demoWorkspace = "demo"
	// demoMember is a Coder member (email demoMember@example.com) with a
	// workspace of their own, and the Kubernetes user of that email.
	demoMember          = "alice"
	demoMemberWorkspace = "alice-ws"
	// The Service the APIService points at; the serving certificate names it.
	// The aggregated API's Service as the chart names it for release
	// coder-k8s; autoTLS writes the CA into an APIService pointing at it.
	serviceName      = "coder-k8s-aggregated"
	serviceNamespace = "coder-system"
	aggregatedGroup  = "aggregation.coder.com"
	aggregatedVer    = "v1alpha1"
	controlPlaneName = "coder"
)

func main() {
	stateDir := flag.String("state-dir", ".dev", "directory for the generated kubeconfig, config file, certificates and logs")
	operator := flag.String("operator", "bin/coder-k8s", "coder-k8s binary to run")
	var o options
	flag.BoolVar(&o.demo, "demo", true, "push a demo template and create a demo workspace in Coder")
	flag.StringVar(&o.run, "run", "helm", "how coder-k8s runs: helm (the chart from the node's OCI registry, on a real node) or binary (out of the cluster)")
	flag.StringVar(&o.readyFile, "ready-file", "", "once the stack serves the aggregated API, write KEY=value lines (KUBECONFIG, CODER_URL, CODER_SESSION_TOKEN_FILE, CODER_USERNAME, NAMESPACE) to this file")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *stateDir, *operator, o); err != nil {
		fmt.Fprintln(os.Stderr, "dev:", err)
		os.Exit(1)
	}
}

type options struct {
	demo      bool
	run       string
	readyFile string
}

func run(ctx context.Context, stateDir, operatorBin string, o options) error {
	stateDir, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", stateDir, err)
	}
	if _, err := os.Stat(operatorBin); err != nil {
		return fmt.Errorf("%s not found: run `make build`", operatorBin)
	}

	if o.run != "helm" && o.run != "binary" {
		return fmt.Errorf("--run %q: want helm or binary", o.run)
	}
	helm := o.run == "helm"
	if helm {
		step("starting kube-apiserver, etcd and a node (kubelet, containerd, kube-proxy, kube-scheduler, kube-controller-manager)")
	} else {
		step("starting kube-apiserver and etcd")
	}
	kubeOpts := testenv.KubeAPIOptions{}
	var network *nodeenv.Network
	if helm {
		// The node's network comes first: kube-apiserver serves on it.
		if network, err = nodeenv.StartNetwork(ctx); err != nil {
			return err
		}
		defer network.Remove()
		kubeOpts.Node = network.Serving()
		// The chart installs the CRDs.
		noCRDs := filepath.Join(stateDir, "no-crds")
		if err := os.MkdirAll(noCRDs, 0o755); err != nil {
			return err
		}
		kubeOpts.CRDDirs = []string{noCRDs}
	}
	kube, err := testenv.StartKubeAPI(ctx, kubeOpts)
	if err != nil {
		return err
	}
	defer kube.Stop()
	var node *nodeenv.Node
	coderOpts := testenv.CoderOptions{}
	if helm {
		if node, err = nodeenv.StartNode(ctx, kube, network); err != nil {
			return err
		}
		defer node.Stop()
		// Where the operator's pod and the workspaces' agents reach it.
		coderOpts.Host = node.HostIP().String()
		if coderOpts.Env, err = coderdWorkspaceAccess(ctx, stateDir, kube); err != nil {
			return err
		}
	} else {
		// As in a cluster: the garbage collector deletes objects whose
		// owner is gone (aggregated ones included), the namespace
		// controller empties deleted namespaces.
		step("starting kube-controller-manager (garbage collector, namespace controller)")
		kcm, err := kube.StartControllerManager(ctx, "garbage-collector-controller", "namespace-controller")
		if err != nil {
			return err
		}
		defer kcm.Stop(10 * time.Second)
	}

	step("starting PostgreSQL and coderd (Terraform provisioner: OpenTofu)")
	coder, err := testenv.StartCoder(ctx, coderOpts)
	if err != nil {
		return err
	}
	defer coder.Stop()

	if o.demo {
		step("pushing template %q", demoTemplate)
		files, err := demoTemplateFiles(ctx, node)
		if err != nil {
			return err
		}
		if _, err := coder.PushTemplate(ctx, demoTemplate, files); err != nil {
			return err
		}
	}

	var op *operator
	if helm {
		step("installing coder-k8s with helm from the node's OCI registry (%s)", node.Registry.Host)
		op, err = installChart(ctx, stateDir, kube, node)
	} else {
		step("starting coder-k8s (app: all)")
		op, err = startOperator(ctx, stateDir, operatorBin, kube, coder)
	}
	if err != nil {
		return err
	}
	if op.proc != nil {
		defer op.proc.Stop(30 * time.Second)
	}

	step("adopting the dev coderd: CoderControlPlane %s/%s (externalURL, identity Mapped)", serviceNamespace, controlPlaneName)
	if err := adoptCoderd(ctx, kube, coder); err != nil {
		return err
	}

	kubeconfig := filepath.Join(stateDir, "kubeconfig")
	if err := copyFile(kube.KubeconfigPath, kubeconfig); err != nil {
		return err
	}
	if !helm {
		if err := claimForRelease(ctx, kube); err != nil {
			return err
		}
	}

	memberKubeconfig := ""
	if o.demo {
		// After the chart: it installs the workspace ClusterRole the
		// builds' kubectl needs.
		step("creating workspace %q", demoWorkspace)
		if _, err := coder.CreateWorkspace(ctx, demoTemplate, demoWorkspace); err != nil {
			return err
		}
		memberKubeconfig = filepath.Join(stateDir, demoMember+".kubeconfig")
		step("creating Coder member %s@example.com with workspace %q, and Kubernetes user %s@example.com (%s)", demoMember, demoMemberWorkspace, demoMember, memberKubeconfig)
		if err := createMember(ctx, kube, coder, memberKubeconfig); err != nil {
			return err
		}
		if helm {
			step("waiting for the agents of %q and %q (pods in %s on the node)", demoWorkspace, demoMemberWorkspace, serviceNamespace)
			for owner, ws := range map[string]string{coder.Username: demoWorkspace, demoMember: demoMemberWorkspace} {
				if _, err := coder.WaitAgentsReady(ctx, owner, ws, agentReadyTimeout); err != nil {
					return err
				}
			}
		}
	}

	step("creating ServiceAccount %s/%s for MCP clients", serviceNamespace, mcpAgent)
	mcpToken, err := mcpAgentToken(ctx, kube)
	if err != nil {
		return err
	}
	mcpTokenFile := filepath.Join(stateDir, "mcp-token")
	if err := os.WriteFile(mcpTokenFile, []byte(mcpToken), 0o600); err != nil {
		return fmt.Errorf("write MCP token: %w", err)
	}
	tokenFile := filepath.Join(stateDir, "coder-session-token")
	if err := os.WriteFile(tokenFile, []byte(coder.SessionToken), 0o600); err != nil {
		return fmt.Errorf("write session token: %w", err)
	}

	if o.readyFile != "" {
		step("waiting for the aggregated API to serve namespace %s", serviceNamespace)
		if err := waitServed(ctx, kube); err != nil {
			return fmt.Errorf("%w (coder-k8s log: %s)", err, op.log)
		}
		ready := fmt.Sprintf("KUBECONFIG=%s\nCODER_URL=%s\nCODER_SESSION_TOKEN_FILE=%s\nCODER_USERNAME=%s\nNAMESPACE=%s\nOPERATOR_LOG=%s\n",
			kubeconfig, coder.URL, tokenFile, coder.Username, serviceNamespace, op.log)
		if err := writeFileAtomic(o.readyFile, []byte(ready)); err != nil {
			return err
		}
	}

	fmt.Printf(`
coder-k8s dev stack is up. In another shell:

  export KUBECONFIG=%s
  kubectl get ns
  kubectl get lease -n %s                   # the controller's leader lease
  kubectl get coder -A                          # CoderControlPlane %s adopting the dev coderd
  kubectl get cws -A -o wide                    # Coder workspaces through the aggregated API
  %s
  kubectl explain codertemplate.spec.files
  kubectl patch cws coder.%s.%s -n %s --type merge -p '{"spec":{"running":false}}'
  kubectl get cws -n %s -w                      # then, in a third shell, start it with the coder CLI:
  CODER_URL=%s CODER_SESSION_TOKEN=$(cat %s) bin/coder start %s/%s

Coder:        %s
  user:       %s / %s
  token:      %s
  workspace:  %s (template %s)
coder-k8s:
  health:     %s
  metrics:    %s/metrics
  MCP:        %s/mcp   (bearer token of ServiceAccount %s/%s: %s)
  aggregated: %s  (%s)
  identity:   %s  (the chart's RBAC for mode all)
  log:        %s

An MCP tool call (stateless: no session needed), for example:
  curl -s %s/mcp -H "Authorization: Bearer $(cat %s)" -H 'Content-Type: application/json' \
    -H 'Accept: application/json, text/event-stream' \
    -d '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_workspaces","arguments":{}}}'
%s%s
Ctrl-C stops everything.
`, kubeconfig, serviceNamespace, controlPlaneName, op.chartHint,
		coder.Username, demoWorkspace, serviceNamespace, serviceNamespace, coder.URL, tokenFile, coder.Username, demoWorkspace,
		coder.URL, coder.Email, coder.Password, tokenFile,
		demoWorkspace, demoTemplate, op.health, op.metrics, op.mcp, serviceNamespace, mcpAgent, mcpTokenFile,
		op.aggregated, op.apiService, op.identity, op.log, op.mcp, mcpTokenFile, memberDemo(memberKubeconfig, coder.Username),
		workspaceDemo(o.demo && helm, coder, tokenFile))

	select {
	case <-ctx.Done():
		step("stopping")
		return nil
	case <-op.exited():
		_, err := op.proc.Exited()
		return fmt.Errorf("coder-k8s exited (%v); log tail:\n%s", err, op.proc.LogTail(30))
	}
}

// operator is where the running coder-k8s answers, for the summary.
type operator struct {
	// proc is the out-of-cluster process (--run binary), else nil.
	proc                                         *testenv.Process
	health, metrics, mcp, aggregated, apiService string
	// identity is the ServiceAccount coder-k8s authenticates as.
	identity string
	// log is its log file, or the command that shows it.
	log string
	// chartHint is a helm command to try against the stack.
	chartHint string
}

// exited is closed when the out-of-cluster process ends; never for pods,
// which the kubelet restarts.
func (o *operator) exited() <-chan struct{} {
	c := make(chan struct{})
	if o.proc == nil {
		return c
	}
	go func() {
		for {
			if done, _ := o.proc.Exited(); done {
				close(c)
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	}()
	return c
}

func startOperator(ctx context.Context, stateDir, bin string, kube *testenv.KubeAPI, coder *testenv.Coder) (*operator, error) {
	ports := map[string]int{}
	for _, name := range []string{"health", "metrics", "aggregated", "mcp"} {
		p, err := testenv.FreePort()
		if err != nil {
			return nil, err
		}
		ports[name] = p
	}

	// The config file is the one the Helm chart renders for these values,
	// so the local stack runs the same config path as a cluster. TLS mode
	// auto: the binary keeps its certificate in a Secret and writes the CA
	// into the APIService itself.
	values := fmt.Sprintf(`mode: all
ports: {health: %d, metrics: %d, aggregatedAPI: %d, mcp: %d}
tls: {mode: auto}
config:
  logging: {level: info, format: console}
  controller:
    leaderElection: {namespace: %s}
`, ports["health"], ports["metrics"], ports["aggregated"], ports["mcp"], serviceNamespace)
	valuesPath := filepath.Join(stateDir, "values.yaml")
	if err := os.WriteFile(valuesPath, []byte(values), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", valuesPath, err)
	}
	cfg, err := chartConfig(ctx, valuesPath)
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(stateDir, "config.yaml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", cfgPath, err)
	}
	if err := kube.EnsureNamespace(ctx, serviceNamespace); err != nil {
		return nil, err
	}

	// The pod's identity: the chart's ServiceAccount with the RBAC the
	// chart renders for these values, and nothing else.
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(values), &vals); err != nil {
		return nil, fmt.Errorf("parse %s: %w", valuesPath, err)
	}
	id, err := chartrbac.Grant(ctx, kube.Config, chartrbac.Options{
		Release: releaseName, Namespace: serviceNamespace, Values: vals,
		KubeconfigPath: filepath.Join(stateDir, "operator-kubeconfig"),
	})
	if err != nil {
		return nil, err
	}

	cmd := exec.Command(bin, "--config", cfgPath)
	// Out of the cluster: a kubeconfig holding the ServiceAccount's token
	// instead of the pod's mounted one.
	cmd.Env = append(os.Environ(), "KUBECONFIG="+id.KubeconfigPath, "POD_NAMESPACE="+serviceNamespace)
	proc, err := testenv.StartProcess("coder-k8s", cmd, filepath.Join(stateDir, "coder-k8s.log"))
	if err != nil {
		return nil, err
	}
	op := &operator{
		proc:       proc,
		identity:   id.Username,
		health:     "http://127.0.0.1:" + strconv.Itoa(ports["health"]) + "/readyz",
		metrics:    "http://127.0.0.1:" + strconv.Itoa(ports["metrics"]),
		mcp:        "http://127.0.0.1:" + strconv.Itoa(ports["mcp"]),
		aggregated: "https://127.0.0.1:" + strconv.Itoa(ports["aggregated"]),
		log:        proc.LogPath,
		chartHint:  "bin/helm install --dry-run coder-k8s charts/coder-k8s -n " + serviceNamespace + "   # the chart against this stack",
	}
	err = proc.WaitReady(ctx, time.Minute, func(ctx context.Context) error {
		return httpOK(ctx, op.health)
	})
	if err != nil {
		proc.Stop(10 * time.Second)
		return nil, err
	}

	// Route aggregation.coder.com through kube-apiserver, with the CA
	// bundle as in a cluster.
	err = kube.RegisterAPIService(ctx, testenv.APIService{
		Group: aggregatedGroup, Version: aggregatedVer, Port: ports["aggregated"],
		ServiceName: serviceName, ServiceNamespace: serviceNamespace, Timeout: 60 * time.Second,
	})
	if err != nil {
		proc.Stop(10 * time.Second)
		return nil, fmt.Errorf("register the aggregated API: %w (log: %s)", err, proc.LogPath)
	}
	op.apiService = "APIService v1alpha1.aggregation.coder.com"
	return op, nil
}

// adoptCoderd creates a CoderControlPlane that adopts the dev coderd, with
// the owner's session token in a Secret, so the controller sets up the
// operator's own user and token as it would for any existing coderd.
func adoptCoderd(ctx context.Context, kube *testenv.KubeAPI, coder *testenv.Coder) error {
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	owner := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "coder-owner-token", Namespace: serviceNamespace},
		Data:       map[string][]byte{"token": []byte(coder.SessionToken)},
	}
	if err := c.Create(ctx, owner); err != nil {
		return fmt.Errorf("create Secret %s: %w", owner.Name, err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: controlPlaneName, Namespace: serviceNamespace},
		Spec: coderv1alpha1.CoderControlPlaneSpec{
			ExternalURL: coder.URL.String(),
			OperatorAccess: coderv1alpha1.OperatorAccessSpec{
				OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: owner.Name, Key: "token"},
			},
			// Everyone else maps by email (the demo member); the stack's
			// admin and the MCP agent act as the Coder owner.
			Identity: coderv1alpha1.IdentitySpec{Mode: "Mapped", MatchBy: "Email", Mappings: []coderv1alpha1.IdentityMapping{
				{KubernetesUser: "admin", CoderUser: coder.Username},
				{KubernetesUser: "system:serviceaccount:" + serviceNamespace + ":" + mcpAgent, CoderUser: coder.Username},
			}},
		},
	}
	if err := c.Create(ctx, ccp); err != nil {
		return fmt.Errorf("create CoderControlPlane %s: %w", ccp.Name, err)
	}
	return nil
}

// releaseName is the Helm release the local stack stands for.
const releaseName = "coder-k8s"

// memberRole is the ClusterRole the chart ships (rbac.userRoles) for
// developers, bound to the demo member.
const memberRole = releaseName + "-workspace-user"

// claimForRelease gives the objects the stack created that the chart also
// renders (the CRDs, the aggregated API's Service and APIService) Helm's
// ownership metadata for release coder-k8s, so that the chart can be
// checked against the stack: helm install --dry-run, helm template |
// kubectl diff.
func claimForRelease(ctx context.Context, kube *testenv.KubeAPI) error {
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	patch := fmt.Appendf(nil, `{"metadata":{"labels":{"app.kubernetes.io/managed-by":"Helm"},"annotations":{"meta.helm.sh/release-name":%q,"meta.helm.sh/release-namespace":%q}}}`,
		releaseName, serviceNamespace)
	objs := []struct {
		gvk       schema.GroupVersionKind
		namespace string
		name      string
	}{
		{schema.GroupVersionKind{Group: "apiregistration.k8s.io", Version: "v1", Kind: "APIService"}, "", aggregatedVer + "." + aggregatedGroup},
		{schema.GroupVersionKind{Version: "v1", Kind: "Service"}, serviceNamespace, serviceName},
	}
	for _, crd := range []string{"codercontrolplanes", "coderprovisioners", "coderworkspaceproxies"} {
		objs = append(objs, struct {
			gvk       schema.GroupVersionKind
			namespace string
			name      string
		}{schema.GroupVersionKind{Group: "apiextensions.k8s.io", Version: "v1", Kind: "CustomResourceDefinition"}, "", crd + ".coder.com"})
	}
	for _, o := range objs {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(o.gvk)
		u.SetNamespace(o.namespace)
		u.SetName(o.name)
		if err := c.Patch(ctx, u, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("label %s %s for release %s: %w", o.gvk.Kind, o.name, releaseName, err)
		}
	}
	return nil
}

// chartConfig renders charts/coder-k8s with the values file (release
// coder-k8s in serviceNamespace) and returns the config file of its
// ConfigMap.
func chartConfig(ctx context.Context, valuesPath string) ([]byte, error) {
	helm, err := testenv.Binary("helm")
	if err != nil {
		return nil, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	out, err := exec.CommandContext(ctx, helm, "template", "coder-k8s", filepath.Join(root, "charts", "coder-k8s"),
		"--namespace", serviceNamespace, "--values", valuesPath, "--show-only", "templates/configmap.yaml").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("helm template: %w\n%s", err, out)
	}
	var cm corev1.ConfigMap
	if err := yaml.Unmarshal(out, &cm); err != nil {
		return nil, fmt.Errorf("the chart's ConfigMap: %w", err)
	}
	cfg, ok := cm.Data["config.yaml"]
	if !ok {
		return nil, errors.New("the chart's ConfigMap has no config.yaml")
	}
	return []byte(cfg), nil
}

// waitServed waits until the adopted control plane's OperatorAccessReady is
// True and a LIST of codertemplates in its namespace succeeds through
// kube-apiserver, that is until the aggregated API serves the namespace.
func waitServed(ctx context.Context, kube *testenv.KubeAPI) error {
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var last error
	for {
		last = servedOnce(ctx, c)
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the aggregated API does not serve namespace %s: %w", serviceNamespace, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func servedOnce(ctx context.Context, c client.Client) error {
	var ccp coderv1alpha1.CoderControlPlane
	if err := c.Get(ctx, client.ObjectKey{Namespace: serviceNamespace, Name: controlPlaneName}, &ccp); err != nil {
		return err
	}
	if !meta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
		return errors.New("CoderControlPlane " + controlPlaneName + ": OperatorAccessReady is not True")
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(schema.GroupVersionKind{Group: aggregatedGroup, Version: aggregatedVer, Kind: "CoderTemplateList"})
	return c.List(ctx, list, client.InNamespace(serviceNamespace))
}

// writeFileAtomic writes via a rename so a reader polling for the file never
// sees it half written.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

func httpOK(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(url + ": " + resp.Status)
	}
	return nil
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o600)
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}
