// Package flux proves that Flux's server-side apply engine,
// github.com/fluxcd/pkg/ssa as kustomize-controller uses it, manages
// CoderTemplates and CoderWorkspaces served by coder-k8s's aggregated API:
// apply, a second apply that changes nothing, drift made in Coder detected
// and corrected, kstatus health, and pruning by inventory.
//
// It is a Go module of its own so it builds with the Kubernetes libraries
// fluxcd/pkg/ssa v0.76.2 pins; it runs the real stack through package
// stack (hack/dev).
package flux

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/coder/coder-k8s/test/gitops/stack"
)

var (
	env  *stack.Stack
	kube client.Client
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctx := context.Background()
	st, err := stack.Start(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "start the stack:", err)
		return 1
	}
	env = st
	cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
	if err == nil {
		kube, err = client.New(cfg, client.Options{})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes client:", err)
		fmt.Fprintln(os.Stderr, "logs kept in", st.StopKeepLogs())
		return 1
	}
	code := m.Run()
	if code != 0 {
		fmt.Fprintln(os.Stderr, "logs of hack/dev and coder-k8s kept in", st.StopKeepLogs())
		return code
	}
	st.Stop()
	return code
}

// within is how long a step may take; builds of the provider-free template
// take seconds.
const within = 3 * time.Minute
