package workspaceproxy_test

import (
	"testing"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/controllertest"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/workspaceproxy"
)

// The tests share one real kube-apiserver (with etcd and the CRDs); each
// works in its own namespace with its own manager.
func TestMain(m *testing.M) { controllertest.Main(m, controllertest.MainOptions{}) }

// harness runs the reconciler in a manager against one namespace.
type harness struct {
	*controllertest.Harness
}

type harnessOptions struct {
	cleanupTimeout time.Duration
}

func newHarness(t *testing.T, opts harnessOptions) *harness {
	t.Helper()
	return &harness{controllertest.NewHarness(t, "CoderWorkspaceProxy", "wsp", func(mgr ctrl.Manager, c client.Client, rec events.EventRecorder) error {
		r := &workspaceproxy.Reconciler{Base: dependent.Base{
			Client:         c,
			APIReader:      mgr.GetAPIReader(),
			Scheme:         mgr.GetScheme(),
			Recorder:       rec,
			CoderTimeout:   5 * time.Second,
			DefaultImage:   workspaceproxy.DefaultImage,
			CleanupTimeout: opts.cleanupTimeout,
		}}
		return r.SetupWithManager(mgr)
	})}
}

func (h *harness) get(name string) *coderv1alpha1.CoderWorkspaceProxy {
	h.T.Helper()
	var p coderv1alpha1.CoderWorkspaceProxy
	h.Object(name, &p)
	return &p
}

var eventually = controllertest.Eventually

// reconciles returns how often the controller has reconciled in this
// process.
func reconciles(t *testing.T) float64 {
	t.Helper()
	return controllertest.Reconciles(t, "coderworkspaceproxy")
}

func condition(p *coderv1alpha1.CoderWorkspaceProxy, t string) *metav1.Condition {
	return apimeta.FindStatusCondition(p.Status.Conditions, t)
}

func describeConditions(p *coderv1alpha1.CoderWorkspaceProxy) string {
	return controllertest.DescribeConditions(p.Status.Phase, p.Status.Conditions)
}
