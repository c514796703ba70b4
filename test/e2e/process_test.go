package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/coder/coder-k8s/internal/testenv"
)

// In all mode one process serves every component; SIGTERM stops it cleanly
// and releases the leader lease so a successor need not wait for expiry.
func TestAllMode(t *testing.T) {
	t.Parallel()
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})
	op := StartOperator(t, OperatorOptions{Mode: "all", Kubeconfig: k.KubeconfigPath})
	ctx := context.Background()

	op.WaitOK(t, op.Health+"/healthz")
	op.WaitOK(t, op.Health+"/readyz")
	op.WaitOK(t, op.Aggregated+"/readyz")
	op.WaitOK(t, op.MCP+"/healthz")
	op.WaitOK(t, op.MCP+"/readyz")

	t.Run("metrics are served", func(t *testing.T) {
		code, body, err := get(ctx, op.Metrics+"/metrics")
		if err != nil || code != http.StatusOK || !strings.Contains(body, "# HELP") {
			t.Fatalf("GET /metrics: %d %v %.200s", code, err, body)
		}
	})

	t.Run("this replica holds the leader lease", func(t *testing.T) {
		testenv.WaitFor(t, 30*time.Second, func() error {
			l, err := k.Clientset.CoordinationV1().Leases("default").Get(ctx, op.LeaseName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
				return errNotYet("lease has no holder")
			}
			return nil
		})
	})

	t.Run("aggregated API refuses anonymous callers and authenticates through kube-apiserver", func(t *testing.T) {
		code, body, err := get(ctx, op.Aggregated+"/apis")
		if err != nil || code != http.StatusUnauthorized {
			t.Fatalf("anonymous GET /apis: %d %v %s", code, err, body)
		}
		// The admin's client certificate is verified against the client CA
		// the server reads from kube-apiserver (delegated authentication),
		// and the request authorized with a SubjectAccessReview.
		tlsCfg, err := rest.TLSConfigFor(k.Config)
		if err != nil {
			t.Fatal(err)
		}
		tlsCfg.InsecureSkipVerify = true //nolint:gosec // self-signed fallback certificate
		tlsCfg.RootCAs = nil
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg}}
		testenv.WaitFor(t, 20*time.Second, func() error {
			resp, err := c.Get(op.Aggregated + "/apis")
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return errNotYet("GET /apis as admin: " + resp.Status)
			}
			return nil
		})
	})

	t.Run("SIGTERM stops every component and releases the lease", func(t *testing.T) {
		if code := op.Terminate(t, 30*time.Second); code != 0 {
			t.Fatalf("exit code %d after SIGTERM; log tail:\n%s", code, op.LogTail(20))
		}
		for _, url := range []string{op.Health, op.Aggregated, op.MCP, op.Metrics} {
			if !refusesConnections(url) {
				t.Errorf("%s still accepts connections after exit", url)
			}
		}
		l, err := k.Clientset.CoordinationV1().Leases("default").Get(ctx, op.LeaseName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
			t.Errorf("lease still held by %q after a graceful stop", *l.Spec.HolderIdentity)
		}
	})
}

// Standalone modes run only their own component.
func TestStandaloneModes(t *testing.T) {
	t.Parallel()
	k := testenv.NewKubeAPI(t, testenv.KubeAPIOptions{})

	t.Run("controller", func(t *testing.T) {
		op := StartOperator(t, OperatorOptions{Mode: "controller", Kubeconfig: k.KubeconfigPath})
		op.WaitOK(t, op.Health+"/readyz")
		assertChartIdentity(t, op)
		if !refusesConnections(op.Aggregated) || !refusesConnections(op.MCP) {
			t.Error("controller mode serves the aggregated API or MCP")
		}
	})
	t.Run("aggregated-apiserver", func(t *testing.T) {
		op := StartOperator(t, OperatorOptions{
			Mode: "aggregated-apiserver", Kubeconfig: k.KubeconfigPath,
			// The original design notes' flags for the static backend.
			Args: []string{"--coder-url=http://127.0.0.1:1", "--coder-session-token=unused", "--coder-namespace=coder"},
		})
		op.WaitOK(t, op.Aggregated+"/readyz")
		assertChartIdentity(t, op)
		if !refusesConnections(op.Health) || !refusesConnections(op.MCP) {
			t.Error("aggregated-apiserver mode serves controller health or MCP")
		}
	})
	t.Run("mcp-http", func(t *testing.T) {
		op := StartOperator(t, OperatorOptions{Mode: "mcp-http", Kubeconfig: k.KubeconfigPath})
		op.WaitOK(t, op.MCP+"/readyz")
		assertChartIdentity(t, op)
		if !refusesConnections(op.Health) || !refusesConnections(op.Aggregated) {
			t.Error("mcp-http mode serves controller health or the aggregated API")
		}
	})
}

// An invalid configuration stops the binary before it starts anything.
func TestInvalidConfigurationStartsNothing(t *testing.T) {
	t.Parallel()
	op := StartOperator(t, OperatorOptions{Mode: "all", RunKubeconfig: "/nonexistent", ExtraConfig: "unknownKey: 1\n"})
	testenv.WaitFor(t, 10*time.Second, func() error {
		if exited, _ := op.Exited(); !exited {
			return errNotYet("still running")
		}
		return nil
	})
	_, err := op.Exited()
	if err == nil {
		t.Fatal("exit code 0 for an invalid configuration")
	}
	if log := op.LogTail(10); !strings.Contains(log, "unknownKey: unknown field") {
		t.Errorf("error does not name the key:\n%s", log)
	}
	if !refusesConnections(op.Health) || !refusesConnections(op.MCP) {
		t.Error("something listens although the configuration is invalid")
	}
}

type errNotYet string

func (e errNotYet) Error() string { return string(e) }
