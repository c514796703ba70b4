// Package controllertest is the harness the reconcilers' tests share: one
// real kube-apiserver (with etcd and the CRDs, internal/testenv) per test
// binary, a namespace and a manager per test, waiting for what the
// reconcilers write, counting the events they record, and the plumbing of
// fake coderds. Only tests import it.
package controllertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/kubecache"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// kube is the kube-apiserver Main started; the tests of a package share
// it and keep apart by namespace.
var kube *testenv.KubeAPI

// MainOptions tunes Main.
type MainOptions struct {
	// AlwaysLog sends the controllers' logs to stderr also without -v.
	AlwaysLog bool
}

// Main is a TestMain: it starts the kube-apiserver, runs the tests, stops
// it and exits with the tests' code.
func Main(m *testing.M, opts MainOptions) {
	flag.Parse()
	if opts.AlwaysLog || testing.Verbose() {
		log.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr)))
	} else {
		log.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	}
	k, err := testenv.StartKubeAPI(context.Background(), testenv.KubeAPIOptions{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-apiserver: %v\n", err)
		os.Exit(1)
	}
	kube = k
	code := m.Run()
	k.Stop()
	os.Exit(code)
}

// Kube is the kube-apiserver Main started.
func Kube() *testenv.KubeAPI { return kube }

// Client reads and writes the API server directly, uncached, as a user
// would.
func Client(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// Namespace creates a namespace with a unique name starting with prefix.
func Namespace(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "-" + RandomHex(3)
	if err := kube.EnsureNamespace(context.Background(), name); err != nil {
		t.Fatalf("namespace %s: %v", name, err)
	}
	return name
}

// NewManager returns a manager authenticating with cfg whose cache sees
// only namespaces, with no metrics or health endpoints. Its cache and
// client select what the product's do (package kubecache).
func NewManager(t *testing.T, cfg *rest.Config, namespaces ...string) ctrl.Manager {
	t.Helper()
	opts := kubecache.Options()
	opts.DefaultNamespaces = map[string]cache.Config{}
	for _, ns := range namespaces {
		opts.DefaultNamespaces[ns] = cache.Config{}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme.New(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  opts,
		Client:                 kubecache.ClientOptions(),
		// Every test runs its own manager with the same controller names.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	return mgr
}

// StartManager runs mgr until the test ends, and fails the test if it
// stops with an error.
func StartManager(t *testing.T, mgr ctrl.Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// Eventually polls cond until it returns true or timeout passes; then it
// fails the test with cond's last explanation.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true after %s: %s", what, timeout, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Reconciles returns how often the named controller has reconciled in
// this process (controller-runtime's controller_runtime_reconcile_total).
func Reconciles(t *testing.T, controller string) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == controller {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// DescribeConditions renders a phase and conditions for a failure
// message.
func DescribeConditions(phase coderv1alpha1.Phase, conds []metav1.Condition) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase=%s", phase)
	for _, c := range conds {
		fmt.Fprintf(&b, " %s=%s/%s(%q)", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// RandomHex returns n random bytes in hex.
func RandomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Settle waits until probe (a counter such as Reconciles) has not changed
// for a second, so that a steady-state check measures steady state rather
// than the tail of earlier work. It fails the test after 30 seconds.
func Settle(t *testing.T, what string, probe func() float64) {
	t.Helper()
	const quiet, limit = time.Second, 30 * time.Second
	deadline := time.Now().Add(limit)
	last, since := probe(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not settle within %s", what, limit)
		}
		time.Sleep(100 * time.Millisecond)
		if v := probe(); v != last {
			last, since = v, time.Now()
		}
	}
}
