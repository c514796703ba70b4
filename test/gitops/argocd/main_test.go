// Package argocd proves that Argo CD's own GitOps engine (the gitops-engine
// Argo CD v3.3.0 pins: its cluster cache, diff, sync and health packages)
// manages CoderTemplates and CoderWorkspaces served by coder-k8s's
// aggregated API, with Argo CD's annotation tracking
// (argocd.argoproj.io/tracking-id): sync, Synced and Healthy, no diff on the
// next refresh, drift made in Coder shown as OutOfSync and healed by the next
// sync, and pruning.
//
// It is a Go module of its own: gitops-engine builds only with Argo CD
// v3.3.0's replace lines (k8s.io/* v0.34, k8s.io/kubernetes v1.34), which
// the project's module (v0.36) cannot carry. It runs the real stack through
// package stack (hack/dev).
package argocd

import (
	"fmt"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/coder/coder-k8s/test/gitops/stack"
)

var (
	env     *stack.Stack
	restCfg *rest.Config
	dyn     dynamic.Interface
)

func TestMain(m *testing.M) {
	os.Exit(stack.Tests(m, func(st *stack.Stack) error {
		env = st
		var err error
		restCfg, err = clientcmd.BuildConfigFromFlags("", st.Kubeconfig)
		if err == nil {
			dyn, err = dynamic.NewForConfig(restCfg)
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
