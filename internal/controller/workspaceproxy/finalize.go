package workspaceproxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/coder/coder/v2/codersdk"
	"github.com/google/uuid"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// proxyCleanup deregisters the proxy the object registered on deletion,
// best effort and bounded (dependent.Base.Finalize): the finalizer goes
// after CleanupTimeout, or at once when the CoderControlPlane no longer
// exists, with a Warning event naming the proxy to delete by hand. A
// proxy whose token was supplied (spec.proxyTokenSecretRef) was not
// registered by the operator and is left alone.
func (r *Reconciler) proxyCleanup(obj *coderv1alpha1.CoderWorkspaceProxy) dependent.Cleanup {
	return dependent.Cleanup{
		Finalizer:    Finalizer,
		ControlPlane: obj.Spec.ControlPlaneRef.Name,
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

// registeredProxy names the proxy the object registered and how to
// delete it; a nil deregister means it registered none.
func (r *Reconciler) registeredProxy(ctx context.Context, obj *coderv1alpha1.CoderWorkspaceProxy) (string, dependent.UndoFunc, error) {
	var id string
	secret, err := r.ownedTokenSecret(ctx, obj)
	switch {
	case err == nil && secret != nil:
		id = secret.Annotations[AnnotationProxyID]
	case err == nil && obj.Spec.ProxyTokenSecretRef == nil:
		// The Secret may be gone first (foreground deletion).
		id = obj.Status.ProxyID
	case err != nil:
		var conflict *workload.ConflictError
		if !errors.As(err, &conflict) {
			return "", nil, err
		}
	}
	proxyID, perr := uuid.Parse(id)
	if perr != nil {
		return "", nil, nil
	}
	deregister := func(ctx context.Context, cl *codersdk.Client) error {
		return cl.DeleteWorkspaceProxyByID(ctx, proxyID)
	}
	return fmt.Sprintf("workspace proxy %q (ID %s)", proxyName(obj), proxyID), deregister, nil
}
