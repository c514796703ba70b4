package workspaceproxy_test

import (
	"testing"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/workspaceproxy"
)

// The tests share one real kube-apiserver (with etcd and the CRDs); each
// works in its own namespace with its own manager.
func TestMain(m *testing.M) { controllertest.Main(m, controllertest.MainOptions{}) }

// harness runs the reconciler in a manager against one namespace.
type harness = controllertest.Dependent[coderv1alpha1.CoderWorkspaceProxy, *coderv1alpha1.CoderWorkspaceProxy]

// newHarness runs the reconciler with cleanupTimeout (0: the default).
func newHarness(t *testing.T, cleanupTimeout time.Duration) *harness {
	t.Helper()
	return controllertest.NewDependent[coderv1alpha1.CoderWorkspaceProxy](t, "CoderWorkspaceProxy", "wsp", cleanupTimeout, func(mgr ctrl.Manager, base dependent.Base) error {
		return (&workspaceproxy.Reconciler{Base: base}).SetupWithManager(mgr)
	})
}
