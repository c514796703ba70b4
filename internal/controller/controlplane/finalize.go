package controlplane

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	coderv1alpha1 "github.com/coder/coder-k8s/api/v1alpha1"
	"github.com/coder/coder-k8s/internal/controller/reconcile"
)

// ensureFinalizers adds the finalizers the control plane needs before
// anything they guard is created.
func (r *Reconciler) ensureFinalizers(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) error {
	names := []string{FinalizerOperatorAccess}
	if plan, err := r.workspaceRBACPlan(ccp); err == nil && plan.reachesOtherNamespaces() {
		names = append(names, FinalizerWorkspaceRBAC)
	}
	return reconcile.AddFinalizers(ctx, r.Client, ccp, names...)
}

// finalize runs on a control plane being deleted: revoke the operator's
// token, delete the workspace RBAC in other namespaces, then let go.
func (r *Reconciler) finalize(ctx context.Context, ccp *coderv1alpha1.CoderControlPlane) (ctrl.Result, error) {
	var release []string
	var requeue time.Duration
	if controllerutil.ContainsFinalizer(ccp, FinalizerOperatorAccess) {
		done, after := r.kit().Clean(ctx, ccp, r.revocation(ccp))
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
	if err := reconcile.RemoveFinalizers(ctx, r.Client, ccp, release...); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// revocation revokes the operator's token, best effort and bounded
// (reconcile.Kit.Clean): when RevokeGracePeriod has passed since deletion
// was requested the finalizer goes anyway, with a Warning event naming
// what may be left in coderd, so that an unreachable coderd never blocks
// deletion forever. Until then each failure is announced and retried
// after a growing interval.
func (r *Reconciler) revocation(ccp *coderv1alpha1.CoderControlPlane) reconcile.Cleanup {
	coderURL := ccp.Status.URL
	if coderURL == "" {
		coderURL = ccp.Spec.ExternalURL
		if coderURL == "" {
			coderURL = inClusterURL(ccp, valueOr(r.ClusterDomain, DefaultClusterDomain))
		}
	}
	grace := valueOr(r.RevokeGracePeriod, DefaultRevokeGracePeriod)
	return reconcile.Cleanup{
		Name:         "revoke operator access at " + coderURL,
		Grace:        grace,
		Action:       "Reconcile",
		RetryReason:  "RevokeFailed",
		GaveUpReason: "RevokeAbandoned",
		Try: func(ctx context.Context) (string, error) {
			rctx, cancel := context.WithTimeout(ctx, valueOr(r.RevokeTimeout, DefaultRevokeTimeout))
			defer cancel()
			if err := r.Access.Revoke(rctx, ccp, coderURL); err != nil {
				return "", err
			}
			logf.FromContext(ctx).Info("revoked operator access", "url", coderURL)
			return "", nil
		},
		Retrying: func(err error, deadline time.Time) string {
			return fmt.Sprintf("revoking the operator's Coder token failed: %v; retrying until %s, then deletion proceeds without it",
				err, deadline.UTC().Format(time.RFC3339))
		},
		GaveUp: func(err error) string {
			user := ccp.Status.OperatorUser
			if user == "" {
				user = "(unknown)"
			}
			return fmt.Sprintf("could not revoke the operator's Coder token within %s (%v); deleting anyway: revoke the tokens of Coder user %s at %s by hand",
				grace, err, user, coderURL)
		},
	}
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
	return reconcile.RemoveFinalizers(ctx, r.Client, ccp, FinalizerWorkspaceRBAC)
}
