package provisioner

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
)

// finalize revokes the object's provisioner key in Coder, then releases
// the object. Revocation is best effort and bounded: while coderd is
// unreachable or the operator's access is not ready it is retried every
// few seconds until CleanupTimeout after the deletion request; then, or at
// once when the CoderControlPlane no longer exists, the finalizer is
// removed anyway and a Warning event names the key to revoke by hand.
// Deletion never waits forever on an absent coderd.
func (r *Reconciler) finalize(ctx context.Context, obj *coderv1alpha1.CoderProvisioner) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(obj, Finalizer) {
		return ctrl.Result{}, nil
	}
	log := logf.FromContext(ctx)
	done, abandon, what, msg := r.revokeKey(ctx, obj)
	switch {
	case done && what != "":
		r.event(obj, corev1.EventTypeNormal, EventKeyRevoked, "RevokeKey", "revoked "+what)
	case !done && !abandon:
		deadline := obj.DeletionTimestamp.Add(r.cleanupTimeout())
		if wait := time.Until(deadline); wait > 0 {
			log.Info("cannot revoke the provisioner key yet; retrying", "key", what, "reason", msg, "givingUpIn", wait.Round(time.Second))
			return ctrl.Result{RequeueAfter: min(cleanupRetry, wait)}, nil
		}
		r.event(obj, corev1.EventTypeWarning, EventKeyRevocationFailed, "RevokeKey",
			fmt.Sprintf("gave up revoking %s after %s: %s; revoke it in Coder by hand", what, r.cleanupTimeout(), msg))
	case abandon:
		r.event(obj, corev1.EventTypeWarning, EventKeyRevocationFailed, "RevokeKey",
			fmt.Sprintf("cannot revoke %s: %s; revoke it in Coder by hand", what, msg))
	}
	base := obj.DeepCopy()
	controllerutil.RemoveFinalizer(obj, Finalizer)
	if err := r.Client.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(fmt.Errorf("remove finalizer: %w", err))
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) event(obj *coderv1alpha1.CoderProvisioner, eventType, reason, action, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, eventType, reason, action, "%s", truncate(note, maxNote))
	}
}
