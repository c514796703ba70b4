// Package flux proves that Flux's server-side apply engine,
// github.com/fluxcd/pkg/ssa as kustomize-controller uses it, manages
// CoderTemplates and CoderWorkspaces served by coder-k8s's aggregated API:
// apply, a second apply that changes nothing, drift made in Coder detected
// and corrected, kstatus health, and pruning by inventory.
//
// fluxcd/pkg/ssa v0.76.1 builds with the project's own Kubernetes
// libraries (client-go v0.36, controller-runtime v0.24), so the suite is
// part of the main module and compiles with it; it runs the real stack
// through package stack (hack/dev), as the Argo CD suite does.
package flux

import (
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

func TestMain(m *testing.M) {
	os.Exit(stack.Tests(m, func(st *stack.Stack) error {
		env = st
		cfg, err := clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
		if err == nil {
			kube, err = client.New(cfg, client.Options{})
		}
		if err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		return nil
	}))
}

// within is how long a step may take; builds of the provider-free template
// take seconds.
const within = 3 * time.Minute
