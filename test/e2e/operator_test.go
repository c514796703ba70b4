// Package e2e runs the coder-k8s binary against the real test stack, the
// way a user runs it, and asserts what they would observe. The binary
// authenticates as the chart's ServiceAccount with exactly the RBAC the
// chart renders for its mode (StartOperator); only the tests' own setup
// uses the admin kubeconfig.
package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	"github.com/coder/coder-k8s/internal/config"
	"github.com/coder/coder-k8s/internal/testenv"
	"github.com/coder/coder-k8s/internal/testenv/chartrbac"
)

// binary is the coder-k8s binary the tests and benchmarks run: bin/coder-k8s
// (or in $CODER_K8S_BIN_DIR) as `make build` ships it, so that what they
// measure is what users run.
var binary string

// Each suite builds a stack of its own, and most wait on coderd and
// OpenTofu far more than they compute, so they run in parallel (go test's
// -parallel, GOMAXPROCS by default: two at a time here). The suites that
// bound latencies or resource use under faults (TestFaultCoderd,
// TestProcessFaults, TestHungCoderdDoesNotBlockOthers, TestMetrics) do
// not: they run first, one at a time.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		var err error
		if binary, err = testenv.ShippedBinary(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e:", err)
			return 1
		}
		return m.Run()
	}())
}

// Operator is a running coder-k8s process with the addresses it serves.
type Operator struct {
	*testenv.Process
	Health, Metrics, MCP string // http://127.0.0.1:PORT
	Aggregated           string // https://127.0.0.1:PORT
	LeaseName            string
	// Identity is the ServiceAccount the binary authenticates as, bound to
	// the RBAC the chart renders for its mode (nil with RunKubeconfig).
	Identity *chartrbac.Identity
}

// OperatorOptions describes one coder-k8s process.
type OperatorOptions struct {
	Mode string
	// Kubeconfig is the test kube-apiserver's admin kubeconfig. StartOperator
	// uses it only to apply the RBAC the chart renders for Mode (see
	// grantOperatorRBAC); the binary runs with a ServiceAccount token bound
	// to that RBAC alone, as in a cluster.
	Kubeconfig string
	// Release is the Helm release whose ServiceAccount and RBAC the
	// operator runs with. Empty: a release of its own, coder-k8s-<port>,
	// or with autoTLS the release its Secret name belongs to
	// (<release>-aggregated-tls). Replicas of one release share its
	// ServiceAccount.
	Release string
	// EditRBAC, when set, changes the chart's RBAC objects before they are
	// applied: for a test that takes a permission away.
	EditRBAC func([]*unstructured.Unstructured) []*unstructured.Unstructured
	// ExpectForbidden lets the operator's log report requests its RBAC
	// refused; otherwise any such request fails the test (see
	// forbiddenRequests).
	ExpectForbidden bool
	// RunKubeconfig, when set, is the kubeconfig the binary runs with and
	// StartOperator grants nothing: only for a binary that must stop
	// before it reaches kube-apiserver.
	RunKubeconfig string
	// ExtraConfig is appended to the generated configuration file.
	ExtraConfig string
	// KubeQPS, when set, overrides the Kubernetes client's rate limit
	// (burst twice as much).
	KubeQPS int
	// Aggregated adds entries to the aggregatedAPIServer mapping, for
	// example `certDir: /x, watchPollInterval: 1s`.
	Aggregated string
	// MCP adds entries to the mcp mapping, for example `readOnly: true`.
	MCP string
	// LeaseName, when set, is the leader Lease (replicas share one);
	// otherwise each process gets its own.
	LeaseName string
	// LeaderElection adds entries to the leaderElection mapping, for
	// example `leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s`.
	LeaderElection string
	// Controller adds entries to the controller mapping, one "key: value"
	// each, for example "coderRequestTimeout: 3s".
	Controller []string
	Args       []string
}

// StartOperator writes a configuration file with free ports and runs the
// binary with it until the test ends.
func StartOperator(t testing.TB, opts OperatorOptions) *Operator {
	t.Helper()
	ports := make([]int, 4)
	for i := range ports {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	lease := "coder-k8s-" + strconv.Itoa(ports[0])
	if opts.LeaseName != "" {
		lease = opts.LeaseName
	}
	leaderElection := ""
	if opts.LeaderElection != "" {
		leaderElection = ", " + opts.LeaderElection
	}
	qps := ""
	if opts.KubeQPS > 0 {
		qps = fmt.Sprintf(", qps: %d, burst: %d", opts.KubeQPS, 2*opts.KubeQPS)
	}
	aggregated := ""
	if opts.Aggregated != "" {
		aggregated = ", " + opts.Aggregated
	}
	mcpExtra := ""
	if opts.MCP != "" {
		mcpExtra = ", " + opts.MCP
	}
	controllerExtra := ""
	for _, e := range opts.Controller {
		controllerExtra += "\n  " + e
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if opts.RunKubeconfig != "" {
		kubeconfig = opts.RunKubeconfig
	}
	render := func(controllerExtra string) string {
		return fmt.Sprintf(`apiVersion: config.coder.com/v1alpha1
kind: CoderK8sConfiguration
app: %s
logging: {level: debug, format: console}
kubernetes: {kubeconfig: %s%s}
controller:
  healthProbeBindAddress: 127.0.0.1:%d
  metricsBindAddress: 127.0.0.1:%d
  leaderElection: {namespace: default, leaseName: %s%s}%s
aggregatedAPIServer: {bindAddress: 127.0.0.1, securePort: %d%s}
mcp: {bindAddress: "127.0.0.1:%d"%s}
%s`, opts.Mode, kubeconfig, qps, ports[0], ports[1], lease, leaderElection, controllerExtra, ports[2], aggregated, ports[3], mcpExtra, opts.ExtraConfig)
	}
	cfg := render(controllerExtra)
	var identity *chartrbac.Identity
	if opts.RunKubeconfig == "" {
		var release string
		identity, release = grantOperatorRBAC(t, opts, []byte(cfg), kubeconfig, "coder-k8s-"+strconv.Itoa(ports[0]))
		if opts.Mode == "all" || opts.Mode == "controller" {
			// The ClusterRoles the chart lets this release bind, as the
			// chart writes them into the config file it renders.
			fullname := release // the chart's fullname: the release, when it contains the chart's name
			if !strings.Contains(release, "coder-k8s") {
				fullname = release + "-coder-k8s"
			}
			cfg = render(controllerExtra + fmt.Sprintf("\n  workspaceRBAC: {clusterRole: %s-workspace, deploymentsClusterRole: %s-workspace-deployments}", fullname, fullname))
		}
	}
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, append([]string{"--config", file}, opts.Args...)...)
	proc, err := testenv.StartProcess("coder-k8s "+opts.Mode, cmd, filepath.Join(dir, "coder-k8s.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Stop(30 * time.Second)
		if identity != nil && !opts.ExpectForbidden {
			if refused := forbiddenRequests(t, proc.LogPath, identity.Username, opts.Kubeconfig); len(refused) > 0 {
				t.Errorf("kube-apiserver refused %d requests of coder-k8s %s under the chart's RBAC; the first:\n%s",
					len(refused), opts.Mode, strings.Join(refused[:min(5, len(refused))], "\n"))
			}
		}
		if t.Failed() {
			t.Logf("coder-k8s log tail:\n%s", proc.LogTail(40))
		}
	})
	return &Operator{
		Process:    proc,
		Health:     fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		Metrics:    fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		Aggregated: fmt.Sprintf("https://127.0.0.1:%d", ports[2]),
		MCP:        fmt.Sprintf("http://127.0.0.1:%d", ports[3]),
		LeaseName:  lease,
		Identity:   identity,
	}
}

// forbiddenRequests returns the log lines in which kube-apiserver refused
// user a request (RBAC's "is forbidden: User ... cannot ...") that it
// still refuses when asked again now (SubjectAccessReview, as admin): a
// permission the chart does not grant and the binary needs. A refusal that
// kube-apiserver no longer repeats is left out: right after a restart its
// RBAC authorizer refuses everything until its caches have synced.
func forbiddenRequests(t testing.TB, logPath, user, adminKubeconfig string) []string {
	t.Helper()
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Errorf("read the operator's log: %v", err)
		return nil
	}
	admin, err := clientcmd.BuildConfigFromFlags("", adminKubeconfig)
	if err != nil {
		t.Errorf("admin kubeconfig: %v", err)
		return nil
	}
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		t.Errorf("admin client: %v", err)
		return nil
	}
	needle := fmt.Sprintf(`forbidden: User "%s" cannot`, user)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		// The log is JSON-escaped.
		line = strings.ReplaceAll(line, `\"`, `"`)
		if !strings.Contains(line, needle) {
			continue
		}
		if stillRefused(cs, line) {
			out = append(out, line)
		}
	}
	return out
}

// rbacRefusal matches kube-apiserver's RBAC refusal: `<resource>.<group>
// ["<name>"] is forbidden: User "<user>" cannot <verb> resource
// "<resource>[/<subresource>]" in API group "<group>" (in the namespace
// "<ns>"|at the cluster scope)`.
var rbacRefusal = regexp.MustCompile(`(?:\S+ "([^"]+)" )?is forbidden: User "([^"]+)" cannot (\S+) resource "([^"]+)" in API group "([^"]*)" (?:in the namespace "([^"]+)"|at the cluster scope)`)

// stillRefused reports whether kube-apiserver refuses now what line says
// it refused; a line it cannot read counts as refused.
func stillRefused(cs kubernetes.Interface, line string) bool {
	m := rbacRefusal.FindStringSubmatch(line)
	if m == nil {
		return true
	}
	resource, sub, _ := strings.Cut(m[4], "/")
	sar, err := cs.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   m[2],
			Groups: serviceAccountGroups(m[2]),
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Name: m[1], Verb: m[3], Resource: resource, Subresource: sub, Group: m[5], Namespace: m[6],
			},
		},
	}, metav1.CreateOptions{})
	return err != nil || !sar.Status.Allowed
}

// serviceAccountGroups are the groups kube-apiserver gives a
// ServiceAccount's token.
func serviceAccountGroups(user string) []string {
	parts := strings.Split(user, ":")
	if len(parts) != 4 {
		return []string{"system:authenticated"}
	}
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + parts[2], "system:authenticated"}
}

// grantOperatorRBAC applies, with the admin kubeconfig opts.Kubeconfig,
// the ServiceAccount and RBAC the chart renders for the operator's mode and
// for what its configuration cfg shares with the chart's RBAC (the leader
// Lease, autoTLS's Secret and APIService), and writes a kubeconfig holding
// only that ServiceAccount's token to kubeconfig. release is the release
// name when neither opts nor autoTLS name one; it returns the release used.
func grantOperatorRBAC(t testing.TB, opts OperatorOptions, cfg []byte, kubeconfig, release string) (*chartrbac.Identity, string) {
	t.Helper()
	admin, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		t.Fatalf("admin kubeconfig %s: %v", opts.Kubeconfig, err)
	}
	c := config.Default()
	if err := yaml.Unmarshal(cfg, &c); err != nil {
		t.Fatalf("read the operator's configuration: %v", err)
	}
	le := c.Controller.LeaderElection
	namespace := aggServiceNamespace
	values := map[string]any{
		"mode": opts.Mode,
		"config": map[string]any{"controller": map[string]any{"leaderElection": map[string]any{
			"enabled": le.Enabled, "leaseName": le.LeaseName, "namespace": le.Namespace,
		}}},
	}
	if at := c.AggregatedAPIServer.AutoTLS; at.Enabled {
		// The chart's autoTLS RBAC names <fullname>-aggregated-tls in the
		// release namespace and the chart's APIService.
		chartRelease, ok := strings.CutSuffix(at.SecretName, "-aggregated-tls")
		if !ok || at.Namespace == "" {
			t.Fatalf("autoTLS Secret %q in namespace %q is not one the chart names (<release>-aggregated-tls in the release namespace)", at.SecretName, at.Namespace)
		}
		if at.APIServiceName != "v1alpha1."+aggv1.GroupName {
			t.Fatalf("autoTLS APIService %q is not the chart's v1alpha1.%s", at.APIServiceName, aggv1.GroupName)
		}
		release, namespace = chartRelease, at.Namespace
		values["tls"] = map[string]any{"mode": "auto"}
	} else {
		// A serving certificate from a Secret, which needs no RBAC: the
		// tests' certDir stands for its mount.
		// (The chart's APIService then needs a CA bundle; it is not
		// applied here.)
		ca, err := testenv.NewCA("unused")
		if err != nil {
			t.Fatal(err)
		}
		values["tls"] = map[string]any{"mode": "secret", "secret": map[string]any{"name": release + "-tls"}, "caBundle": string(ca.CertPEM)}
	}
	if opts.Mode == "aggregated-apiserver" {
		// The chart refuses this mode without a static backend; its RBAC
		// does not depend on it (the token is a mounted file).
		url := c.AggregatedAPIServer.Coder.StaticBackend.URL
		if url == "" {
			url = "http://127.0.0.1:1"
		}
		sb := map[string]any{"url": url, "existingSecret": release + "-coder-token",
			"identity": map[string]any{"mode": c.AggregatedAPIServer.Coder.StaticBackend.Identity.Mode}}
		// The backend's namespace holds its records (a Role there).
		ns := c.AggregatedAPIServer.Coder.StaticBackend.Namespace
		for _, a := range opts.Args {
			if v, ok := strings.CutPrefix(a, "--coder-namespace="); ok {
				ns = v
			}
		}
		if ns != "" {
			sb["namespace"] = ns
		}
		values["staticBackend"] = sb
	}
	if opts.Release != "" {
		release = opts.Release
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	id, err := chartrbac.Grant(ctx, admin, chartrbac.Options{
		Release: release, Namespace: namespace, Values: values, KubeconfigPath: kubeconfig, Edit: opts.EditRBAC,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("coder-k8s %s runs as %s: the chart's RBAC for release %s applied in %s", opts.Mode, id.Username, release, time.Since(start).Round(time.Millisecond))
	return id, release
}

// WaitOK waits until GET url answers 200.
func (o *Operator) WaitOK(t testing.TB, url string) {
	t.Helper()
	err := o.WaitReady(context.Background(), 60*time.Second, func(ctx context.Context) error {
		code, body, err := get(ctx, url)
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("GET %s: %d %s", url, code, body)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Terminate sends SIGTERM and returns the exit code, failing the test if
// the process does not stop within timeout.
func (o *Operator) Terminate(t *testing.T, timeout time.Duration) int {
	t.Helper()
	start := time.Now()
	if err := o.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("send SIGTERM: %v", err)
	}
	for time.Since(start) < timeout {
		if exited, err := o.Exited(); exited {
			if err == nil {
				return 0
			}
			if ee, ok := err.(*exec.ExitError); ok {
				return ee.ExitCode()
			}
			t.Fatalf("wait: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("coder-k8s still running %s after SIGTERM; log tail:\n%s", timeout, o.LogTail(30))
	return -1
}

var insecureClient = &http.Client{
	Timeout: 5 * time.Second,
	Transport: &http.Transport{
		// The self-signed fallback certificate; TLS verification with a CA
		// bundle is covered by the APIService tests.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
	},
}

func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := insecureClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	n, _ := resp.Body.Read(buf)
	return resp.StatusCode, string(buf[:n]), nil
}

// refusesConnections reports whether nothing listens at url's host:port.
func refusesConnections(url string) bool {
	host := url[len("http://"):]
	if len(url) > 8 && url[:8] == "https://" {
		host = url[len("https://"):]
	}
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}
