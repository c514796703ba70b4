package controlplane

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/workload"
)

// ensureFinalizers adds the finalizers the control plane needs before
// anything they guard is created.
func (r *Reconciler) ensureFinalizers(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	names := []string{FinalizerOperatorAccess}
	if plan, err := r.workspaceRBACPlan(ccp); err == nil && plan.reachesOtherNamespaces() {
		names = append(names, FinalizerWorkspaceRBAC)
	}
	return workload.AddFinalizers(ctx, r.Client, ccp, names...)
}

// finalize runs on a control plane being deleted: revoke the operator's
// token, delete the workspace RBAC in other namespaces, then let go.
func (r *Reconciler) finalize(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (ctrl.Result, error) {
	var release []string
	var requeue time.Duration
	if controllerutil.ContainsFinalizer(ccp, FinalizerOperatorAccess) {
		done, after := r.revoke(ctx, ccp)
		if done {
			release = append(release, FinalizerOperatorAccess)
		}
		requeue = after
	}
	if controllerutil.ContainsFinalizer(ccp, FinalizerWorkspaceRBAC) {
		if err := r.deleteWorkspaceRBAC(ctx, ccp, nil); err != nil {
			return ctrl.Result{}, err
		}
		release = append(release, FinalizerWorkspaceRBAC)
	}
	if err := workload.RemoveFinalizers(ctx, r.Client, ccp, release...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// revoke revokes the operator's token. It reports done when revoked, or
// when RevokeGracePeriod has passed since deletion was requested: then
// the finalizer goes anyway, with a Warning event naming what may be left
// in coderd, so that an unreachable coderd never blocks deletion forever.
// Until then it asks to be retried after a growing interval.
func (r *Reconciler) revoke(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (done bool, retryAfter time.Duration) {
	log := logf.FromContext(ctx)
	coderURL := ccp.Status.URL
	if coderURL == "" {
		coderURL = ccp.Spec.ExternalURL
		if coderURL == "" {
			coderURL = inClusterURL(ccp, valueOr(r.ClusterDomain, DefaultClusterDomain))
		}
	}
	rctx, cancel := context.WithTimeout(ctx, valueOr(r.RevokeTimeout, DefaultRevokeTimeout))
	err := r.Access.Revoke(rctx, ccp, coderURL)
	cancel()
	if err == nil {
		log.Info("revoked operator access", "url", coderURL)
		return true, 0
	}
	grace := valueOr(r.RevokeGracePeriod, DefaultRevokeGracePeriod)
	if retry, giveUp := workload.CleanupRetry(ccp, grace, time.Now()); !giveUp {
		deadline := ccp.DeletionTimestamp.Add(grace)
		log.Info("revoking operator access failed; retrying", "url", coderURL, "error", err.Error(), "giveUpAt", deadline)
		r.event(ccp, corev1.EventTypeWarning, "RevokeFailed",
			fmt.Sprintf("revoking the operator's Coder token failed: %v; retrying until %s, then deletion proceeds without it", err, deadline.UTC().Format(time.RFC3339)))
		return false, retry
	}
	user := ccp.Status.OperatorUser
	if user == "" {
		user = "(unknown)"
	}
	log.Error(err, "giving up revoking operator access; removing the finalizer", "url", coderURL, "gracePeriod", grace, "operatorUser", user)
	r.event(ccp, corev1.EventTypeWarning, "RevokeAbandoned",
		fmt.Sprintf("could not revoke the operator's Coder token within %s (%v); deleting anyway: revoke the tokens of Coder user %s at %s by hand", grace, err, user, coderURL))
	return true, 0
}

// releaseWorkspaceRBACFinalizer deletes the workspace RBAC that plan
// (the control plane's own namespace at most) does not keep, reading from
// the API server so a stale cache cannot leak an object, and then drops
// the finalizer.
func (r *Reconciler) releaseWorkspaceRBACFinalizer(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane, plan workspaceRBAC) error {
	keep := keepSet{}
	for _, rb := range plan.bindings(ccp) {
		keep.add(rb)
	}
	if err := r.deleteWorkspaceRBAC(ctx, ccp, keep); err != nil {
		return err
	}
	return workload.RemoveFinalizers(ctx, r.Client, ccp, FinalizerWorkspaceRBAC)
}
