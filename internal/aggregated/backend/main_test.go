package backend

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/scheme"
	"github.com/coder/coder-k8s/internal/testenv"
)

// The package's tests share one kube-apiserver (kept apart by namespace)
// and one coderd.
var (
	kube   *testenv.KubeAPI
	coderd *testenv.Coder
)

func TestMain(m *testing.M) {
	flag.Parse()
	ctx := context.Background()
	var wg sync.WaitGroup
	var kubeErr, coderErr error
	wg.Add(2)
	go func() { defer wg.Done(); kube, kubeErr = testenv.StartKubeAPI(ctx, testenv.KubeAPIOptions{}) }()
	go func() { defer wg.Done(); coderd, coderErr = testenv.StartCoder(ctx, testenv.CoderOptions{}) }()
	wg.Wait()
	stop := func() {
		if kube != nil {
			kube.Stop()
		}
		if coderd != nil {
			coderd.Stop()
		}
	}
	if kubeErr != nil || coderErr != nil {
		// A missing binary is a failure (the message names `make tools`),
		// never a skip.
		fmt.Fprintf(os.Stderr, "test stack: kube-apiserver: %v; coderd: %v\n", kubeErr, coderErr)
		stop()
		os.Exit(1)
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// kubeClient reads and writes the API server directly, as a user would.
func kubeClient(t *testing.T) client.Client {
	t.Helper()
	c, err := client.New(kube.Config, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// namespace creates a namespace named prefix-<random>.
func namespace(t *testing.T, prefix string) string {
	t.Helper()
	name := prefix + "-" + controllertest.RandomHex(3)
	if err := kube.EnsureNamespace(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	return name
}

// deleteNamespace deletes ns and checks that it stays Terminating, as it
// does without a namespace controller (spec.finalizers holds
// "kubernetes").
func deleteNamespace(t *testing.T, c client.Client, ns string) {
	t.Helper()
	ctx := t.Context()
	if err := c.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	var got corev1.Namespace
	if err := c.Get(ctx, client.ObjectKey{Name: ns}, &got); err != nil {
		t.Fatalf("namespace %s is gone at once; the test needs it Terminating: %v", ns, err)
	}
	if got.DeletionTimestamp == nil || got.Status.Phase != corev1.NamespaceTerminating {
		t.Fatalf("deleted namespace %s: deletionTimestamp=%v phase=%s, want Terminating", ns, got.DeletionTimestamp, got.Status.Phase)
	}
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	controllertest.Eventually(t, 20*time.Second, what, cond)
}
