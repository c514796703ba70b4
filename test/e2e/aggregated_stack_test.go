package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	aggv1 "github.com/coder/coder-k8s/api/aggregation/v1alpha1"
	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The Service the test APIService points at; the serving certificate names
// it, as it must in a cluster.
const (
	aggServiceName      = "coder-k8s"
	aggServiceNamespace = "coder-system"
	// pollInterval is the operator's watch poll interval in these tests.
	pollInterval = time.Second
)

var (
	workspacesGVR = aggv1.SchemeGroupVersion.WithResource("coderworkspaces")
	templatesGVR  = aggv1.SchemeGroupVersion.WithResource("codertemplates")
)

// aggStack is kube-apiserver, coderd and the operator in all mode serving
// aggregation.coder.com through the aggregation layer, with a
// CoderControlPlane in namespace "coder" adopting the coderd.
type aggStack struct {
	k       *testenv.KubeAPI
	coder   *testenv.Coder
	op      *Operator
	c       client.Client
	dyn     dynamic.Interface
	kubectl string
	org     string
	ns      string
}

func newAggStack(t *testing.T) *aggStack {
	t.Helper()
	kubectl, err := testenv.Binary("kubectl")
	if err != nil {
		t.Fatal(err)
	}
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	coder := testenv.NewCoder(t, testenv.CoderOptions{})

	ca, err := testenv.NewCA("coder-k8s-e2e-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.ServingCert([]string{testenv.ServiceDNSName(aggServiceName, aggServiceNamespace), "localhost"}, []net.IP{net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	if err := serving.WriteTo(certDir); err != nil {
		t.Fatal(err)
	}
	op := StartOperator(t, OperatorOptions{
		Mode: "all", Kubeconfig: k.KubeconfigPath,
		Aggregated: fmt.Sprintf("certDir: %s, watchPollInterval: %s", certDir, pollInterval),
	})
	op.WaitOK(t, op.Health+"/readyz")

	s := &aggStack{k: k, coder: coder, op: op, kubectl: kubectl, org: "coder", ns: "coder"}
	sch := scheme.New()
	if err := aggv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	if s.c, err = client.New(k.Config, client.Options{Scheme: sch}); err != nil {
		t.Fatal(err)
	}
	if s.dyn, err = dynamic.NewForConfig(k.Config); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s.adopt(t, s.ns, "coder")

	port := 0
	if _, err := fmt.Sscanf(op.Aggregated, "https://127.0.0.1:%d", &port); err != nil {
		t.Fatal(err)
	}
	if err := k.RegisterAPIService(ctx, testenv.APIService{
		Group: aggv1.GroupName, Version: "v1alpha1", Port: port, CABundle: ca.CertPEM,
		ServiceName: aggServiceName, ServiceNamespace: aggServiceNamespace,
	}); err != nil {
		t.Fatalf("register APIService: %v\noperator log:\n%s", err, op.LogTail(40))
	}
	return s
}

// adopt creates namespace ns (if needed), the owner token Secret and a
// CoderControlPlane named name adopting the stack's coderd, and waits for
// its operator access.
func (s *aggStack) adopt(t *testing.T, ns, name string) {
	t.Helper()
	ctx := context.Background()
	if err := s.k.EnsureNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns},
		Data:       map[string][]byte{"token": []byte(s.coder.SessionToken)},
	}
	if err := s.c.Create(ctx, secret); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	ccp := &coderv1alpha1.CoderControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: coderv1alpha1.CoderControlPlaneSpec{
			ExternalURL: s.coder.URL.String(),
			OperatorAccess: coderv1alpha1.OperatorAccessSpec{
				OwnerTokenSecretRef: &coderv1alpha1.SecretKeyReference{Name: "owner", Key: "token"},
			},
		},
	}
	if err := s.c.Create(ctx, ccp); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, func() error {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ccp); err != nil {
			return err
		}
		if !apimeta.IsStatusConditionTrue(ccp.Status.Conditions, coderv1alpha1.ConditionOperatorAccessReady) {
			return errNotYet("OperatorAccessReady is not True: " + conditionSummary(ccp.Status.Conditions))
		}
		return nil
	})
}

// run runs kubectl as the cluster admin.
func (s *aggStack) run(args ...string) (string, error) {
	return s.runIn("", args...)
}

// runIn runs kubectl with stdin.
func (s *aggStack) runIn(stdin string, args ...string) (string, error) {
	return runKubectl(s.kubectl, s.k.KubeconfigPath, 3*time.Minute, stdin, args...)
}

// runKubectl runs the kubectl binary with kubeconfig (stdin unless
// empty), bounded by timeout, and returns its combined output.
func runKubectl(kubectl, kubeconfig string, timeout time.Duration, stdin string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, kubectl, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// must runs kubectl and fails the test on error.
func (s *aggStack) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := s.run(args...)
	if err != nil {
		t.Fatalf("%v\noperator log:\n%s", err, s.op.LogTail(30))
	}
	return out
}

// coderCLI runs the real coder CLI against the stack's coderd as its first
// user: a change made in Coder, not through Kubernetes.
func (s *aggStack) coderCLI(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := testenv.Binary("coder")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "CODER_URL="+s.coder.URL.String(), "CODER_SESSION_TOKEN="+s.coder.SessionToken,
		"CODER_CONFIG_DIR="+t.TempDir(), "CODER_NO_VERSION_WARNING=1", "CODER_TELEMETRY_ENABLE=false")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("coder %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// workspaceName is the Kubernetes name of a workspace of the first user.
func (s *aggStack) workspaceName(name string) string {
	return s.org + "." + s.coder.Username + "." + name
}

// lineWatcher follows a long-running command's output line by line.
type lineWatcher struct {
	mu    sync.Mutex
	lines []string
	cmd   *exec.Cmd
}

func (s *aggStack) startKubectl(t *testing.T, args ...string) *lineWatcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, s.kubectl, append([]string{"--kubeconfig", s.k.KubeconfigPath}, args...)...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &lineWatcher{cmd: cmd}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		pw.Close()
		<-done
	})
	return w
}

// waitLine waits for a line containing every one of parts.
func (w *lineWatcher) waitLine(t *testing.T, timeout time.Duration, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		for _, l := range w.lines {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(l, p)
			}
			if ok {
				w.mu.Unlock()
				return l
			}
		}
		w.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t.Fatalf("no line with %q within %s; got:\n%s", parts, timeout, strings.Join(w.lines, "\n"))
	return ""
}

// writeManifest writes a manifest to a temporary file for kubectl -f.
func writeManifest(t *testing.T, manifest string) string {
	t.Helper()
	// Not t.TempDir(): kubectl -f splits paths at commas, which subtest
	// names contain.
	dir, err := os.MkdirTemp("", "manifest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := filepath.Join(dir, "manifest.yaml")
	if err := os.WriteFile(p, []byte(manifest), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// indent indents every line of s by n spaces (for YAML block scalars).
func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	var b bytes.Buffer
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		b.WriteString(pad + l + "\n")
	}
	return b.String()
}
