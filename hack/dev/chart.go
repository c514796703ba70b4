package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/nodeenv"
)

// installChart installs coder-k8s the way users do: the image `make image`
// built and the chart packaged from charts/coder-k8s go to the node's OCI
// registry, then `helm install oci://...` runs with the values a user sets
// for a private registry, and waits until the pods are Ready and the
// aggregated API is served through them.
func installChart(ctx context.Context, stateDir string, kube *testenv.KubeAPI, node *nodeenv.Node) (*operator, error) {
	idx, err := nodeenv.ShippedImage()
	if err != nil {
		return nil, err
	}
	const imageTag = "dev"
	if _, err := node.Registry.PushIndex(ctx, "coder-k8s:"+imageTag, idx); err != nil {
		return nil, err
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		return nil, err
	}
	chartDir := filepath.Join(root, "charts", "coder-k8s")
	var meta struct {
		Version string `json:"version"`
	}
	if b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml")); err != nil {
		return nil, err
	} else if err := yaml.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("%s/Chart.yaml: %w", chartDir, err)
	}
	helm, err := newHelm(stateDir, kube)
	if err != nil {
		return nil, err
	}
	pkgDir := filepath.Join(stateDir, "chart")
	if err := os.MkdirAll(pkgDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := helm(ctx, "package", chartDir, "--destination", pkgDir); err != nil {
		return nil, err
	}
	registry := "oci://" + node.Registry.Host + "/charts"
	if _, err := helm(ctx, "push", filepath.Join(pkgDir, "coder-k8s-"+meta.Version+".tgz"), registry, "--plain-http"); err != nil {
		return nil, err
	}
	values := fmt.Sprintf(`image: {registry: %q, repository: coder-k8s, tag: %s}
config:
  logging: {level: info, format: console}
`, node.Registry.Host, imageTag)
	valuesPath := filepath.Join(stateDir, "values.yaml")
	if err := os.WriteFile(valuesPath, []byte(values), 0o600); err != nil {
		return nil, fmt.Errorf("write %s: %w", valuesPath, err)
	}
	chartRef := registry + "/coder-k8s"
	if _, err := helm(ctx, "install", releaseName, chartRef, "--version", meta.Version, "--plain-http",
		"-n", serviceNamespace, "--create-namespace", "-f", valuesPath, "--wait", "--timeout", "5m"); err != nil {
		return nil, err
	}
	if err := kube.WaitForDiscovery(ctx, aggregatedGroup+"/"+aggregatedVer, time.Minute); err != nil {
		return nil, err
	}
	clusterURL := func(service string) (string, error) {
		svc, err := kube.Clientset.CoreV1().Services(serviceNamespace).Get(ctx, service, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("the chart's Service %s: %w", service, err)
		}
		return "http://" + net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), nil
	}
	op := &operator{
		health:     "probed by the kubelet: kubectl get pods -n " + serviceNamespace,
		aggregated: "Service " + serviceNamespace + "/" + serviceName,
		apiService: "APIService v1alpha1.aggregation.coder.com",
		identity:   "system:serviceaccount:" + serviceNamespace + ":" + releaseName,
		log:        "kubectl logs -n " + serviceNamespace + " deploy/" + releaseName,
		chartHint: fmt.Sprintf("bin/helm upgrade %s %s --version %s --plain-http -n %s --reuse-values --set replicas=2   # the release",
			releaseName, chartRef, meta.Version, serviceNamespace),
	}
	// Service addresses: this machine routes them to the node, where
	// kube-proxy forwards them to the pods, as for a client in the cluster.
	if op.mcp, err = clusterURL(releaseName + "-mcp"); err != nil {
		return nil, err
	}
	if op.metrics, err = clusterURL(releaseName + "-metrics"); err != nil {
		return nil, err
	}
	return op, nil
}

// newHelm returns a runner of bin/helm against kube, with Helm's
// configuration, cache and data under stateDir (the user's are left
// alone).
func newHelm(stateDir string, kube *testenv.KubeAPI) (func(ctx context.Context, args ...string) (string, error), error) {
	bin, err := testenv.Binary("helm")
	if err != nil {
		return nil, err
	}
	home := filepath.Join(stateDir, "helm")
	env := append(os.Environ(), "KUBECONFIG="+kube.KubeconfigPath,
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	return func(ctx context.Context, args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil {
			return string(out), fmt.Errorf("helm %s: %w\n%s", args[0], err, out)
		}
		return string(out), nil
	}, nil
}
