package workspaceproxy

import (
	"context"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

// ControlPlaneRef is the CoderControlPlane obj references.
func (r *Reconciler) ControlPlaneRef(obj *coderv1alpha1.CoderWorkspaceProxy) string {
	return obj.Spec.ControlPlaneRef.Name
}

// Cleanup deregisters the proxy the object registered on deletion,
// best effort and bounded (dependent.Base.Finalize): the finalizer goes
// after CleanupTimeout, or at once when the CoderControlPlane no longer
// exists, with a Warning event naming the proxy to delete by hand. A
// proxy whose token was supplied (spec.proxyTokenSecretRef) was not
// registered by the operator and is left alone.
func (r *Reconciler) Cleanup(obj *coderv1alpha1.CoderWorkspaceProxy) dependent.Cleanup {
	return dependent.Cleanup{
		Finalizer: Finalizer,
		Find: func(ctx context.Context) (string, dependent.UndoFunc, error) {
			return r.registeredProxy(ctx, obj)
		},
		Name:         "deregister the workspace proxy",
		Action:       "DeregisterProxy",
		DoneReason:   EventProxyDeregistered,
		FailedReason: EventProxyDeregistrationFailed,
		Done:         "deregistered %s",
		GaveUp:       "gave up deregistering %[1]s after %[2]s: %[3]s; delete it in Coder by hand",
		Abandoned:    "cannot deregister %[1]s: %[2]s; delete it in Coder by hand",
	}
}
