package provisioner

import (
	"context"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/dependent"
)

// ControlPlaneRef is the CoderControlPlane obj references.
func (r *Reconciler) ControlPlaneRef(obj *coderv1alpha1.CoderProvisioner) string {
	return obj.Spec.ControlPlaneRef.Name
}

// Cleanup revokes the object's provisioner key in Coder on deletion,
// best effort and bounded (dependent.Base.Finalize): the finalizer goes
// after CleanupTimeout, or at once when the CoderControlPlane no longer
// exists, with a Warning event naming the key to revoke by hand.
func (r *Reconciler) Cleanup(obj *coderv1alpha1.CoderProvisioner) dependent.Cleanup {
	return dependent.Cleanup{
		Finalizer: Finalizer,
		Find: func(ctx context.Context) (string, dependent.UndoFunc, error) {
			return r.issuedKey(ctx, obj)
		},
		Name:         "revoke the provisioner key",
		Action:       "RevokeKey",
		DoneReason:   EventKeyRevoked,
		FailedReason: EventKeyRevocationFailed,
		Done:         "revoked %s",
		GaveUp:       "gave up revoking %[1]s after %[2]s: %[3]s; revoke it in Coder by hand",
		Abandoned:    "cannot revoke %[1]s: %[2]s; revoke it in Coder by hand",
	}
}
